//! Every read of a live state is judged: while a thread of this test deletes every segment file
//! under the root behind the engine's back, the reads of states nobody cancelled fail with a
//! bare NotFound, and loadgen must report each one as a violation, also in the `abandon` path
//! that reads half a state before dropping it (its read error was once dropped with `let _`).
//! Direct mode: there a reader opens each segment by name. (In buffered mode it reads through
//! the fd the segment kept from its writer, which still reads a file deleted behind the
//! engine's back, so those reads no longer fail.)

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{report, run, u};

const BIN: &str = env!("CARGO_BIN_EXE_loadgen");

/// Deletes every `spill-segment-*` file under `dir`; returns how many.
fn delete_segments(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            n += delete_segments(&e.path());
        } else if e
            .file_name()
            .to_string_lossy()
            .starts_with("spill-segment-")
            && std::fs::remove_file(e.path()).is_ok()
        {
            n += 1;
        }
    }
    n
}

#[test]
fn a_failed_read_of_an_abandoned_live_state_is_a_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let rep = dir.path().join("run.json");
    std::fs::create_dir(&root).expect("root");
    let stop = Arc::new(AtomicBool::new(false));
    let deleted = Arc::new(AtomicU64::new(0));
    let saboteur = {
        let (root, stop, deleted) = (root.clone(), stop.clone(), deleted.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                deleted.fetch_add(delete_segments(&root), Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(50));
            }
        })
    };
    // Only the abandon path runs (every op is "aborted" there, and abandon never cancels), so
    // the only reads are the half reads of states that are dropped afterwards.
    let o = run(
        Path::new(BIN),
        &[
            "run",
            "--root",
            root.to_str().expect("utf-8 path"),
            "--abort-points",
            "abandon",
            "--abort-rate",
            "1",
            "--fault-rate",
            "0",
            "--mode",
            "direct",
            "--ops",
            "300",
            "--tasks",
            "2",
            "--seed",
            "4",
            "--max-task-bytes",
            "1MiB",
            "--max-record",
            "64KiB",
            "--segment-size",
            "128KiB",
            "--io-buffer-size",
            "16KiB",
            "--progress",
            "none",
            "--report",
            rep.to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(120),
    );
    stop.store(true, Ordering::Relaxed);
    saboteur.join().expect("saboteur");
    assert!(deleted.load(Ordering::Relaxed) > 0, "nothing deleted");
    assert_eq!(
        o.code,
        Some(1),
        "the failed reads must fail the run\n{}",
        o.text()
    );
    let r = report(&rep);
    assert_eq!(r["passed"], false, "{r:#}");
    assert!(u(&r, &["violation_count"]) > 0, "{r:#}");
    // Each violation is a read (or reader) of a live state that failed: nothing else in the
    // run catches the sabotage, so without judging those reads the run would pass.
    for v in r["violations"].as_array().expect("violations") {
        let what = v["what"].as_str().unwrap_or_default();
        let at = v["where"].as_str().unwrap_or_default();
        assert!(
            what.contains("of a live state") && what.contains("No such file"),
            "{v:#}"
        );
        assert!(
            at.contains("stage read") || at.contains("stage reader"),
            "{v:#}"
        );
    }
}
