//! Crash leaves nothing for good (invariant 8 in ARCHITECTURE.md): a real child process, killed by SIGKILL
//! while spilling, and a second live engine on the same root. The next open reclaims every
//! file and directory of the dead process and leaves the live engine's files alone.

#[macro_use]
mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spillring::{BackendKind, Bytes, Engine};

const ROOT_ENV: &str = "SPILLRING_CRASH_ROOT";
const BACKEND_ENV: &str = "SPILLRING_CRASH_BACKEND";

per_backend!(a_killed_process_is_reclaimed_by_the_next_open);

/// The child: spills forever (finished states kept, a writer with writes in flight) until it
/// is killed. Run only by `a_killed_process_is_reclaimed_by_the_next_open`, which starts this
/// test binary again with `--ignored --exact`.
#[test]
#[ignore = "child process of a_killed_process_is_reclaimed_by_the_next_open"]
fn crash_child() {
    let root = PathBuf::from(std::env::var(ROOT_ENV).expect("started by the crash test"));
    let backend = match std::env::var(BACKEND_ENV).as_deref() {
        Ok("psync") => BackendKind::Psync,
        _ => BackendKind::Uring,
    };
    // The pool on: the kill also leaves pooled files, which the next open must reclaim.
    // Encrypted: the leftovers are ciphertext under a key that died with the process, and
    // are swept all the same (the sweep deletes by name).
    let engine = Engine::open(
        pooled_cfg(&root, backend)
            .segment_size(64 << 10)
            .encryption(true),
    )
    .unwrap();
    let task = engine.task("doomed").unwrap();
    let mut states = Vec::new();
    for k in 0..3 {
        let mut w = task.writer().unwrap();
        for i in 0..200 {
            w.write(Bytes::from(record(k * 1000 + i, 1000))).unwrap();
        }
        states.push(w.finish().unwrap());
    }
    // One state released: its segments go to the pool.
    drop(states.remove(0));
    assert!(engine.metrics().pool_segments > 0, "{:?}", engine.metrics());
    let mut w = task.writer().unwrap();
    for i in 0..100 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    // Straight to fd 1: the test harness captures println!, not the raw stream.
    let mut out = std::io::stdout();
    writeln!(out, "READY {}", engine.process_dirs()[0].display()).unwrap();
    out.flush().unwrap();
    let mut i = 0;
    loop {
        w.write(Bytes::from(record(i, 1000))).unwrap();
        i += 1;
        if i % 64 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    files_under(dir)
}

fn a_killed_process_is_reclaimed_by_the_next_open(b: BackendKind) {
    let backend = b.as_str();
    let dir = tempfile::tempdir().unwrap();

    // A live engine with files of its own on the same root.
    let live = open(dir.path(), b);
    let live_task = live.task("live").unwrap();
    let mut w = live_task.writer().unwrap();
    for i in 0..300 {
        w.write(Bytes::from(record(i, 1500))).unwrap();
    }
    let live_state = w.finish().unwrap();
    let live_files = files_in(&live.process_dirs()[0]);
    assert!(live_files.len() >= 2);

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROOT_ENV, dir.path())
        .env(BACKEND_ENV, backend)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let child_dir = loop {
        let line = lines.next().expect("child exited before READY").unwrap();
        // libtest may have written "test crash_child ... " on the same line.
        if let Some(at) = line.find("READY ") {
            break PathBuf::from(&line[at + "READY ".len()..]);
        }
    };
    std::thread::sleep(Duration::from_millis(50)); // mid-spill
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let orphans = files_in(&child_dir);
    assert!(orphans.len() >= 4, "the child left {} files", orphans.len());
    // Unreadable: every leftover with a whole header is refused as encrypted.
    let mut refused = 0;
    for p in &orphans {
        match spillring::SegmentReader::open(p) {
            Err(spillring::SpillError::Corrupt { detail, .. }) if detail.contains("encrypted") => {
                refused += 1
            }
            Err(spillring::SpillError::Corrupt { offset: 0, .. }) => {}
            Err(spillring::SpillError::Corrupt { detail, .. })
                if detail.contains("truncated inside its header") => {}
            other => panic!(
                "{}: a killed encrypted engine's file read: {other:?}",
                p.display()
            ),
        }
    }
    assert!(
        refused >= 4,
        "{refused} of {} refused as encrypted",
        orphans.len()
    );

    // The next open claims the dead directory at once and sweeps it in the background.
    let t = Instant::now();
    let next = open(dir.path(), b);
    let opened_in = t.elapsed();
    assert!(
        !child_dir.exists(),
        "the dead directory is moved out of the way at open"
    );
    assert!(next.settle(Duration::from_secs(10)));
    eprintln!(
        "open took {opened_in:?} with {} orphan files",
        orphans.len()
    );
    let m = next.metrics();
    assert_eq!(m.orphan_dirs_swept, 1, "{m:?}");
    assert_eq!(m.orphan_files_swept, orphans.len() as u64, "{m:?}");

    // Nothing of the dead process is left; the live engine's files are untouched.
    let mut left = files_under(dir.path());
    left.retain(|p| !p.starts_with(&live.process_dirs()[0]));
    assert_eq!(
        left,
        Vec::<PathBuf>::new(),
        "files of the dead process remain"
    );
    assert_eq!(files_in(&live.process_dirs()[0]), live_files);
    let mut r = live_state.reader().unwrap();
    for i in 0..300 {
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, 1500)[..]);
    }
    assert!(r.next_record().unwrap().is_none());
    drop((r, live_state));
    live_task.close();
    assert!(live.settle(Duration::from_secs(10)));
    assert_eq!(files_under(dir.path()), Vec::<PathBuf>::new());
    // A third engine finds two live directories and claims neither.
    let third = open(dir.path(), b);
    assert!(third.settle(Duration::from_secs(5)));
    assert_eq!(third.metrics().orphan_dirs_swept, 0);
    assert!(live.process_dirs()[0].exists() && next.process_dirs()[0].exists());
    let ids = (
        live.process_dirs(),
        next.process_dirs(),
        third.process_dirs(),
    );
    drop((third, next, live, live_task));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        left,
        Vec::<PathBuf>::new(),
        "clean shutdowns leave nothing: {ids:?} {:?}",
        files_under(dir.path())
    );
}

#[test]
fn a_dead_directory_of_any_content_is_swept_without_stalling_open() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // A crashed engine's directory, with nested task directories and stray files.
    let dead = dir
        .path()
        .join(format!("{}{:016x}", spillring::PROC_PREFIX, 0xdead_u64));
    for t in 0..20 {
        let td = dead.join(format!("t{t}-x"));
        std::fs::create_dir_all(&td).unwrap();
        for s in 0..100 {
            std::fs::write(td.join(format!("spill-segment-{s:06}.bin")), b"x").unwrap();
        }
    }
    let t = Instant::now();
    let engine = open(dir.path(), BackendKind::Uring);
    let opened = t.elapsed();
    assert!(!dead.exists());
    assert!(engine.settle(Duration::from_secs(20)));
    let m = engine.metrics();
    assert_eq!(
        (m.orphan_dirs_swept, m.orphan_files_swept),
        (1, 2000),
        "{m:?}"
    );
    eprintln!("open took {opened:?} with 2,000 orphan files");
    drop(engine);
    assert_eq!(dirs_under(dir.path()), Vec::<PathBuf>::new());
}
