//! Tests that bite: each one fails when its invariant is broken the way an independent review
//! broke it (one deliberate bug at a time in a copy of the engine) while the rest of the suite
//! still passed. The bug each test catches is named in its docs.

#[macro_use]
mod common;
use common::*;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use spillring::{
    BackendKind, Bytes, Engine, EngineConfig, FaultAction, FaultPlan, FaultPoint, SpillError,
    Trigger,
};

const T: Duration = Duration::from_secs(10);

per_backend!(
    inv6_a_segment_deleted_under_a_reader_reads_as_aborted,
    inv6_readers_outlive_their_state_across_segments,
    inv6_every_live_state_keeps_every_file,
    inv4_a_mixed_batch_releases_exactly_its_confirmed_names,
    inv1_a_refused_create_makes_no_file_even_for_a_moment,
);

/// Writes `n` records of `len` bytes (record(i)) and finishes.
fn spill(task: &spillring::TaskSpill, n: u64, len: usize) -> spillring::SpilledState {
    let mut w = task.writer().unwrap();
    for i in 0..n {
        w.write(Bytes::from(record(i, len))).unwrap();
    }
    w.finish().unwrap()
}

/// Invariant 6: a reader whose next segment was deleted by a cancel after its abort check
/// reports `Aborted`, never a bare NotFound. Catches `open_error` returning the plain I/O error
/// (the reader's early abort check hid it: the open that matters was never reached).
fn inv6_a_segment_deleted_under_a_reader_reads_as_aborted(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    let task = engine.task("reader").unwrap();
    let plan = FaultPlan::new(61);
    task.set_fault_plan(plan.clone());
    // 60 KiB records: one per 64 KiB segment.
    let state = spill(&task, 3, 60 << 10);
    assert_eq!(state.segments(), 3);
    let mut r = state.reader().unwrap();
    let pause = plan.pause_once(FaultPoint::ReaderOpen); // the open of segment 0
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let first = r.next_record();
        tx.send(first.map(|o| o.map(|b| b.len()))).unwrap();
        r
    });
    assert!(pause.wait_reached(T));
    task.cancel();
    assert!(engine.settle(T), "the cancel's deletes must be done");
    assert_eq!(segment_files(dir.path()), 0, "the files are gone");
    pause.release();
    let first = rx.recv_timeout(T).unwrap();
    assert!(
        matches!(first, Err(SpillError::Aborted)),
        "a file deleted by a cancel must read as Aborted: {first:?}"
    );
    drop((h.join().unwrap(), state));
    assert_clean(&engine, dir.path());
}

/// Invariant 6 (refcounts): a reader keeps every file of its state after the state itself is
/// dropped, across segment boundaries. Catches a release that deletes when the state's own
/// grant goes while a reader still holds one.
fn inv6_readers_outlive_their_state_across_segments(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    let task = engine.task("outlive").unwrap();
    let state = spill(&task, 4, 60 << 10);
    assert_eq!(state.segments(), 4);
    let paths = state.paths();
    let mut r = state.reader().unwrap();
    drop(state);
    assert!(engine.settle(T));
    for i in 0..4 {
        // Each record opens the next segment: all four must still be there.
        assert!(
            paths.iter().all(|p| p.exists()),
            "record {i}: a file went early"
        );
        let rec = r.next_record().unwrap();
        assert_eq!(rec.as_deref(), Some(&record(i, 60 << 10)[..]), "record {i}");
    }
    assert!(r.next_record().unwrap().is_none());
    drop(r);
    assert!(engine.settle(T));
    assert!(
        paths.iter().all(|p| !p.exists()),
        "the last grant deletes them"
    );
    drop(task);
    assert_clean(&engine, dir.path());
}

/// Invariant 6: of many states, dropping some deletes exactly theirs; every file of every
/// live state stays and reads back. Catches a delete of the wrong state's files, which a check
/// that "some file remains" does not see.
fn inv6_every_live_state_keeps_every_file(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    let task = engine.task("many").unwrap();
    let mut states: Vec<_> = (0..12).map(|_| spill(&task, 3, 60 << 10)).collect();
    let all: Vec<Vec<_>> = states.iter().map(|s| s.paths()).collect();
    // Drop every third state.
    let mut kept = Vec::new();
    for (i, s) in states.drain(..).enumerate() {
        if i % 3 == 0 {
            drop(s);
        } else {
            kept.push((i, s));
        }
    }
    assert!(engine.settle(T));
    for (i, paths) in all.iter().enumerate() {
        let live = i % 3 != 0;
        for p in paths {
            assert_eq!(p.exists(), live, "state {i}: {}", p.display());
        }
    }
    for (i, s) in &kept {
        let mut r = s.reader().unwrap();
        for k in 0..3 {
            assert_eq!(
                r.next_record().unwrap().unwrap(),
                record(k, 60 << 10),
                "state {i}"
            );
        }
    }
    drop(kept);
    drop(task);
    assert_clean(&engine, dir.path());
}

/// Invariant 4 (confirmed-batch progress): one failed name inside a batch of confirmed ones
/// keeps exactly its own ticket; the batch's other names are deleted and release theirs.
/// Catches an all-or-nothing batch, which the test with the failure alone in its batch does
/// not.
fn inv4_a_mixed_batch_releases_exactly_its_confirmed_names(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(62);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(64 << 10)
            .cleanup_batch(1000)
            .cleanup_retry_delay(Duration::from_secs(3600))
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("batch").unwrap();
    let state = spill(&task, 20, 60 << 10);
    assert_eq!(state.segments(), 20);
    // Every normal-path delete fails: the 20 names go to the cleanup worker, which waits at
    // its first take until all 20 are queued, so they make one batch.
    plan.fail_times(FaultPoint::IoUnlink, libc::EIO, 20);
    let take = plan.pause_once(FaultPoint::CleanupTake);
    drop(state);
    assert!(take.wait_reached(T));
    let deadline = std::time::Instant::now() + T;
    while engine.metrics().cleanup_pending < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            engine.metrics()
        );
        thread::sleep(Duration::from_millis(2));
    }
    // The seventh name of the batch fails; the other nineteen succeed.
    plan.arm(
        FaultPoint::CleanupUnlink,
        FaultAction::Fail(libc::EIO),
        Trigger::After { skip: 6, times: 1 },
    );
    take.release();
    let deadline = std::time::Instant::now() + T;
    while engine.metrics().cleanup_pending > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            engine.metrics()
        );
        thread::sleep(Duration::from_millis(2));
    }
    let m = engine.metrics();
    assert_eq!(plan.fired(FaultPoint::CleanupUnlink), 1);
    assert_eq!(m.cleanup_pending, 1, "{m:?}");
    assert_eq!(
        m.tickets_used, 1,
        "exactly the failed name keeps its ticket: {m:?}"
    );
    assert_eq!(m.cleanup_released, 19, "{m:?}");
    assert_eq!(
        segment_files(dir.path()),
        1,
        "the confirmed names are deleted"
    );
    engine.retry_cleanup_now();
    drop(task);
    assert_clean(&engine, dir.path());
}

/// Invariant 1 (ticket before file): a create refused by a full ledger makes no file, not even
/// one that is deleted again at once (every delete is held back here, so such a file would be
/// seen). Catches a create-then-delete-on-refusal, which a count after `settle` does not.
fn inv1_a_refused_create_makes_no_file_even_for_a_moment(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(63);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(64 << 10)
            .ticket_capacity(1)
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("refused").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from(record(0, 60 << 10))).unwrap();
    let held = plan.pause_once(FaultPoint::IoUnlink);
    let created = engine.metrics().segments_created;
    // Watch the directory the segments live in: a file made and unlinked at once still shows
    // as a create.
    let seg_dir = engine.process_dirs()[0].clone();
    let watch = Inotify::watch(&seg_dir);
    let err = w.write(Bytes::from(record(1, 60 << 10))).unwrap_err();
    // The writer holds the only ticket itself: the refusal says it can never fit.
    assert!(
        matches!(
            err,
            SpillError::WriterCannotFit {
                resource: "ticket ledger",
                held: 1,
                limit: 1,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        watch.creates(),
        0,
        "a refused create made a file (and maybe deleted it)"
    );
    assert_eq!(segment_files(dir.path()), 1, "a refused create left a file");
    assert_eq!(engine.metrics().segments_created, created);
    assert!(!held.is_reached(), "a refused create deleted something");
    held.release();
    plan.clear_all();
    let state = w.finish().unwrap();
    drop((state, task));
    assert_clean(&engine, dir.path());
}

/// Invariant 1: the default ledger holds 65,536 tickets.
#[test]
fn inv1_the_default_ticket_capacity_is_65536() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    assert_eq!(engine.metrics().ticket_capacity, 65_536);
}

/// Invariant 8 (the sweep never stalls start-up): `open` returns before any file of a dead
/// engine is deleted; the cleanup worker deletes them afterwards. Catches a sweep run inside
/// `open`, whose time was printed but never asserted.
#[test]
fn inv8_open_returns_before_the_sweep_deletes_anything() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join(spillring::proc_dir_name(0xdead_beef));
    let d = dead.join("t0-task");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..2000 {
        std::fs::File::create(d.join(format!("spill-segment-{i:06}.bin"))).unwrap();
    }
    let plan = FaultPlan::new(64);
    // The worker stops before it takes its first job.
    let take = plan.pause_once(FaultPoint::CleanupTake);
    let t = std::time::Instant::now();
    let engine = Engine::open(cfg(dir.path(), BackendKind::Psync).fault_plan(plan)).unwrap();
    let open_time = t.elapsed();
    assert_eq!(
        segment_files(dir.path()),
        2000,
        "open deleted orphans on its own thread"
    );
    assert!(
        !dead.exists(),
        "the dead engine's directory is claimed (moved) at open"
    );
    assert!(
        open_time < Duration::from_secs(2),
        "open took {open_time:?} with 2,000 orphans"
    );
    assert!(take.wait_reached(T), "the sweep is the worker's job");
    take.release();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.orphan_files_swept, 2000);
}

/// An inotify watch on one directory that counts the files created in it.
struct Inotify(std::os::fd::OwnedFd);

impl Inotify {
    fn watch(dir: &std::path::Path) -> Self {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: plain syscalls with checked results; the path is NUL-terminated.
        unsafe {
            let fd = libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC);
            assert!(
                fd >= 0,
                "inotify_init1: {}",
                std::io::Error::last_os_error()
            );
            let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
            let w = libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE);
            assert!(
                w >= 0,
                "inotify_add_watch: {}",
                std::io::Error::last_os_error()
            );
            Inotify(std::os::fd::OwnedFd::from_raw_fd(fd))
        }
    }

    /// Create events seen so far.
    fn creates(&self) -> usize {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 4096];
        let mut n = 0;
        loop {
            // SAFETY: reads into a live buffer of the given length.
            let r = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r <= 0 {
                return n;
            }
            let mut off = 0usize;
            while off + 16 <= r as usize {
                let mask = u32::from_ne_bytes(buf[off + 4..off + 8].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[off + 12..off + 16].try_into().unwrap());
                if mask & libc::IN_CREATE != 0 {
                    n += 1;
                }
                off += 16 + len as usize;
            }
        }
    }
}
