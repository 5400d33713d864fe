//! Throughput: 1 GiB in 1 MiB / 64 KiB / 4 KiB records, buffered and direct, through the engine,
//! a `std::fs` `write_all` loop and a tokio-uring `write_at` loop with 8 writes in flight (both
//! in `spillring_benches::baseline`).
//!
//! Each run writes the same page-aligned payloads (so `O_DIRECT` baselines need no copy) and
//! then makes the data durable (`sync_data`; for the engine, of every segment it wrote), so
//! buffered and direct runs compare bytes that reached the device. Per run:
//! - MB/s: bytes / wall time from the first write to the end of the sync;
//! - CPU s/GiB: `getrusage(RUSAGE_SELF)` user+sys over the same span, every thread of the
//!   process (the engine's ring thread, io_uring's io-wq workers) included;
//! - caller-blocked s/GiB: wall time the calling thread spent inside the write API (engine:
//!   `write` + `finish`; std::fs: `write_all`; tokio-uring: submitting and awaiting its writes),
//!   i.e. time the caller could not spend on its own work. The sync is excluded (a spill writer
//!   never syncs; it is there only to make the figures honest);
//! - caller CPU s/GiB: `getrusage(RUSAGE_THREAD)` of the calling thread over its write loop.
//!
//! Rounds are interleaved (every implementation, mode and size once per round, the order
//! rotating), figures are medians over rounds, and the goal ratios are medians of per-round
//! ratios. The two baselines that do one synchronous 4 KiB `O_DIRECT` write per record (std::fs
//! and tokio-uring, direct, 4 KiB: 50-85 MB/s here, 12-20 s per GiB) write a quarter of the
//! run's bytes (256 MiB of 1 GiB); their figures are per GiB like all others, none of them
//! enters a goal ratio, and every row's `bytes_per_run` is what its runs wrote.
//! `SPILLRING_TP_SINGLE=engine|std|uring` with `SPILLRING_TP_MODE`, `SPILLRING_TP_RECORD`
//! and `SPILLRING_TP_BYTES` runs one configuration without the sync and prints one JSON line
//! (used by `scripts/fio-baseline.sh` to pair the engine with fio's identical job).

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use spillring::{Engine, EngineConfig, WriteMode};
use spillring_benches::baseline::{std_fs, tokio_uring};
use spillring_benches::{
    KIB, MIB, Run, env_or, median, open_engine, payloads, process_cpu, profile_request, quick,
    scratch, thread_cpu, write_results,
};

/// Writes in flight for the tokio-uring baseline (the engine's default queue depth too).
const URING_IN_FLIGHT: usize = 8;
const DISTINCT_PAYLOADS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Impl {
    Engine,
    Std,
    Uring,
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Engine => "engine",
            Impl::Std => "std_fs",
            Impl::Uring => "tokio_uring",
        }
    }
}

fn mode_name(m: WriteMode) -> &'static str {
    match m {
        WriteMode::Buffered => "buffered",
        WriteMode::Direct => "direct",
    }
}

/// The engines, one per mode, kept across runs as an embedding executor keeps its engine.
struct Engines {
    buffered: Engine,
    direct: Engine,
    _dir: tempfile::TempDir,
}

impl Engines {
    fn open(dir: tempfile::TempDir) -> Engines {
        let open = |m: WriteMode| {
            open_engine(
                EngineConfig::new(dir.path().join(mode_name(m))).mode(m),
                &format!(
                    "throughput {} (direct mode needs O_DIRECT on the bench root)",
                    mode_name(m)
                ),
            )
        };
        Engines {
            buffered: open(WriteMode::Buffered),
            direct: open(WriteMode::Direct),
            _dir: dir,
        }
    }

    fn get(&self, m: WriteMode) -> &Engine {
        match m {
            WriteMode::Buffered => &self.buffered,
            WriteMode::Direct => &self.direct,
        }
    }
}

fn run_engine(engine: &Engine, recs: &[Bytes], n: usize, sync: bool) -> Run {
    let task = engine.task("throughput").expect("task");
    let bytes = (n * recs[0].len()) as u64;
    let (t0, c0, tc0) = (Instant::now(), process_cpu(), thread_cpu());
    let mut in_api = Duration::ZERO;
    let mut w = task.writer().expect("writer");
    for i in 0..n {
        let b = Instant::now();
        w.write(recs[i % recs.len()].clone()).expect("engine write");
        in_api += b.elapsed();
    }
    let b = Instant::now();
    let state = w.finish().expect("finish");
    in_api += b.elapsed();
    let caller_cpu = thread_cpu() - tc0;
    if sync {
        for p in state.paths() {
            std::fs::File::open(&p)
                .and_then(|f| f.sync_data())
                .expect("sync a segment");
        }
    }
    let (wall, cpu) = (t0.elapsed(), process_cpu() - c0);
    drop(state);
    task.close();
    assert!(
        engine.settle(Duration::from_secs(300)),
        "engine deletes settle"
    );
    Run {
        bytes,
        wall,
        cpu,
        in_api,
        caller_cpu,
    }
}

fn run_one(
    which: Impl,
    engines: &Engines,
    dir: &Path,
    mode: WriteMode,
    recs: &[Bytes],
    n: usize,
    sync: bool,
) -> Run {
    match which {
        Impl::Engine => run_engine(engines.get(mode), recs, n, sync),
        Impl::Std => std_fs::write_run(dir, mode, recs, n, sync).expect("std::fs baseline run"),
        Impl::Uring => tokio_uring::write_run(dir, mode, recs, n, sync, URING_IN_FLIGHT)
            .expect("tokio-uring baseline run"),
    }
}

/// Bytes one run of `which` is asked to write: `total`, except for the synchronous 4 KiB
/// direct baselines, which write a quarter of it (256 MiB of the full 1 GiB run; see the module
/// docs). The rows report what the runs wrote (`Run::bytes`), so the report cannot name a size
/// the run did not write.
fn run_bytes(which: Impl, mode: WriteMode, record: usize, total: usize) -> usize {
    if which != Impl::Engine && mode == WriteMode::Direct && record <= 4 * KIB {
        (total / 4).max(record)
    } else {
        total
    }
}

fn parse_mode(s: &str) -> WriteMode {
    if s.eq_ignore_ascii_case("direct") {
        WriteMode::Direct
    } else {
        WriteMode::Buffered
    }
}

/// `SPILLRING_TP_SINGLE`: one run without the sync, one JSON line on stdout.
fn single(which: &str) {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    let mode = parse_mode(&env("SPILLRING_TP_MODE", "direct"));
    let record: usize = env("SPILLRING_TP_RECORD", "1048576")
        .parse()
        .expect("SPILLRING_TP_RECORD");
    let total: usize = env("SPILLRING_TP_BYTES", "1073741824")
        .parse()
        .expect("SPILLRING_TP_BYTES");
    let which = match which {
        "std" | "std_fs" => Impl::Std,
        "uring" | "tokio_uring" => Impl::Uring,
        _ => Impl::Engine,
    };
    let dir = scratch("throughput-single").expect("create a scratch directory");
    let engines =
        Engines::open(scratch("throughput-single-engine").expect("create a scratch directory"));
    let recs = payloads(record, DISTINCT_PAYLOADS);
    let r = run_one(
        which,
        &engines,
        dir.path(),
        mode,
        &recs,
        (total / record).max(1),
        false,
    );
    // The engine's rotations (ticket, create or pooled reuse, allocation), all on the caller's
    // thread for a blocking writer: the part of its wall time a fio run of one laid-out file
    // does not pay.
    let rot = engines.get(mode).metrics().latency.rotate;
    println!(
        "{}",
        json!({
            "impl": which.name(), "mode": mode_name(mode), "record_bytes": record,
            "bytes": r.bytes, "wall_s": r.wall.as_secs_f64(), "mb_s": r.mb_s(),
            "cpu_s_per_gib": r.per_gib(r.cpu), "caller_cpu_s_per_gib": r.per_gib(r.caller_cpu),
            "backend": engines.get(mode).backend(),
            "rotations": rot.count, "rotate_s": rot.sum_seconds,
        })
    );
}

fn main() {
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"throughput".contains(f.as_str())
    {
        return;
    }
    if let Ok(which) = std::env::var("SPILLRING_TP_SINGLE") {
        single(&which);
        return;
    }
    let quick = quick();
    let smoke = spillring_benches::test_mode();
    let total: usize = env_or(
        "SPILLRING_TP_BYTES",
        match (smoke, quick) {
            (true, _) => 4 * MIB,
            (false, true) => 64 * MIB,
            (false, false) => 1 << 30,
        },
    );
    let rounds: usize = env_or("SPILLRING_TP_ROUNDS", if quick || smoke { 1 } else { 5 });
    let dir = scratch("throughput").expect("create a scratch directory");
    let engines = Engines::open(scratch("throughput-engine").expect("create a scratch directory"));

    if let Some((what, dur)) = profile_request() {
        // e.g. "engine-direct-4KiB": loop that engine configuration for `dur`.
        let mode = parse_mode(what.split('-').nth(1).unwrap_or("direct"));
        let record = if what.ends_with("4KiB") {
            4 * KIB
        } else if what.ends_with("64KiB") {
            64 * KIB
        } else {
            MIB
        };
        let recs = payloads(record, DISTINCT_PAYLOADS);
        let which = if what.starts_with("std") {
            Impl::Std
        } else {
            Impl::Engine
        };
        let t = Instant::now();
        while t.elapsed() < dur {
            run_one(
                which,
                &engines,
                dir.path(),
                mode,
                &recs,
                256 * MIB / record,
                true,
            );
        }
        return;
    }

    let sizes = [(MIB, "1MiB"), (64 * KIB, "64KiB"), (4 * KIB, "4KiB")];
    let modes = [WriteMode::Buffered, WriteMode::Direct];
    let impls = [Impl::Engine, Impl::Std, Impl::Uring];
    let recs: Vec<Vec<Bytes>> = sizes
        .iter()
        .map(|&(s, _)| payloads(s, DISTINCT_PAYLOADS))
        .collect();
    // runs[size][mode][impl] = one Run per round
    let mut runs = vec![vec![vec![Vec::<Run>::new(); impls.len()]; modes.len()]; sizes.len()];
    let started = Instant::now();
    for round in 0..rounds {
        for (si, &(size, label)) in sizes.iter().enumerate() {
            for (mi, &mode) in modes.iter().enumerate() {
                for k in 0..impls.len() {
                    let ii = (k + round + si) % impls.len();
                    let n = (run_bytes(impls[ii], mode, size, total) / size).max(1);
                    let r = run_one(impls[ii], &engines, dir.path(), mode, &recs[si], n, true);
                    eprintln!(
                        "throughput round {round} {label:>5} {:<8} {:<11} {:>7.0} MB/s  cpu {:.3} s/GiB  caller-blocked {:.3} s/GiB",
                        mode_name(mode),
                        impls[ii].name(),
                        r.mb_s(),
                        r.per_gib(r.cpu),
                        r.per_gib(r.in_api),
                    );
                    runs[si][mi][ii].push(r);
                }
            }
        }
    }

    let med =
        |rs: &[Run], f: &dyn Fn(&Run) -> f64| median(&mut rs.iter().map(f).collect::<Vec<_>>());
    let mut rows = Vec::new();
    let mut goals = Vec::new();
    for (si, &(size, label)) in sizes.iter().enumerate() {
        for (mi, &mode) in modes.iter().enumerate() {
            for (ii, which) in impls.iter().enumerate() {
                let rs = &runs[si][mi][ii];
                // What the runs wrote (each `Run` counts its own bytes), not what was planned.
                let written = rs.first().map_or(0, |r| r.bytes);
                assert!(
                    rs.iter().all(|r| r.bytes == written),
                    "every run of one configuration writes the same bytes"
                );
                rows.push(json!({
                    "record": label, "record_bytes": size, "mode": mode_name(mode),
                    "impl": which.name(), "runs": rs.len(),
                    "bytes_per_run": written,
                    "mb_s": med(rs, &|r| r.mb_s()),
                    "cpu_s_per_gib": med(rs, &|r| r.per_gib(r.cpu)),
                    "caller_blocked_s_per_gib": med(rs, &|r| r.per_gib(r.in_api)),
                    "caller_cpu_s_per_gib": med(rs, &|r| r.per_gib(r.caller_cpu)),
                }));
            }
        }
        // Goal ratios, paired per round: engine (each mode) vs the std::fs buffered writer.
        let std_buf = &runs[si][0][1];
        for (mi, &mode) in modes.iter().enumerate() {
            let eng = &runs[si][mi][0];
            let ratio = |f: &dyn Fn(&Run) -> Duration| {
                let mut v: Vec<f64> = eng
                    .iter()
                    .zip(std_buf)
                    .map(|(e, s)| e.per_gib(f(e)) / s.per_gib(f(s)))
                    .collect();
                median(&mut v)
            };
            let cpu = ratio(&|r| r.cpu);
            let blocked = ratio(&|r| r.in_api);
            let uring = &runs[si][mi][2];
            let mut vs_uring: Vec<f64> = eng
                .iter()
                .zip(uring)
                .map(|(e, u)| e.mb_s() / u.mb_s())
                .collect();
            let mut vs_std: Vec<f64> = eng
                .iter()
                .zip(&runs[si][mi][1])
                .map(|(e, s)| e.mb_s() / s.mb_s())
                .collect();
            goals.push(json!({
                "record": label, "mode": mode_name(mode),
                "cpu_ratio_vs_std_buffered": cpu,
                "blocked_ratio_vs_std_buffered": blocked,
                "mb_s_ratio_vs_tokio_uring": median(&mut vs_uring),
                "mb_s_ratio_vs_std_fs_same_mode": median(&mut vs_std),
            }));
        }
    }
    write_results(
        "throughput",
        &json!({
            "bench": "throughput",
            // The engine's runs and every baseline run but the capped ones (see `run_bytes`);
            // each row's `bytes_per_run` is what its runs wrote.
            "bytes_per_run": total,
            "rounds": rounds,
            "quick": quick,
            "backend": engines.buffered.backend(),
            "tokio_uring_in_flight": URING_IN_FLIGHT,
            "seconds": started.elapsed().as_secs_f64(),
            "definitions": {
                "mb_s": "bytes / wall time from first write to end of sync_data",
                "cpu_s_per_gib": "getrusage(RUSAGE_SELF) user+sys over the same span, per GiB",
                "caller_blocked_s_per_gib": "wall time the calling thread spent inside the write API (sync excluded), per GiB",
                "caller_cpu_s_per_gib": "getrusage(RUSAGE_THREAD) of the calling thread over its write loop, per GiB",
            },
            "rows": rows,
            "goal_rows": goals,
        }),
    )
    .expect("write the bench results");
}
