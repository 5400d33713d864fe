//! Writers: memory and disk held by many open writers of one task (issue 13, point 4).
//!
//! One engine, one task, 64 writers open at once, written round-robin by one thread
//! (a hash-partitioned spill): each gets `per_writer` bytes (4 MiB, 64 KiB records), 256 MiB in
//! all. While all 64 are open, after every round-robin pass, it samples the process RSS and
//! the disk held under the engine's root (the sum of `st_blocks` of every file under it, i.e.
//! allocated blocks, preallocation included). Then every writer finishes, every record is read
//! back and checked, and the engine is dropped.
//!
//! Reported per mode (buffered, direct), for each of `--rounds` rounds (the modes interleaved
//! in each round): peak RSS delta over the RSS before the writers opened, peak disk held, and
//! the bytes written; medians over rounds. Defaults of `EngineConfig` but for the segment pool
//! (off, so each run starts with no file). `--quick` (`SPILLRING_BENCH_QUICK=1`): 1 MiB per
//! writer. Test mode (`cargo test --benches`): 8 writers of 256 KiB, nothing written.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::json;
use spillring::{Engine, EngineConfig, SpillWriter, WriteMode};
use spillring_benches::{
    KIB, MIB, engine_info, median, quick, rss_bytes, scratch, test_mode, write_results,
};

const WRITERS: usize = 64;
const RECORD: usize = 64 * KIB;

/// Bytes allocated to every file under `dir` (`st_blocks` * 512), recursively.
fn disk_held(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut sum = 0;
    for e in rd.flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_dir() {
            sum += disk_held(&e.path());
        } else {
            sum += m.blocks() * 512;
        }
    }
    sum
}

fn payload(w: usize, k: usize) -> Vec<u8> {
    let mut v = vec![(w as u8) ^ (k as u8); RECORD];
    v[..8].copy_from_slice(&(w as u64).to_le_bytes());
    v[8..16].copy_from_slice(&(k as u64).to_le_bytes());
    v
}

struct One {
    peak_rss_delta: u64,
    peak_disk: u64,
    written: u64,
    info: serde_json::Value,
}

fn run(mode: WriteMode, writers: usize, per_writer: usize) -> One {
    let dir = scratch("writers").expect("create a scratch directory");
    let cfg = EngineConfig::new(dir.path())
        .mode(mode)
        .pool_max_segments(0);
    let engine = Engine::open(cfg).expect("open engine");
    let info = engine_info(&engine);
    let task = engine.task("writers").expect("task");
    let recs = per_writer / RECORD;
    let rss0 = rss_bytes();
    let mut ws: Vec<SpillWriter> = (0..writers)
        .map(|_| task.writer().expect("writer"))
        .collect();
    let (mut peak_rss, mut peak_disk) = (0u64, 0u64);
    for k in 0..recs {
        for (i, w) in ws.iter_mut().enumerate() {
            w.write_slice(&payload(i, k)).expect("write");
        }
        peak_rss = peak_rss.max(rss_bytes().saturating_sub(rss0));
        peak_disk = peak_disk.max(disk_held(dir.path()));
    }
    let states: Vec<_> = ws
        .into_iter()
        .map(|w| w.finish().expect("finish"))
        .collect();
    for (i, s) in states.iter().enumerate() {
        let mut r = s.reader().expect("reader");
        let mut k = 0;
        while let Some(rec) = r.next_record().expect("read") {
            assert_eq!(&rec[..], &payload(i, k)[..], "writer {i} record {k}");
            k += 1;
        }
        assert_eq!(k, recs, "writer {i}: records read back");
    }
    drop(states);
    task.close();
    drop(engine);
    One {
        peak_rss_delta: peak_rss,
        peak_disk,
        written: (writers * recs * RECORD) as u64,
        info,
    }
}

fn arg(name: &str) -> Option<String> {
    let a: Vec<String> = std::env::args().collect();
    a.iter()
        .position(|x| x == name)
        .and_then(|i| a.get(i + 1).cloned())
}

fn main() {
    let (writers, per_writer, rounds) = if test_mode() {
        (8, 256 * KIB, 1)
    } else {
        let per = if quick() { MIB } else { 4 * MIB };
        let rounds = arg("--rounds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(3usize);
        (WRITERS, per, rounds)
    };
    let modes = [
        ("buffered", WriteMode::Buffered),
        ("direct", WriteMode::Direct),
    ];
    let mut out = serde_json::Map::new();
    let mut runs: Vec<Vec<One>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        // Alternate which mode goes first.
        let order: Vec<usize> = if round % 2 == 0 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        for m in order {
            let one = run(modes[m].1, writers, per_writer);
            eprintln!(
                "writers {} round {round}: peak RSS delta {:.1} MiB, peak disk {:.1} MiB, written {:.0} MiB",
                modes[m].0,
                one.peak_rss_delta as f64 / MIB as f64,
                one.peak_disk as f64 / MIB as f64,
                one.written as f64 / MIB as f64
            );
            runs[m].push(one);
        }
    }
    for (m, (name, _)) in modes.iter().enumerate() {
        let rs = &runs[m];
        let rss: Vec<f64> = rs.iter().map(|o| o.peak_rss_delta as f64).collect();
        let disk: Vec<f64> = rs.iter().map(|o| o.peak_disk as f64).collect();
        let (rss_med, disk_med) = (median(&mut rss.clone()), median(&mut disk.clone()));
        out.insert(
            name.to_string(),
            json!({
                "engine": rs[0].info,
                "written_bytes": rs[0].written,
                "peak_rss_delta_bytes": rss,
                "peak_disk_bytes": disk,
                "peak_rss_delta_bytes_median": rss_med,
                "peak_disk_bytes_median": disk_med,
                "rss_bytes_per_writer_median": rss_med / writers as f64,
                "disk_per_written_median": disk_med / rs[0].written as f64,
            }),
        );
    }
    let doc = json!({
        "what": format!("{writers} writers of one task open at once, written round-robin by one thread, {} KiB each in {} KiB records", per_writer / KIB, RECORD / KIB),
        "writers": writers,
        "bytes_per_writer": per_writer,
        "record_bytes": RECORD,
        "rounds": rounds,
        "modes": out,
    });
    write_results("writers", &doc).expect("write results");
}
