//! Devices: one engine spilling to one or several roots, each ideally its own device (issue 26's
//! slow device, issue 27's several devices). `scripts/devices-bench.sh` sets up throttled
//! loop devices (`scripts/slowdev.sh`), runs this binary in their cgroup interleaved with fio,
//! and writes `results/DEVICES.md`; run alone it is one measured run that prints one JSON line.
//!
//! A run: `SPILLRING_DEV_WRITERS` threads, each with its own task scope and one writer, write
//! their share of `SPILLRING_DEV_BYTES` logical bytes with `write_slice` and `finish`; the wall
//! time runs from a barrier all threads pass to the last `finish`'s return (every write on the
//! device in direct mode). Then the states are dropped and the engine settled, untimed.
//!
//! Env:
//! - `SPILLRING_DEV_ROOTS`: the roots, `:`-separated, one engine over all of them (unset, as
//!   under a plain `cargo bench`: two scratch directories and 64 MiB, a smoke run);
//! - `SPILLRING_DEV_WRITERS`: writer threads (default: 2 per root);
//! - `SPILLRING_DEV_BYTES`: logical bytes in all (default 1 GiB per root);
//! - `SPILLRING_DEV_DATA`: `random` (default; `SPILLRING_DEV_RECORD` bytes per record, default
//!   1 MiB) or `lineitem` (TPC-H-like text rows, ~130 bytes each, from a 64 MiB pool replayed);
//! - `SPILLRING_DEV_COMPRESSION`: `none` (default), `auto`, `lz4`, `zstd1`;
//! - `SPILLRING_DEV_MODE`: `direct` (default) or `buffered`;
//! - `SPILLRING_DEV_QUOTA`: the engine's `max_spill_bytes` (default none). A run a bound
//!   refuses prints `"error"` with the writers' first error instead of its figures.
//!
//! Output: logical MB/s, physical MB/s, physical / logical, process CPU s per logical GiB
//! (every thread: the producers, the ring, the offload pool), the producers' own CPU s per GiB
//! (their threads' CPU summed), the engine's blocks per codec, and the segments per root.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::json;
use spillring::{Compression, EngineConfig, WriteMode};
use spillring_benches::lineitem::{RecordSet, lineitem_records, random_records};
use spillring_benches::{GIB_F, MIB, open_engine, process_cpu, scratch, thread_cpu};

const LINEITEM_SEED: u64 = 20_261_201;
const RANDOM_SEED: u64 = 11;
const POOL_MAX: usize = 64 * MIB;

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn env_num(k: &str, default: usize) -> usize {
    env(k).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{k} needs a number (got {v})"))
    })
}

fn compression(name: &str) -> Compression {
    match name {
        "none" => Compression::None,
        "auto" => Compression::Auto,
        "lz4" => Compression::Lz4,
        "zstd1" => Compression::Zstd { level: 1 },
        other => panic!("SPILLRING_DEV_COMPRESSION: none, auto, lz4 or zstd1 (got {other})"),
    }
}

/// Per-root segment counts from the engine's directories: the files each root holds right
/// after the writers finished (before the states drop), which is where the segments went.
fn files_per_root(roots: &[String]) -> Vec<usize> {
    roots
        .iter()
        .map(|r| walk(std::path::Path::new(r)))
        .collect()
}

fn walk(p: &std::path::Path) -> usize {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path()),
            Ok(t) if t.is_file() => 1,
            _ => 0,
        })
        .sum()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench --no-run`/`--list` probes: nothing to list.
    }
    // Without roots (as `cargo bench`, and so the bench report's smoke run, starts it): two
    // scratch directories on the bench root and 64 MiB, a check that the bench runs.
    let scratch_roots: Vec<tempfile::TempDir> = if env("SPILLRING_DEV_ROOTS").is_none() {
        (0..2)
            .map(|i| scratch(&format!("devices-{i}")).expect("create a scratch directory"))
            .collect()
    } else {
        Vec::new()
    };
    let roots: Vec<String> = match env("SPILLRING_DEV_ROOTS") {
        Some(r) => r.split(':').map(str::to_owned).collect(),
        None => scratch_roots
            .iter()
            .map(|d| d.path().display().to_string())
            .collect(),
    };
    let default_total = if scratch_roots.is_empty() {
        roots.len() << 30
    } else {
        64 * MIB
    };
    let writers = env_num("SPILLRING_DEV_WRITERS", 2 * roots.len()).max(1);
    let total = env_num("SPILLRING_DEV_BYTES", default_total);
    let data = env("SPILLRING_DEV_DATA").unwrap_or_else(|| "random".into());
    let record = env_num("SPILLRING_DEV_RECORD", MIB);
    let codec = env("SPILLRING_DEV_COMPRESSION").unwrap_or_else(|| "none".into());
    let mode = match env("SPILLRING_DEV_MODE").as_deref() {
        None | Some("direct") => WriteMode::Direct,
        Some("buffered") => WriteMode::Buffered,
        Some(m) => panic!("SPILLRING_DEV_MODE: direct or buffered (got {m})"),
    };
    let set: RecordSet = match data.as_str() {
        "random" => random_records(RANDOM_SEED, POOL_MAX.min(total.max(record)), record),
        "lineitem" => lineitem_records(LINEITEM_SEED, POOL_MAX.min(total)),
        other => panic!("SPILLRING_DEV_DATA: random or lineitem (got {other})"),
    };

    let mut cfg = EngineConfig::new(&roots[0])
        .mode(mode)
        .compression(compression(&codec));
    let quota = env_num("SPILLRING_DEV_QUOTA", 0) as u64;
    if quota > 0 {
        cfg = cfg.max_spill_bytes(quota);
    }
    for r in &roots[1..] {
        cfg = cfg.add_root(r);
    }
    let engine = open_engine(cfg, "devices (direct mode needs O_DIRECT on every root)");
    let per_writer = total / writers;
    let barrier = Barrier::new(writers + 1);
    let m0 = engine.metrics();
    let (wall, producer_cpu, cpu, states, files) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let (engine, set, barrier) = (&engine, &set, &barrier);
                s.spawn(move || {
                    let task = engine.task("devices").expect("task");
                    let mut wr = task.writer().expect("writer");
                    barrier.wait();
                    let c0 = thread_cpu();
                    let (mut written, mut i) = (0usize, w * 7919);
                    let mut wrote = Ok(());
                    while written < per_writer && wrote.is_ok() {
                        let r = set.get(i % set.len());
                        wrote = wr.write_slice(r);
                        written += r.len();
                        i += 1;
                    }
                    let state = wrote.and_then(|()| wr.finish());
                    (thread_cpu() - c0, state, task)
                })
            })
            .collect();
        barrier.wait();
        let (t0, cpu0) = (Instant::now(), process_cpu());
        let mut producer = Duration::ZERO;
        let mut states = Vec::new();
        for h in handles {
            let (c, state, task) = h.join().expect("writer thread");
            producer += c;
            states.push((state.map_err(|e| e.to_string()), task));
        }
        let (wall, cpu) = (t0.elapsed(), process_cpu() - cpu0);
        (wall, producer, cpu, states, files_per_root(&roots))
    });
    let m = engine.metrics();
    let error = states.iter().find_map(|(s, _)| s.as_ref().err().cloned());
    drop(states);
    assert!(engine.settle(Duration::from_secs(300)), "engine settles");
    let logical = m.logical_bytes_written - m0.logical_bytes_written;
    let physical = m.physical_bytes_written - m0.physical_bytes_written;
    let gib = logical as f64 / GIB_F;
    let secs = wall.as_secs_f64();
    println!(
        "{}",
        json!({
            "roots": roots.len(), "writers": writers, "data": data, "record_bytes": record,
            "compression": codec, "mode": if mode == WriteMode::Direct { "direct" } else { "buffered" },
            "logical_bytes": logical, "physical_bytes": physical, "wall_s": secs,
            "logical_mb_s": logical as f64 / secs / 1e6,
            "physical_mb_s": physical as f64 / secs / 1e6,
            "physical_per_logical": physical as f64 / logical.max(1) as f64,
            "cpu_s_per_gib": cpu.as_secs_f64() / gib,
            "producer_cpu_s_per_gib": producer_cpu.as_secs_f64() / gib,
            "blocks_raw": m.blocks_raw - m0.blocks_raw,
            "blocks_lz4": m.blocks_lz4 - m0.blocks_lz4,
            "blocks_zstd": m.blocks_zstd - m0.blocks_zstd,
            "files_per_root": files, "quota_bytes": quota, "error": error,
            "backend": format!("{:?}", engine.backend()),
        })
    );
}
