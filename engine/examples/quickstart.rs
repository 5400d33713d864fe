//! Spills about 1 GiB and reads it back, in buffered and in direct mode, and times a plain
//! `std::fs` write loop of the same data in the same run as the baseline.
//!
//! ```text
//! cargo run --release --example quickstart [-- --gib 1 --record-kib 64 --rounds 3 --root DIR]
//! ```
//!
//! Each write phase ends with an `fsync` of what it wrote (the engine: `sync_data` of every
//! segment before the read), so the figures compare data that reached the device, not the
//! page cache. The three runs (std::fs, engine buffered, engine direct) are interleaved: each
//! round runs all three, the order rotating from round to round, and the summary gives the
//! medians over rounds of each round's engine / std::fs ratio with their spread (a shared disk
//! drifts: only ratios within a round mean anything).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillring::{Bytes, Engine, EngineConfig, WriteMode};

struct Args {
    gib: f64,
    record_kib: usize,
    rounds: usize,
    root: Option<PathBuf>,
}

fn parse() -> Args {
    let mut a = Args {
        gib: 1.0,
        record_kib: 64,
        rounds: 3,
        root: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        match k.as_str() {
            "--gib" => a.gib = v.parse().unwrap_or(1.0),
            "--record-kib" => a.record_kib = v.parse().unwrap_or(64),
            "--rounds" => a.rounds = v.parse().unwrap_or(3).max(1),
            "--root" => a.root = Some(PathBuf::from(v)),
            _ => {
                eprintln!("usage: quickstart [--gib N] [--record-kib N] [--rounds N] [--root DIR]");
                std::process::exit(2);
            }
        }
    }
    a
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

/// The baseline: a `std::fs` `write_all` loop (through a 1 MiB `BufWriter`) + fsync; the file
/// is removed afterwards. Returns the write + fsync time.
fn std_fs_run(path: &Path, payloads: &[Bytes], n: usize) -> std::io::Result<Duration> {
    let t = Instant::now();
    {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        for i in 0..n {
            f.write_all(&payloads[i % payloads.len()])?;
        }
        let f = f.into_inner()?;
        f.sync_data()?;
    }
    let d = t.elapsed();
    std::fs::remove_file(path)?;
    Ok(d)
}

/// What one engine run measured.
struct EngineRun {
    write: Duration,
    enqueued: Duration,
    blocked: Duration,
    read: Duration,
    segments: usize,
}

/// One spill on `engine`: write `n` records, finish, fsync every segment, read everything back
/// (checking each record), release, and wait until the engine holds no file it must delete.
fn engine_run(
    engine: &Engine,
    payloads: &[Bytes],
    n: usize,
) -> Result<EngineRun, Box<dyn std::error::Error>> {
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
    let segments = state.segments();
    let t = Instant::now();
    let mut r = state.reader()?;
    let mut i = 0;
    while let Some(rec) = r.next_record()? {
        if rec != payloads[i % payloads.len()] {
            return Err(format!("record {i} differs").into());
        }
        i += 1;
    }
    let read = t.elapsed();
    if i != n {
        return Err(format!("read {i} of {n} records").into());
    }
    drop(r);
    drop(state);
    task.close();
    engine.settle(Duration::from_secs(30));
    Ok(EngineRun {
        write,
        enqueued,
        blocked,
        read,
        segments,
    })
}

/// "median x (min-max)" of `v`.
fn spread(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    format!("{med:.2}x ({:.2}-{:.2}, {n} rounds)", v[0], v[n - 1])
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
        "spillring quickstart: {n} records of {} KiB = {:.2} GiB per run, {} interleaved rounds, root {}",
        args.record_kib,
        total as f64 / (1u64 << 30) as f64,
        args.rounds,
        base.path().display()
    );

    // One engine per mode, kept across rounds as an executor keeps its engine.
    let modes = [WriteMode::Buffered, WriteMode::Direct];
    let engines = modes
        .iter()
        .map(|&mode| {
            let root = base.path().join(mode.as_str());
            Engine::open(EngineConfig::new(&root).mode(mode))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let path = base.path().join("baseline.bin");
    // ratios[mode]: engine / std::fs write speed, one per round.
    let mut ratios = vec![Vec::new(); modes.len()];
    for round in 0..args.rounds {
        // 0 = std::fs, 1 + m = the engine in modes[m]; the first side rotates every round.
        let mut base_gbps = 0.0;
        let mut eng_gbps = [0.0f64; 2];
        for k in 0..3 {
            let side = (k + round) % 3;
            if side == 0 {
                let d = std_fs_run(&path, &payloads, n)?;
                base_gbps = gbps(total, d);
                println!(
                    "  round {} std::fs write_all + fsync            write {:>6.2} GB/s ({d:.2?})",
                    round + 1,
                    base_gbps
                );
                continue;
            }
            let (mode, engine) = (modes[side - 1], &engines[side - 1]);
            let r = engine_run(engine, &payloads, n)?;
            eng_gbps[side - 1] = gbps(total, r.write);
            println!(
                "  round {} spillring {:<8} ({:<8}) write {:>6.2} GB/s ({:.2?}, finish at {:.2?}, caller in write() {:.2?})  read {:>6.2} GB/s  segments {}",
                round + 1,
                mode.as_str(),
                engine.backend().as_str(),
                eng_gbps[side - 1],
                r.write,
                r.enqueued,
                r.blocked,
                gbps(total, r.read),
                r.segments,
            );
        }
        for (m, g) in eng_gbps.iter().enumerate() {
            ratios[m].push(g / base_gbps);
        }
    }
    for (m, mode) in modes.iter().enumerate() {
        let met = engines[m].metrics();
        println!(
            "  spillring {:<8} / std::fs write speed: {}  tickets held {} ({} by pooled segment files)",
            mode.as_str(),
            spread(&mut ratios[m]),
            met.tickets_used,
            met.pool_segments,
        );
    }
    Ok(())
}
