//! `loadgen crash` with 3 kills (two spill roots): every child is SIGKILLed with segment files
//! on disk, the next open sweeps them all, the bystander's live spill survives, and nothing
//! leaks.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{report, run, u};

const BIN: &str = env!("CARGO_BIN_EXE_loadgen");

#[test]
fn three_kills_leave_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let rep = dir.path().join("crash.json");
    let o = run(
        Path::new(BIN),
        &[
            "crash",
            "--kills",
            "3",
            "--root",
            root.to_str().expect("utf-8 path"),
            "--seed",
            "9",
            "--tasks",
            "4",
            "--roots",
            "2",
            "--abort-rate",
            "0.3",
            "--fault-rate",
            "0.05",
            "--max-task-bytes",
            "2MiB",
            "--segment-size",
            "128KiB",
            "--io-buffer-size",
            "16KiB",
            "--min-delay-ms",
            "50",
            "--max-delay-ms",
            "400",
            "--report",
            rep.to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(180),
    );
    assert_eq!(o.code, Some(0), "loadgen crash failed\n{}", o.text());
    let r = report(&rep);
    assert_eq!(r["passed"], true, "{r:#}");
    assert_eq!(u(&r, &["kills"]), 3, "{r:#}");
    assert_eq!(r["backend_requested"], "auto", "{r:#}");
    assert!(
        matches!(r["backend"].as_str(), Some("io_uring" | "psync")),
        "{r:#}"
    );
    assert_eq!(u(&r, &["violation_count"]), 0, "{r:#}");
    for k in ["files", "dirs", "fds", "maps"] {
        assert_eq!(u(&r, &["leaks", k]), 0, "leaked {k}: {r:#}");
    }
    assert_eq!(r["bystander_ok"], true, "{r:#}");
    let kills = r["kill_reports"].as_array().expect("kill_reports");
    assert_eq!(kills.len(), 3);
    for k in kills {
        assert_eq!(k["child_status"], "killed by signal 9", "{k:#}");
    }
    // The sweeps had real work: the children had files on disk when they died.
    assert!(u(&r, &["orphan_files_total"]) > 0, "{r:#}");
    assert_eq!(
        u(&r, &["orphan_files_total"]),
        u(&r, &["orphan_files_swept"]),
        "{r:#}"
    );
    let left: Vec<_> = std::fs::read_dir(&root).expect("root").collect();
    assert!(left.is_empty(), "root not empty: {left:?}");
}
