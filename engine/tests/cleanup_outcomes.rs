//! Tests prompted by cargo-mutants on the cleanup layer (`cleanup/mod.rs`, `worker.rs`,
//! `sweep.rs`): see results/MUTANTS.md. The crash sweep's failure paths (a claimed tree gone
//! before its sweep, a sweep that fails for real and is retried), on both backends.

#[macro_use]
mod common;
use common::*;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spillring::{BackendKind, Bytes, Engine, FaultPlan, FaultPoint};

use std::sync::Arc;

per_backend!(
    a_claimed_tree_gone_before_its_sweep_is_done_with,
    a_sweep_that_fails_is_counted_retried_and_then_done,
    a_file_already_gone_at_its_delete_is_confirmed_on_the_spot,
    trim_pool_deletes_and_counts_every_pooled_file,
    a_failed_record_waits_its_retry_delay_plus_at_most_a_quarter,
    a_sweep_stopped_by_shutdown_is_left_for_the_next_open_not_failed,
    a_file_gone_between_the_sweeps_readdir_and_unlink_is_no_failure,
    retries_abandoned_at_shutdown_are_not_counted_as_failures,
);

const T: Duration = Duration::from_secs(20);

/// A dead engine's directory under `root` with one task directory holding `files` segments;
/// returns the task directory.
fn dead_engine(root: &Path, files: usize) -> PathBuf {
    let d = root
        .join(spillring::proc_dir_name(0xdead_0001))
        .join("t0-task");
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..files {
        std::fs::write(d.join(format!("spill-segment-{i:06}.bin")), b"x").unwrap();
    }
    d
}

/// The trees claimed into the engine's process directory (its only subdirectories).
fn claimed(engine: &Engine) -> Vec<PathBuf> {
    let pd = &engine.process_dirs()[0];
    std::fs::read_dir(pd)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect()
}

/// The claimed tree disappears before the worker gets to it: the sweep finds it absent and
/// is done (nothing failed, nothing retried, the engine settles).
fn a_claimed_tree_gone_before_its_sweep_is_done_with(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    dead_engine(dir.path(), 3);
    let plan = FaultPlan::new(21);
    let take = plan.pause_once(FaultPoint::CleanupTake);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan)).unwrap();
    assert!(take.wait_reached(T), "the sweep is the worker's job");
    let trees = claimed(&engine);
    assert_eq!(trees.len(), 1, "{trees:?}");
    std::fs::remove_dir_all(&trees[0]).unwrap();
    take.release();
    assert!(engine.settle(T), "a sweep of an absent tree never ended");
    let m = engine.metrics();
    assert_eq!(
        (m.orphan_dirs_swept, m.orphan_files_swept, m.delete_failures),
        (0, 0, 0),
        "{m:?}"
    );
    assert_eq!(engine.cleanup_report().sweeps_pending, 0);
    assert_clean(&engine, dir.path());
}

/// Sets or clears the immutable flag of `path` (FS_IOC_SETFLAGS): even root cannot delete in
/// an immutable directory, so a sweep fails for real. Clears it again on drop.
struct Immutable(std::fs::File);

const FS_IMMUTABLE_FL: libc::c_long = 0x10;

impl Immutable {
    fn set(path: &Path) -> Self {
        let f = std::fs::File::open(path).unwrap();
        Self::flag(&f, true);
        Immutable(f)
    }

    fn flag(f: &std::fs::File, on: bool) {
        let mut flags: libc::c_long = 0;
        // SAFETY: FS_IOC_GETFLAGS/SETFLAGS read and write one long through a live pointer.
        unsafe {
            let r = libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags);
            assert_eq!(r, 0, "FS_IOC_GETFLAGS: {}", std::io::Error::last_os_error());
            if on {
                flags |= FS_IMMUTABLE_FL;
            } else {
                flags &= !FS_IMMUTABLE_FL;
            }
            let r = libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags);
            assert_eq!(r, 0, "FS_IOC_SETFLAGS: {}", std::io::Error::last_os_error());
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        Self::flag(&self.0, false);
    }
}

/// A claimed tree whose file cannot be deleted (its directory is immutable: EPERM): the sweep
/// counts a failure and is queued again after the retry delay (still reported pending, the
/// engine not settled); once the directory can be changed again, a retry removes the tree and
/// counts it.
fn a_sweep_that_fails_is_counted_retried_and_then_done(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let task_dir = dead_engine(dir.path(), 1);
    let plan = FaultPlan::new(22);
    let take = plan.pause_once(FaultPoint::CleanupTake);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan)).unwrap();
    assert!(take.wait_reached(T));
    let trees = claimed(&engine);
    assert_eq!(trees.len(), 1, "{trees:?}");
    let moved = trees[0].join(task_dir.file_name().unwrap());
    let lock = Immutable::set(&moved);
    take.release();
    wait_for("two failed attempts", || {
        engine.metrics().delete_failures >= 2
    });
    assert!(
        !engine.settle(Duration::from_millis(50)),
        "a failed sweep is not done"
    );
    assert_eq!(engine.cleanup_report().sweeps_pending, 1);
    let m = engine.metrics();
    assert_eq!((m.orphan_dirs_swept, m.orphan_files_swept), (0, 0), "{m:?}");
    assert_eq!(files_under(&moved).len(), 1, "the file is still there");
    drop(lock);
    engine.retry_cleanup_now();
    assert!(engine.settle(T), "the retried sweep never finished");
    let m = engine.metrics();
    assert_eq!((m.orphan_dirs_swept, m.orphan_files_swept), (1, 1), "{m:?}");
    assert_eq!(engine.cleanup_report().sweeps_pending, 0);
    assert_clean(&engine, dir.path());
}

/// A released state whose file someone else already deleted: the normal delete path finds it
/// absent (ENOENT), which confirms it: the ticket is released there, nothing is counted as a
/// failure and nothing goes to the cleanup worker.
fn a_file_already_gone_at_its_delete_is_confirmed_on_the_spot(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b)).unwrap();
    let task = engine.task("absent").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..3 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    let st = w.finish().unwrap();
    let paths = st.paths();
    assert_eq!(paths.len(), 1);
    std::fs::remove_file(&paths[0]).unwrap();
    drop(st);
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(
        (
            m.files_already_absent,
            m.files_deleted,
            m.delete_failures,
            m.cleanup_released
        ),
        (1, 0, 0, 0),
        "{m:?}"
    );
    task.close();
    assert_clean(&engine, dir.path());
}

/// `Engine::trim_pool` deletes every pooled file through the delete path and says how many.
fn trim_pool_deletes_and_counts_every_pooled_file(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b)).unwrap();
    let task = engine.task("trim").unwrap();
    let states: Vec<_> = (0..3)
        .map(|k| {
            let mut w = task.writer().unwrap();
            w.write(Bytes::from(record(k, 1000))).unwrap();
            w.finish().unwrap()
        })
        .collect();
    drop(states);
    let m = engine.metrics();
    assert_eq!((m.pool_segments, m.tickets_used), (3, 3), "{m:?}");
    assert_eq!(engine.trim_pool(), 3);
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(
        (
            m.pool_segments,
            m.pool_trims,
            m.files_deleted,
            m.tickets_used
        ),
        (0, 3, 3, 0),
        "{m:?}"
    );
    assert_eq!(segment_files(dir.path()), 0);
    assert_eq!(engine.trim_pool(), 0, "nothing left to trim");
    task.close();
    assert_clean(&engine, dir.path());
}

/// The worker's wait after a failed batch is `cleanup_retry_delay` plus a jitter of at most a
/// quarter of it: never less, never much more. The record's delete fails once in the worker;
/// the time from the failure being counted to the record's release is measured.
fn a_failed_record_waits_its_retry_delay_plus_at_most_a_quarter(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(23);
    let delay = Duration::from_secs(2);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .cleanup_batch(1)
            .cleanup_retry_delay(delay)
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("retry").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from(record(0, 1000))).unwrap();
    let st = w.finish().unwrap();
    // The normal delete fails: the name goes to the worker, whose first attempt fails too.
    let hold: Arc<spillring::PauseHandle> = plan.pause_once(FaultPoint::CleanupTake);
    plan.fail_always(FaultPoint::IoUnlink, libc::EIO);
    plan.fail_times(FaultPoint::CleanupUnlink, libc::EIO, 1);
    drop(st);
    assert!(hold.wait_reached(T), "the worker never saw the record");
    hold.release();
    wait_for("the failed attempt", || {
        engine.metrics().cleanup_retries == 1
    });
    let failed_at = Instant::now();
    wait_for("the retry", || engine.metrics().cleanup_released == 1);
    let waited = failed_at.elapsed();
    // The failure is seen a little after it happened (polling every 2 ms), the release a
    // little after it happened: allow 50 ms under, and generous scheduling slack over.
    assert!(
        waited + Duration::from_millis(50) >= delay,
        "retried after {waited:?}, before the delay of {delay:?}"
    );
    assert!(
        waited <= delay + delay / 4 + Duration::from_secs(1),
        "retried after {waited:?}: more than the delay plus a quarter"
    );
    let m = engine.metrics();
    assert_eq!((m.cleanup_retries, m.cleanup_released), (1, 1), "{m:?}");
    plan.clear_all();
    task.close();
    assert_clean(&engine, dir.path());
}

/// A shutdown stops a sweep under way (the worker checks before every unlink): the rest of
/// the tree is left in the process directory, reported as a sweep left, and not counted as a
/// failed delete; the next open sweeps it.
fn a_sweep_stopped_by_shutdown_is_left_for_the_next_open_not_failed(b: BackendKind) {
    const FILES: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    dead_engine(dir.path(), FILES);
    let plan = FaultPlan::new(24);
    let take = plan.pause_once(FaultPoint::CleanupTake);
    // A slow sweep (about 0.4 s for the tree), so that it is surely part way when stopped,
    // however loaded the machine (a fixed 5 ms sleep found it not started under load).
    plan.arm(
        FaultPoint::SweepUnlink,
        spillring::FaultAction::Delay(Duration::from_micros(200)),
        spillring::Trigger::Always,
    );
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    assert!(take.wait_reached(T));
    take.release();
    // Let the sweep start, then stop it part way.
    let started = std::time::Instant::now();
    while plan.reached(FaultPoint::SweepUnlink) < 10 {
        assert!(started.elapsed() < T, "the sweep did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    let report = engine.shutdown(Duration::ZERO);
    let left = files_under(dir.path()).len();
    eprintln!("{left} of {FILES} files left");
    assert!(
        left > 0 && left < FILES,
        "the sweep was not stopped part way ({left} of {FILES} files left): the test proves nothing"
    );
    assert_eq!(report.orphan_sweeps_left, 1, "{report:?}");
    let m = engine.metrics();
    assert_eq!(
        (m.delete_failures, m.orphan_dirs_swept),
        (0, 0),
        "a stopped sweep is not a failure: {m:?}"
    );
    drop(engine);
    let next = open(dir.path(), b);
    let m = assert_clean(&next, dir.path());
    assert_eq!(
        (m.orphan_dirs_swept, m.orphan_files_swept),
        (1, left as u64),
        "{m:?}"
    );
}

/// A file of a dead engine's tree disappears between the sweep's readdir and its unlink (staged
/// with `cleanup::sweep_unlink` as FailAfter(ENOENT): the file goes, the unlink says it was not
/// there): the sweep goes on, nothing is counted failed or retried, and the tree is gone in one
/// pass. (cargo-mutants: `remove_tree`'s NotFound guard -> false survived every other test.)
fn a_file_gone_between_the_sweeps_readdir_and_unlink_is_no_failure(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    dead_engine(dir.path(), 5);
    let plan = FaultPlan::new(22);
    plan.arm(
        FaultPoint::SweepUnlink,
        spillring::FaultAction::FailAfter(libc::ENOENT),
        spillring::Trigger::After { skip: 2, times: 1 },
    );
    let engine = Engine::open(
        cfg(dir.path(), b)
            // A failed sweep would wait an hour for its retry: the test would see it.
            .cleanup_retry_delay(Duration::from_secs(3600))
            .fault_plan(plan.clone()),
    )
    .unwrap();
    assert!(engine.settle(T), "the sweep did not end");
    assert_eq!(
        plan.fired(FaultPoint::SweepUnlink),
        1,
        "the race was staged"
    );
    let m = engine.metrics();
    assert_eq!(m.delete_failures, 0, "{m:?}");
    assert_eq!(engine.cleanup_report().sweeps_pending, 0);
    // Four files unlinked by the sweep, one found gone; the task directory and the tree too.
    assert_eq!((m.orphan_files_swept, m.orphan_dirs_swept), (4, 1), "{m:?}");
    assert_clean(&engine, dir.path());
}

/// The cleanup worker hands a batch of more than 64 retained names to an I/O lane; a shutdown
/// lands while that batch runs (each retried unlink takes 30 ms), so the unlinks not started
/// by its deadline are abandoned: they stay for the next open, and are not delete failures.
/// (cargo-mutants: the worker's `is_abandoned` guard -> true survived every other test.)
fn retries_abandoned_at_shutdown_are_not_counted_as_failures(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(23);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(64 << 10)
            .cleanup_retry_delay(Duration::from_secs(3600))
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("abandoned").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..100u64 {
        w.write(Bytes::from(record(i, 60 << 10))).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 100);
    // Every delete fails, on the normal path and at the worker's first try: 100 retained
    // names, each waiting an hour for its next try.
    plan.fail_always(FaultPoint::IoUnlink, libc::EIO);
    plan.fail_always(FaultPoint::CleanupUnlink, libc::EIO);
    drop((st, task));
    let deadline = Instant::now() + T;
    loop {
        let m = engine.metrics();
        if m.cleanup_pending == 100 && m.deletes_in_flight == 0 && m.cleanup_retries >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "100 retained names: {m:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    let failures = engine.metrics().delete_failures;
    assert!(failures >= 100, "{:?}", engine.metrics());
    plan.clear_all();
    plan.arm(
        FaultPoint::CleanupUnlink,
        spillring::FaultAction::Delay(Duration::from_millis(30)),
        spillring::Trigger::Always,
    );
    engine.retry_cleanup_now();
    wait_for("the retry batch under way", || {
        plan.fired(FaultPoint::CleanupUnlink) >= 2
    });
    let old_dirs = engine.process_dirs();
    let report = engine.shutdown(Duration::from_millis(50));
    assert!(!report.drained, "{report:?}");
    let m = engine.metrics();
    let retried = m.cleanup_released;
    assert!(retried < 100, "the batch ended before the shutdown: {m:?}");
    assert_eq!(
        m.delete_failures, failures,
        "unlinks abandoned at the deadline were counted as failures: {m:?}"
    );
    assert_eq!(report.cleanup_pending, 100 - retried, "{report:?}");
    drop(engine);
    wait_unlocked(&old_dirs);
    let next = open(dir.path(), b);
    let m = assert_clean(&next, dir.path());
    assert_eq!(m.orphan_files_swept, 100 - retried, "{m:?}");
}
