//! Cleanup-path figures for the record: how fast the cleanup worker drains name-only records
//! when 10% of its deletes fail, and how long `Engine::open` takes with 10,000 orphaned files
//! of a dead engine on the root. Each figure has a baseline measured in the same run.
//!
//! ```text
//! cargo run --release --example cleanup_rates [-- --records 20000 --orphans 10000 --root DIR]
//! ```
//! Prints one JSON object (scripts/cleanup-rates.sh stores it in results/).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillring::{
    BackendKind, Bytes, Engine, EngineConfig, FaultAction, FaultPlan, FaultPoint, Trigger,
};

struct Args {
    records: u64,
    orphans: u64,
    root: PathBuf,
}

fn parse() -> Args {
    let mut a = Args {
        records: 20_000,
        orphans: 10_000,
        root: std::env::temp_dir(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        match k.as_str() {
            "--records" => a.records = v.parse().unwrap_or(a.records),
            "--orphans" => a.orphans = v.parse().unwrap_or(a.orphans),
            "--root" => a.root = PathBuf::from(v),
            _ => {
                eprintln!("usage: cleanup_rates [--records N] [--orphans N] [--root DIR]");
                std::process::exit(2);
            }
        }
    }
    a
}

/// Queues `n` name-only records (one-record segments whose normal-path delete fails), then
/// lets the worker drain them with `fail_rate` of its deletes failing. Returns records/s and
/// the worker's retry count.
fn drain(
    root: &Path,
    n: u64,
    fail_rate: f64,
    backend: BackendKind,
) -> Result<(f64, u64, f64), Box<dyn std::error::Error>> {
    let plan = FaultPlan::new(42);
    let engine = Engine::open(
        EngineConfig::new(root)
            .backend(backend)
            .segment_size(64 << 10)
            .io_buffer_size(64 << 10)
            .ticket_capacity(n as usize + 16)
            .fault_plan(plan.clone()),
    )?;
    plan.fail_always(FaultPoint::IoUnlink, libc::EIO);
    plan.fail_always(FaultPoint::CleanupUnlink, libc::EIO);
    let task = engine.task("drain")?;
    for i in 0..n {
        let mut w = task.writer()?;
        w.write(Bytes::from(i.to_le_bytes().to_vec()))?;
        drop(w.finish()?);
    }
    while engine.metrics().cleanup_pending < n {
        std::thread::sleep(Duration::from_millis(5));
    }
    plan.clear_all();
    if fail_rate > 0.0 {
        plan.arm(
            FaultPoint::CleanupUnlink,
            FaultAction::Fail(libc::EIO),
            Trigger::Probability(fail_rate),
        );
    }
    let m0 = engine.metrics();
    let (released0, retries0) = (m0.cleanup_released, m0.cleanup_retries);
    let t = Instant::now();
    engine.retry_cleanup_now();
    while engine.pending_deletes() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = t.elapsed().as_secs_f64();
    let m = engine.metrics();
    assert_eq!(m.cleanup_released - released0, n);
    task.close();
    engine.settle(Duration::from_secs(30));
    Ok((n as f64 / secs, m.cleanup_retries - retries0, secs))
}

/// A dead engine's directory with `n` segment files in 100 task directories.
fn plant_orphans(root: &Path, n: u64) -> std::io::Result<()> {
    let dead = root.join(format!(
        "{}{:016x}",
        spillring::PROC_PREFIX,
        0xdead_beef_u64
    ));
    for i in 0..n {
        let td = dead.join(format!("t{}-orphan", i % 100));
        if i < 100 {
            std::fs::create_dir_all(&td)?;
        }
        std::fs::write(
            td.join(format!("spill-segment-{:06}.bin", i / 100)),
            [0u8; 128],
        )?;
    }
    Ok(())
}

fn time_open(root: &Path) -> Result<(Duration, Duration, Engine), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let engine = Engine::open(EngineConfig::new(root))?;
    let open = t.elapsed();
    engine.settle(Duration::from_secs(120));
    Ok((open, t.elapsed(), engine))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse();
    let base = tempfile::tempdir_in(&a.root)?;
    let mut drains = Vec::new();
    for backend in [BackendKind::Uring, BackendKind::Psync] {
        let name = format!("{backend:?}").to_lowercase();
        let (clean, _, clean_s) = drain(
            &base.path().join(format!("d0-{name}")),
            a.records,
            0.0,
            backend,
        )?;
        let (faulty, retries, faulty_s) = drain(
            &base.path().join(format!("d10-{name}")),
            a.records,
            0.10,
            backend,
        )?;
        eprintln!(
            "{name}: drain {clean:.0} records/s with no failures, {faulty:.0} records/s with 10% failing ({retries} retries, {faulty_s:.2} s)"
        );
        drains.push(serde_json::json!({
            "backend": name,
            "records": a.records,
            "records_per_sec_no_failures": clean,
            "seconds_no_failures": clean_s,
            "records_per_sec_10pct_failures": faulty,
            "seconds_10pct_failures": faulty_s,
            "retries_10pct": retries,
            "ratio_vs_no_failures": faulty / clean,
            "retry_delay_secs": 1.0,
            "batch": 1000,
        }));
    }
    // Open on an empty root (baseline), then with orphans planted.
    let empty = base.path().join("open-empty");
    std::fs::create_dir_all(&empty)?;
    let (open_empty, _, e) = time_open(&empty)?;
    drop(e);
    let full = base.path().join("open-orphans");
    std::fs::create_dir_all(&full)?;
    plant_orphans(&full, a.orphans)?;
    let (open_orphans, swept_after, e) = time_open(&full)?;
    let m = e.metrics();
    drop(e);
    eprintln!(
        "open: {open_empty:?} on an empty root, {open_orphans:?} with {} orphan files (swept {} files in the background within {swept_after:?})",
        a.orphans, m.orphan_files_swept
    );
    let out = serde_json::json!({
        "command": format!("cargo run --release --example cleanup_rates -- --records {} --orphans {}", a.records, a.orphans),
        "drain": drains,
        "open": {
            "orphan_files": a.orphans,
            "open_empty_root_ms": open_empty.as_secs_f64() * 1e3,
            "open_with_orphans_ms": open_orphans.as_secs_f64() * 1e3,
            "ratio": open_orphans.as_secs_f64() / open_empty.as_secs_f64(),
            "sweep_done_after_open_ms": swept_after.as_secs_f64() * 1e3,
            "orphan_files_swept": m.orphan_files_swept,
        },
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
