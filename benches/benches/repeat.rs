//! Repeat: back-to-back 1 GiB direct-mode spills on one engine, the segment pool's case.
//!
//! One engine in direct mode on the disk root (`SPILLRING_BENCH_ROOT`, see `scratch`) runs six
//! rounds of: a task scope, one writer, 1 GiB in 1 MiB records (`SPILLRING_BENCH_QUICK=1`:
//! 128 MiB), `finish`, read everything back through a `SpillReader`, drop the reader, the state
//! and the scope (the files go to the segment pool, or are deleted when it is off), and wait
//! for the confirmed deletes. The figure per round is MB/s of the write + `finish` part (from
//! the first `write` until `finish` returned, every write completed); the read-back is timed
//! for context.
//!
//! In the same run, interleaved: a second engine with the pool off (`pool_max_segments(0)`),
//! and fio on the job `scripts/fio-baseline.sh` uses (io_uring, O_DIRECT, 1 MiB blocks, queue
//! depth 8, fixed buffers and registered files, one file of the same size, fio's default
//! fallocate, unlinked after the run), if `fio` is installed. Each round runs fio, pool on, fio,
//! pool off (pool off first in every other round), so fio runs between the engines' rounds,
//! drift hits all three alike, and every engine run follows a fio run (on this host an engine
//! run is measurably faster right after a run of the same engine than right after fio, which
//! an order like on-fio-off / off-fio-on would turn into a bias of the median). The round's fio
//! figure is the mean of its two fio runs. Without fio the engines alternate as on, off / off,
//! on.
//!
//! Goals (issue): the median over rounds 2-6 of the per-round ratio pool-on MB/s / fio MB/s
//! at least 0.9, and of pool-on / pool-off at least 2; each reported with the number of pairs
//! and its min/max spread. Round 1 is the pool's cold round (every segment is created) and is shown
//! but not counted.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use spillring::{Engine, EngineConfig, WriteMode};
use spillring_benches::{
    MIB, engine_info, env_or, open_engine, payloads, quick, scratch, spread, wait_deletes,
    write_results,
};

const ROUNDS: usize = 6;
/// Rounds counted in the figures: 2-6 (1-based), past the pool's cold round.
const FIRST_COUNTED: usize = 1;
const RECORD: usize = MIB;
const DISTINCT_PAYLOADS: usize = 8;

/// What one engine round measured.
struct EngineRound {
    write_mb_s: f64,
    read_mb_s: f64,
    segments: usize,
    pool_hits: u64,
    pool_misses: u64,
}

fn engine_round(engine: &Engine, recs: &[Bytes], bytes: usize, round: usize) -> EngineRound {
    let n = bytes / RECORD;
    let m0 = engine.metrics();
    let task = engine.task(&format!("repeat-{round}")).expect("task");
    let mut w = task.writer().expect("writer");
    let t0 = Instant::now();
    for i in 0..n {
        w.write(recs[i % recs.len()].clone()).expect("engine write");
    }
    let state = w.finish().expect("finish");
    let write = t0.elapsed();
    let segments = state.segments();
    let t1 = Instant::now();
    let mut r = state.reader().expect("reader");
    let mut read = 0usize;
    while let Some(rec) = r.next_record().expect("read back") {
        read += rec.len();
    }
    let read_t = t1.elapsed();
    assert_eq!(read, n * RECORD, "read back every byte written");
    drop(r);
    drop(state);
    drop(task);
    wait_deletes(engine, Duration::from_secs(300));
    let m1 = engine.metrics();
    let mb = (n * RECORD) as f64 / 1e6;
    EngineRound {
        write_mb_s: mb / write.as_secs_f64(),
        read_mb_s: mb / read_t.as_secs_f64(),
        segments,
        pool_hits: m1.pool_hits - m0.pool_hits,
        pool_misses: m1.pool_misses - m0.pool_misses,
    }
}

/// fio's version, or None when it is not installed.
fn fio_version() -> Option<String> {
    let out = Command::new("fio").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The fio job of `scripts/fio-baseline.sh` on `bytes` in `dir`.
fn fio_args(dir: &Path, bytes: usize) -> Vec<String> {
    [
        "--name=spillring-repeat".to_owned(),
        format!("--filename={}", dir.join("fio.bin").display()),
        "--ioengine=io_uring".to_owned(),
        "--rw=write".to_owned(),
        "--bs=1M".to_owned(),
        "--iodepth=8".to_owned(),
        "--direct=1".to_owned(),
        "--fixedbufs=1".to_owned(),
        "--registerfiles=1".to_owned(),
        format!("--size={}M", bytes / MIB),
        "--unlink=1".to_owned(),
        "--output-format=json".to_owned(),
    ]
    .into()
}

/// One fio run: its write bandwidth in MB/s.
fn fio_round(args: &[String]) -> f64 {
    let out = Command::new("fio").args(args).output().expect("run fio");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fio may print notes before its JSON.
    let doc: serde_json::Value =
        serde_json::from_str(&text[text.find('{').expect("fio JSON output")..])
            .expect("parse fio's JSON");
    doc["jobs"][0]["write"]["bw_bytes"]
        .as_f64()
        .expect("fio's write bandwidth")
        / 1e6
}

fn main() {
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"repeat".contains(f.as_str())
    {
        return; // filtered out
    }
    let smoke = spillring_benches::test_mode();
    let quick = quick();
    let bytes: usize = env_or(
        "SPILLRING_REPEAT_BYTES",
        match (smoke, quick) {
            (true, _) => 8 * MIB,
            (false, true) => 128 * MIB,
            (false, false) => 1 << 30,
        },
    );
    let bytes = (bytes / RECORD).max(1) * RECORD;
    let rounds = if smoke { 2 } else { ROUNDS };
    let dir = scratch("repeat").expect("create a scratch directory");
    let open = |sub: &str, pool: bool| {
        let mut cfg = EngineConfig::new(dir.path().join(sub)).mode(WriteMode::Direct);
        if !pool {
            cfg = cfg.pool_max_segments(0);
        }
        open_engine(
            cfg,
            &format!("repeat pool-{sub} (direct mode needs O_DIRECT on the bench root)"),
        )
    };
    let (on, off) = (open("pool-on", true), open("pool-off", false));
    let fio_dir = dir.path().join("fio");
    std::fs::create_dir_all(&fio_dir).expect("create the fio directory");
    // fio is the baseline of a timed run only; a smoke pass checks the engine paths.
    let fio = if smoke { None } else { fio_version() };
    let fio_job = fio_args(&fio_dir, bytes);
    let recs = payloads(RECORD, DISTINCT_PAYLOADS);

    let mut rows = Vec::new();
    let (mut on_mb, mut off_mb, mut fio_mb) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut engines = ["on", "off"];
        if round % 2 == 1 {
            engines.reverse();
        }
        let (mut r_on, mut r_off, mut r_fio) = (None, None, Vec::new());
        for side in engines {
            if fio.is_some() {
                r_fio.push(fio_round(&fio_job));
            }
            match side {
                "on" => r_on = Some(engine_round(&on, &recs, bytes, round)),
                _ => r_off = Some(engine_round(&off, &recs, bytes, round)),
            }
        }
        let fio_runs = r_fio.clone();
        let r_fio = (!r_fio.is_empty()).then(|| r_fio.iter().sum::<f64>() / r_fio.len() as f64);
        let (r_on, r_off) = (r_on.expect("pool-on round"), r_off.expect("pool-off round"));
        eprintln!(
            "repeat round {}: pool on {:>6.0} MB/s ({} hits, {} misses), pool off {:>6.0} MB/s, fio {}",
            round + 1,
            r_on.write_mb_s,
            r_on.pool_hits,
            r_on.pool_misses,
            r_off.write_mb_s,
            r_fio.map_or("not measured".to_owned(), |v| format!("{v:.0} MB/s")),
        );
        on_mb.push(r_on.write_mb_s);
        off_mb.push(r_off.write_mb_s);
        fio_mb.push(r_fio);
        rows.push(json!({
            "round": round + 1,
            "counted": round >= FIRST_COUNTED,
            "pool_on_mb_s": r_on.write_mb_s,
            "pool_off_mb_s": r_off.write_mb_s,
            "fio_mb_s": r_fio,
            "fio_runs_mb_s": fio_runs,
            "pool_on_vs_fio": r_fio.map(|f| r_on.write_mb_s / f),
            "pool_on_vs_pool_off": r_on.write_mb_s / r_off.write_mb_s,
            "pool_on_read_mb_s": r_on.read_mb_s,
            "pool_off_read_mb_s": r_off.read_mb_s,
            "segments": r_on.segments,
            "pool_on_hits": r_on.pool_hits,
            "pool_on_misses": r_on.pool_misses,
            "pool_off_hits": r_off.pool_hits,
            "pool_off_misses": r_off.pool_misses,
        }));
    }

    let counted = FIRST_COUNTED.min(rounds - 1)..rounds;
    let vs_off: Vec<f64> = counted.clone().map(|i| on_mb[i] / off_mb[i]).collect();
    let vs_fio: Option<Vec<f64>> = counted
        .clone()
        .map(|i| fio_mb[i].map(|f| on_mb[i] / f))
        .collect();
    let vs_off_s = spread(&vs_off);
    let vs_fio_s = vs_fio.as_deref().map(spread);
    let med = |s: &serde_json::Value| s["median"].as_f64().unwrap_or(f64::NAN);
    eprintln!(
        "repeat: pool on / pool off {:.2}, pool on / fio {}, rounds {}-{rounds}",
        med(&vs_off_s),
        vs_fio_s
            .as_ref()
            .map_or("not measured".to_owned(), |s| format!("{:.3}", med(s))),
        counted.start + 1,
    );
    let fio_mb_counted: Option<Vec<f64>> = counted.clone().map(|i| fio_mb[i]).collect();
    write_results(
        "repeat",
        &json!({
            "bench": "repeat",
            "what": "back-to-back direct-mode spills on one engine (write in 1 MiB records, finish, read back, release; MB/s of write + finish), segment pool on vs off, vs fio's io_uring O_DIRECT 1 MiB qd 8 job, interleaved in the same run",
            "engine": engine_info(&on),
            "root": dir.path().display().to_string(),
            "bytes_per_round": bytes,
            "record_bytes": RECORD,
            "rounds": rounds,
            "counted_rounds": format!("{}-{rounds}", counted.start + 1),
            "quick": quick,
            "fio_version": fio,
            "fio_command": fio.as_ref().map(|_| format!("fio {}", fio_job.join(" "))),
            "fio_note": if fio.is_some() { "measured" } else { "not measured: fio is not installed" },
            "pool_on_mb_s": spread(&on_mb[counted.clone()]),
            "pool_off_mb_s": spread(&off_mb[counted.clone()]),
            "fio_mb_s": fio_mb_counted.as_deref().map(spread),
            "pool_on_vs_pool_off": vs_off_s,
            "pool_on_vs_fio": vs_fio_s,
            "rows": rows,
        }),
    )
    .expect("write the bench results");
}
