//! Overlap (issue 10): what write-behind is for. A producer that computes each record batch
//! (a busy CPU loop) and hands it to the engine should take as long as the longer of its
//! compute and the device's write, not their sum.
//!
//! The producer computes before each 1 MiB record (a batch) for a calibrated time, so that
//! computing all records takes about as long as the engine takes to write them with no
//! compute at all (the calibration runs once, before the measured pairs: a spin rate, then two
//! corrections against whole compute-alone runs; the pairs report how balanced each came out). Then, in each of
//! several interleaved pairs (the order of the five runs reverses every pair), on the disk root
//! (`SPILLRING_BENCH_ROOT`, which must support `O_DIRECT`):
//!
//! - compute alone: the busy loop for every record, no I/O;
//! - engine write alone: one writer on a direct-mode engine (pool on, kept across runs as an
//!   executor keeps its engine), every record written, `finish` (every write completed);
//! - engine with compute: the same, computing before each `write`;
//! - std::fs write alone: a `write_all` loop into one `O_DIRECT` file
//!   (`baseline::std_fs::produce_and_write`), no compute;
//! - std::fs with compute: the same loop computing before each `write_all`: it pays compute +
//!   write in sequence.
//!
//! Figures, per pair, then median / min / max over pairs: engine with compute ÷ max(compute
//! alone, engine write alone) (goal ≤ 1.15, in `scripts/bench_report.py`'s goal table), the
//! same for std::fs (≈ 2 when compute and write are balanced, the sum), compute alone ÷ engine
//! write alone (how balanced the pair was), and engine with compute ÷ std::fs with compute.
//! Neither side syncs: an `O_DIRECT` write completes once the device has the bytes, and the
//! engine's `finish` waits for every write.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use spillring::{Engine, EngineConfig, WriteMode};
use spillring_benches::baseline::std_fs;
use spillring_benches::{
    MIB, engine_info, env_or, open_engine, payloads, profile_request, quick, scratch, spread,
    test_mode, wait_deletes, write_results,
};

const RECORD: usize = MIB;
const DISTINCT_PAYLOADS: usize = 8;

/// The producer's work: `iters` rounds of a multiply-rotate mix (no memory traffic, so it
/// competes with the engine for a core and nothing else).
fn spin(iters: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..iters {
        x = (x ^ i).rotate_left(17).wrapping_mul(0x0000_0100_0000_01b3);
    }
    black_box(x)
}

/// Spin iterations per second on this core now: the fastest of a few 20 ms samples (a slower
/// one lost the core for part of its time).
fn spin_rate() -> f64 {
    let mut best = 0.0f64;
    let mut iters = 1u64 << 16;
    for _ in 0..8 {
        let t = Instant::now();
        spin(iters);
        let d = t.elapsed().as_secs_f64();
        if d < 0.02 {
            iters *= 2;
            continue;
        }
        best = best.max(iters as f64 / d);
    }
    if best == 0.0 {
        // Never reached 20 ms (a very fast core): use the last, longest sample.
        let t = Instant::now();
        spin(iters);
        best = iters as f64 / t.elapsed().as_secs_f64().max(1e-9);
    }
    best
}

fn compute_alone(n: usize, iters: u64) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        spin(iters);
    }
    t.elapsed()
}

/// One writer on `engine`: `n` records, computing `iters` before each (0: no compute), then
/// `finish`. Returns the wall time from the first record to `finish`'s return; the release and
/// its deletes (the pool takes the segments back) are outside it.
fn engine_run(engine: &Engine, recs: &[Bytes], n: usize, iters: u64) -> Duration {
    let task = engine.task("overlap").expect("task");
    let mut w = task.writer().expect("writer");
    let t = Instant::now();
    for i in 0..n {
        if iters > 0 {
            spin(iters);
        }
        w.write(recs[i % recs.len()].clone()).expect("engine write");
    }
    let state = w.finish().expect("finish");
    let wall = t.elapsed();
    assert!(
        state.bytes() >= (n * RECORD) as u64,
        "the engine's segments hold every record"
    );
    drop(state);
    drop(task);
    wait_deletes(engine, Duration::from_secs(300));
    wall
}

fn std_run(dir: &Path, recs: &[Bytes], n: usize, iters: u64) -> Duration {
    std_fs::produce_and_write(dir, WriteMode::Direct, recs, n, |_| {
        if iters > 0 {
            spin(iters);
        }
    })
    .expect("std::fs O_DIRECT baseline run")
}

fn main() {
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"overlap".contains(f.as_str())
    {
        return; // filtered out
    }
    // A profile loop (run without `--bench` by bench_report.py) measures the real sizes.
    let smoke = test_mode() && profile_request().is_none();
    let quick = quick();
    let bytes: usize = env_or(
        "SPILLRING_OVERLAP_BYTES",
        match (smoke, quick) {
            (true, _) => 8 * MIB,
            (false, true) => 128 * MIB,
            (false, false) => 1 << 30,
        },
    );
    let n = (bytes / RECORD).max(1);
    let pairs: usize = env_or(
        "SPILLRING_OVERLAP_PAIRS",
        match (smoke, quick) {
            (true, _) => 1,
            (false, true) => 5,
            (false, false) => 7,
        },
    );
    let dir = scratch("overlap").expect("create a scratch directory");
    let std_dir = dir.path().join("std");
    std::fs::create_dir_all(&std_dir).expect("create the baseline directory");
    let engine = open_engine(
        EngineConfig::new(dir.path().join("engine")).mode(WriteMode::Direct),
        "overlap (direct mode needs O_DIRECT on the bench root)",
    );
    let recs = payloads(RECORD, DISTINCT_PAYLOADS);

    // Calibration: warm both writers (the pool fills, the file system has seen the sizes), then
    // size the compute per record to the engine's write time per record.
    engine_run(&engine, &recs, n, 0);
    std_run(&std_dir, &recs, n, 0);
    let write_alone = engine_run(&engine, &recs, n, 0);
    let rate = spin_rate();
    let target = write_alone.as_secs_f64() / n as f64;
    let mut iters = ((rate * target) as u64).max(1);
    // The rate above is the fastest short sample; a whole run's compute loses the core now and
    // then. Two corrections against a full compute-alone run bring it to the write's length.
    for _ in 0..2 {
        let c = compute_alone(n, iters).as_secs_f64();
        iters = ((iters as f64 * write_alone.as_secs_f64() / c) as u64).max(1);
    }
    eprintln!(
        "overlap: {n} records of 1 MiB; engine write alone {write_alone:.2?}; compute {:.1} µs per record ({iters} spins, {:.0} M/s at best)",
        target * 1e6,
        rate / 1e6
    );

    if let Some((what, dur)) = profile_request() {
        // "engine" (default) or "std": loop that side with compute, for `perf record`.
        let t = Instant::now();
        while t.elapsed() < dur {
            if what.starts_with("std") {
                std_run(&std_dir, &recs, n, iters);
            } else {
                engine_run(&engine, &recs, n, iters);
            }
        }
        return;
    }

    let mut rows = Vec::new();
    let (mut eng_ratio, mut std_ratio, mut balance, mut vs_std) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for pair in 0..pairs {
        let mut order = [0usize, 1, 2, 3, 4];
        if pair % 2 == 1 {
            order.reverse();
        }
        let mut d = [0.0f64; 5];
        for side in order {
            d[side] = match side {
                0 => compute_alone(n, iters),
                1 => engine_run(&engine, &recs, n, 0),
                2 => engine_run(&engine, &recs, n, iters),
                3 => std_run(&std_dir, &recs, n, 0),
                _ => std_run(&std_dir, &recs, n, iters),
            }
            .as_secs_f64();
        }
        let [c, ew, e, sw, s] = d;
        let (er, sr) = (e / c.max(ew), s / c.max(sw));
        eprintln!(
            "overlap pair {}: compute {c:.3} s, engine write {ew:.3} s, engine both {e:.3} s ({er:.3}x the longer), std write {sw:.3} s, std both {s:.3} s ({sr:.3}x)",
            pair + 1
        );
        eng_ratio.push(er);
        std_ratio.push(sr);
        balance.push(c / ew);
        vs_std.push(e / s);
        let mb_s = |secs: f64| (n * RECORD) as f64 / secs / 1e6;
        rows.push(json!({
            "pair": pair + 1,
            "compute_alone_s": c,
            "engine_write_alone_s": ew,
            "engine_with_compute_s": e,
            "std_write_alone_s": sw,
            "std_with_compute_s": s,
            "engine_write_alone_mb_s": mb_s(ew),
            "std_write_alone_mb_s": mb_s(sw),
            "engine_vs_longer": er,
            "std_vs_longer": sr,
            "compute_vs_engine_write": c / ew,
            "engine_vs_std": e / s,
        }));
    }
    write_results(
        "overlap",
        &json!({
            "bench": "overlap",
            "what": "a producer computing a calibrated busy loop before each 1 MiB record, as long in total as the engine's write alone: wall of the engine (direct mode, write-behind) / the longer of compute alone and write alone, vs a std::fs O_DIRECT write_all loop that computes and writes in sequence; interleaved pairs",
            "engine": engine_info(&engine),
            "root": dir.path().display().to_string(),
            "record_bytes": RECORD,
            "bytes_per_run": n * RECORD,
            "quick": quick,
            "calibration": {
                "engine_write_alone_s": write_alone.as_secs_f64(),
                "compute_target_us_per_record": target * 1e6,
                "spins_per_record": iters,
                "spins_per_s": rate,
            },
            "engine_vs_longer": spread(&eng_ratio),
            "std_vs_longer": spread(&std_ratio),
            "compute_vs_engine_write": spread(&balance),
            "engine_vs_std": spread(&vs_std),
            "rows": rows,
        }),
    )
    .expect("write the bench results");
}
