//! Spills about 1 GiB and reads it back, in buffered and in direct mode, and times a plain
//! `std::fs` write loop of the same data in the same run as the baseline.
//!
//! ```text
//! cargo run --release --example quickstart [-- --gib 1 --record-kib 64 --root DIR]
//! ```
//!
//! Each write phase ends with an `fsync` of what it wrote (the engine: `sync_data` of every
//! segment before the read), so the figures compare data that reached the device, not the
//! page cache.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spillring::{Bytes, Engine, EngineConfig, WriteMode};

struct Args {
    gib: f64,
    record_kib: usize,
    root: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        gib: 1.0,
        record_kib: 64,
        root: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        match k.as_str() {
            "--gib" => a.gib = v.parse().unwrap_or(1.0),
            "--record-kib" => a.record_kib = v.parse().unwrap_or(64),
            "--root" => a.root = Some(PathBuf::from(v)),
            _ => {
                eprintln!("usage: quickstart [--gib N] [--record-kib N] [--root DIR]");
                std::process::exit(2);
            }
        }
    }
    a
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse();
    let base = match &args.root {
        Some(r) => tempfile::tempdir_in(r)?,
        None => tempfile::tempdir_in(std::env::temp_dir())?,
    };
    let rec_len = args.record_kib << 10;
    let n = ((args.gib * (1u64 << 30) as f64) as usize / rec_len).max(1);
    let total = (n * rec_len) as u64;
    // A few distinct payloads, so the page cache cannot dedupe and CRCs differ.
    let payloads: Vec<Bytes> = (0..8u8)
        .map(|k| {
            Bytes::from(
                (0..rec_len)
                    .map(|i| (i as u8).wrapping_mul(31) ^ k)
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    println!(
        "spillring quickstart: {n} records of {} KiB = {:.2} GiB per run, root {}",
        args.record_kib,
        total as f64 / (1u64 << 30) as f64,
        base.path().display()
    );

    // Baseline: std::fs write_all loop + fsync, then drop the file.
    let path = base.path().join("baseline.bin");
    let t = Instant::now();
    {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
        for i in 0..n {
            f.write_all(&payloads[i % payloads.len()])?;
        }
        let f = f.into_inner()?;
        f.sync_data()?;
    }
    let base_write = t.elapsed();
    std::fs::remove_file(&path)?;
    println!(
        "  std::fs write_all + fsync        {:>6.2} GB/s  ({:.2?})",
        gbps(total, base_write),
        base_write
    );

    for mode in [WriteMode::Buffered, WriteMode::Direct] {
        let root = base.path().join(format!("{mode:?}").to_lowercase());
        let engine = Engine::open(EngineConfig::new(&root).mode(mode))?;
        let task = engine.task("quickstart")?;
        let t = Instant::now();
        let mut w = task.writer()?;
        let mut blocked = Duration::ZERO;
        for i in 0..n {
            let b = Instant::now();
            w.write(payloads[i % payloads.len()].clone())?;
            blocked += b.elapsed();
        }
        let state = w.finish()?;
        let enqueued = t.elapsed();
        for p in state.paths() {
            std::fs::File::open(p)?.sync_data()?;
        }
        let write = t.elapsed();
        let t = Instant::now();
        let mut r = state.reader()?;
        let mut got = 0u64;
        let mut i = 0;
        while let Some(rec) = r.next_record()? {
            if rec != payloads[i % payloads.len()] {
                return Err(format!("record {i} differs").into());
            }
            got += rec.len() as u64;
            i += 1;
        }
        let read = t.elapsed();
        drop(r);
        drop(state);
        task.close();
        engine.settle(Duration::from_secs(30));
        let m = engine.metrics();
        println!(
            "  spillring {:<8} ({:<8}) write {:>6.2} GB/s ({:.2?}, finish at {:.2?}, caller in write() {:.2?})  read {:>6.2} GB/s  segments {}  tickets left {}",
            format!("{mode:?}").to_lowercase(),
            engine.backend(),
            gbps(total, write),
            write,
            enqueued,
            blocked,
            gbps(got, read),
            m.segments_created,
            m.tickets_used,
        );
        if got != total {
            return Err(format!("read {got} of {total} bytes").into());
        }
    }
    Ok(())
}
