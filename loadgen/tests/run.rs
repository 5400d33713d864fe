//! A short `loadgen run` with abort and fault rates at 0.3: it must exit 0 with nothing leaked,
//! after exercising every abort point, every fault point, both kinds of task (threads and
//! async), read-back and publish.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{report, run, u};

const BIN: &str = env!("CARGO_BIN_EXE_loadgen");

fn short_run(extra: &[&str], ops: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let rep = dir.path().join("run.json");
    let mut args = vec![
        "run",
        "--root",
        root.to_str().expect("utf-8 path"),
        "--ops",
        ops,
        "--duration",
        "90",
        "--tasks",
        "6",
        "--abort-rate",
        "0.3",
        "--fault-rate",
        "0.3",
        "--seed",
        "5",
        "--max-task-bytes",
        "1MiB",
        "--max-record",
        "300KiB",
        "--segment-size",
        "128KiB",
        "--io-buffer-size",
        "16KiB",
        "--progress",
        "plain",
        "--report",
        rep.to_str().expect("utf-8 path"),
    ];
    args.extend_from_slice(extra);
    let o = run(Path::new(BIN), &args, Duration::from_secs(180));
    assert_eq!(o.code, Some(0), "loadgen run failed\n{}", o.text());
    assert!(o.stdout.contains("PASSED"), "{}", o.text());
    let r = report(&rep);
    assert_eq!(r["passed"], true, "{r:#}");
    // Which backend ran is printed and reported, always.
    let backend = r["backend"].as_str().expect("backend");
    assert!(matches!(backend, "io_uring" | "psync"), "{r:#}");
    assert!(
        o.stderr
            .contains(&format!("loadgen run: backend {backend}")),
        "{}",
        o.text()
    );
    assert!(
        o.stdout.contains(&format!("{backend} (--backend")),
        "{}",
        o.text()
    );
    for k in [
        "files",
        "tickets",
        "dirs",
        "fds",
        "maps",
        "published_missing",
    ] {
        assert_eq!(u(&r, &["leaks", k]), 0, "leaked {k}: {r:#}");
    }
    assert_eq!(u(&r, &["violation_count"]), 0, "{r:#}");
    // The root the run was given is left empty.
    let left: Vec<_> = std::fs::read_dir(&root).expect("root").collect();
    assert!(left.is_empty(), "root not empty: {left:?}");
    r
}

#[test]
fn short_run_with_aborts_and_faults_leaks_nothing() {
    let r = short_run(&[], "700");
    assert_eq!(r["backend_requested"], "auto", "{r:#}");
    assert_eq!(u(&r, &["ops", "done"]), 700, "{r:#}");
    assert!(
        u(&r, &["ops", "thread"]) > 0 && u(&r, &["ops", "async"]) > 0,
        "{r:#}"
    );
    // Op choices come from the seed and the op index, so every point is hit every time.
    let points = r["aborts_by_point"].as_object().expect("aborts_by_point");
    assert_eq!(points.len(), 7, "{r:#}");
    for (p, n) in points {
        assert!(
            n.as_u64().unwrap_or(0) > 0,
            "abort point {p} never hit: {r:#}"
        );
    }
    assert!(u(&r, &["aborts_total"]) >= 100, "{r:#}");
    // The create window and the hand-off window were really hit (paused and cancelled there).
    assert!(u(&r, &["abort_windows", "reached"]) > 0, "{r:#}");
    assert!(u(&r, &["hand_off_windows", "reached"]) > 0, "{r:#}");
    assert!(u(&r, &["late_files_deleted"]) > 0, "{r:#}");
    for p in [
        "writer::create",
        "io::write",
        "io::unlink",
        "cleanup::unlink",
    ] {
        assert!(u(&r, &["faults_injected", p]) > 0, "no fault at {p}: {r:#}");
    }
    assert!(u(&r, &["ops", "failed_by_fault"]) > 0, "{r:#}");
    assert!(u(&r, &["cleanup_retries"]) > 0, "{r:#}");
    assert!(
        u(&r, &["ops", "read_back"]) > 0 && u(&r, &["records_read"]) > 0,
        "{r:#}"
    );
    assert!(u(&r, &["ops", "published_files"]) > 0, "{r:#}");
    assert!(u(&r, &["latency", "abort_to_clean", "count"]) > 0, "{r:#}");
    // Zero-copy records read before a cancel stayed intact after their files were deleted,
    // and some after the engine itself was dropped.
    assert!(u(&r, &["ops", "kept_records_checked"]) > 0, "{r:#}");
    assert!(u(&r, &["ops", "records_outliving_engine"]) > 0, "{r:#}");
    assert!(
        u(&r, &["latency", "segment_rotation", "count"]) > 0,
        "{r:#}"
    );
    assert_eq!(u(&r, &["engine", "tickets_used"]), 0, "{r:#}");
}

#[test]
fn short_direct_run_on_psync_over_two_roots_leaks_nothing() {
    let r = short_run(
        &[
            "--mode",
            "direct",
            "--backend",
            "psync",
            "--roots",
            "2",
            "--preallocate",
        ],
        "250",
    );
    assert_eq!(r["backend_requested"], "psync", "{r:#}");
    assert_eq!(r["backend"], "psync", "{r:#}");
    assert_eq!(r["config"]["mode"], "direct", "{r:#}");
    assert_eq!(u(&r, &["ops", "done"]), 250, "{r:#}");
    assert!(u(&r, &["aborts_total"]) > 0, "{r:#}");
}

/// `--backend uring` means io_uring: the run is on it (or fails), and says so.
#[test]
fn short_run_on_io_uring_says_it_ran_on_io_uring() {
    let r = short_run(&["--backend", "uring"], "120");
    assert_eq!(r["backend_requested"], "uring", "{r:#}");
    assert_eq!(r["backend"], "io_uring", "{r:#}");
    assert_eq!(r["engine"]["backend"], "io_uring", "{r:#}");
    assert_eq!(u(&r, &["ops", "done"]), 120, "{r:#}");
}
