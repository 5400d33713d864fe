//! The async rule (issue 13, point 2): an `_async` call never makes a blocking syscall on the
//! caller's thread. A rotation (ticket, create or pooled reuse, `fallocate`), `finish_async`'s
//! trims and a reader's open/map/first touch run on the engine's offload pool; the future
//! awaits them. Also: what a dropped future or a cancel leaves while that work is under way.

#[macro_use]
mod common;
use common::*;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, FaultPlan, FaultPoint, SpillError, WriteMode};

const T: Duration = Duration::from_secs(10);

per_backend!(
    a_rotation_never_runs_on_the_callers_thread,
    a_dropped_write_future_mid_rotation_leaves_no_file,
    a_writer_dropped_while_its_rotation_runs_leaves_no_file,
    cancel_during_an_offloaded_create,
    async_calls_read_back_everything_on_a_current_thread_runtime,
    finish_async_trims_direct_mode_allocations,
    next_record_async_reads_ahead_and_a_dropped_reader_leaves_nothing,
    record_async_slots_round_trip,
    a_fresh_staging_buffer_is_mapped_off_the_callers_thread,
    a_failed_buffer_map_fails_the_write_and_leaves_nothing,
    settle_waits_for_a_dropped_futures_rotation_to_delete_its_file,
    shutdown_waits_for_an_offloaded_rotation_within_its_budget,
);

fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    f.poll(&mut cx)
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// While the segment create is held (paused) on whatever thread runs it, the runtime's only
/// thread keeps running other tasks: the create is not on it. On a tree that creates in the
/// poll, the runtime thread itself sits in the pause, nothing else runs, and only the
/// watchdog's release (after 1 s) ends it: the test fails.
/// The same for a reader's open (`next_record_async`): a paused open holds an offload thread,
/// not the runtime's.
fn a_rotation_never_runs_on_the_callers_thread(b: BackendKind) {
    for (mode, point) in [
        (WriteMode::Buffered, FaultPoint::WriterCreate),
        (WriteMode::Direct, FaultPoint::WriterCreate),
        (WriteMode::Direct, FaultPoint::ReaderOpen),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(1);
        let engine = Engine::open(cfg(dir.path(), b).mode(mode).fault_plan(plan.clone())).unwrap();
        let pause = plan.pause_once(point);
        let by_watchdog = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let (pause, by_watchdog) = (pause.clone(), by_watchdog.clone());
            std::thread::spawn(move || {
                assert!(pause.wait_reached(T), "the create never ran");
                std::thread::sleep(Duration::from_secs(1));
                by_watchdog.store(true, Ordering::SeqCst);
                pause.release();
            })
        };
        let rt = current_thread();
        let task = engine.task("offload").unwrap();
        let t2 = task.clone();
        let (released_by_runtime, n) = rt.block_on(async move {
            let writer = tokio::spawn(async move {
                let mut w = t2.writer().unwrap();
                for i in 0..8 {
                    w.write_async(Bytes::from(record(i, 100_000))).await?;
                }
                let st = w.finish_async().await?;
                let mut r = st.reader()?;
                let mut n = 0u64;
                while let Some(rec) = r.next_record_async().await? {
                    assert_eq!(&rec[..], &record(n, 100_000)[..]);
                    n += 1;
                }
                Ok::<_, SpillError>(n)
            });
            // This task runs on the same (only) runtime thread as the writer.
            while !pause.is_reached() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mine = !by_watchdog.load(Ordering::SeqCst);
            pause.release();
            (mine, writer.await.unwrap())
        });
        watchdog.join().unwrap();
        assert!(
            released_by_runtime,
            "{mode:?} {point:?}: the runtime thread was stuck while the engine's thread was paused"
        );
        assert_eq!(n.unwrap(), 8);
        drop(task);
        assert_clean(&engine, dir.path());
    }
}

/// A `write_async` future dropped while its rotation is paused on the offload pool: the
/// rotation ends there and records its file; the writer, poisoned, says so on its next call
/// and deletes everything once.
fn a_dropped_write_future_mid_rotation_leaves_no_file(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(2);
        let engine = Engine::open(cfg(dir.path(), b).mode(mode).fault_plan(plan.clone())).unwrap();
        let task = engine.task("dropped").unwrap();
        let mut w = task.writer().unwrap();
        let pause = plan.pause_once(FaultPoint::WriterCreate);
        {
            let fut = pin!(w.write_async(Bytes::from(record(0, 1000))));
            assert!(
                poll_once(fut).is_pending(),
                "the rotation must be offloaded"
            );
            assert!(pause.wait_reached(T));
        }
        pause.release();
        // The rotation finishes on its own and records the file.
        assert!(wait_until(|| segment_files(dir.path()) == 1));
        let err = w.write(Bytes::from(record(1, 1000))).unwrap_err();
        assert!(matches!(err, SpillError::WriteFutureDropped), "{err}");
        drop(w);
        drop(task);
        let m = assert_clean(&engine, dir.path());
        assert_eq!(m.files_deleted, 1, "{mode:?}: deleted once: {m:?}");
    }
}

/// The writer itself is dropped (its files given up) while its rotation is between create
/// and record on the offload pool: the file list refuses the late file and the rotation
/// deletes it. (Without that refusal the file outlives everything.)
fn a_writer_dropped_while_its_rotation_runs_leaves_no_file(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(3);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    let task = engine.task("late").unwrap();
    let mut w = task.writer().unwrap();
    let pause = plan.pause_once(FaultPoint::WriterAfterCreate);
    {
        let fut = pin!(w.write_async(Bytes::from(record(0, 1000))));
        assert!(poll_once(fut).is_pending());
        assert!(pause.wait_reached(T));
    }
    assert_eq!(segment_files(dir.path()), 1, "the file exists, unrecorded");
    drop(w);
    pause.release();
    assert!(
        wait_until(|| segment_files(dir.path()) == 0),
        "the late file was left behind"
    );
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.late_files_deleted, 1, "{m:?}");
    drop(task);
}

/// A cancel while the create runs on the offload pool: the future resolves `Aborted`, the
/// file made after the abort is deleted by the abort check.
fn cancel_during_an_offloaded_create(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(4);
        let engine = Engine::open(cfg(dir.path(), b).mode(mode).fault_plan(plan.clone())).unwrap();
        let task = engine.task("cancel").unwrap();
        let mut w = task.writer().unwrap();
        let pause = plan.pause_once(FaultPoint::WriterCreate);
        let rt = current_thread();
        let t2 = task.clone();
        let err = rt.block_on(async {
            let canceller = tokio::spawn(async move {
                while !pause.is_reached() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                t2.cancel();
                pause.release();
            });
            let r = tokio::time::timeout(T, w.write_async(Bytes::from(record(0, 1000))))
                .await
                .expect("the write never ended");
            canceller.await.unwrap();
            r.unwrap_err()
        });
        assert!(matches!(err, SpillError::Aborted), "{mode:?}: {err}");
        drop(w);
        drop(task);
        let m = assert_clean(&engine, dir.path());
        assert_eq!(m.late_files_deleted, 1, "{mode:?}: {m:?}");
    }
}

/// Many rotations, `finish_async`, `next_record_async`, on one runtime thread: every record
/// comes back, both modes, mapped and `pread` segments.
fn async_calls_read_back_everything_on_a_current_thread_runtime(b: BackendKind) {
    for mode in both_modes() {
        for read_max in [0usize, 1 << 20] {
            let dir = tempfile::tempdir().unwrap();
            let engine = Engine::open(
                cfg(dir.path(), b)
                    .mode(mode)
                    .read_buffer_max(read_max as u64),
            )
            .unwrap();
            let rt = current_thread();
            let n = rt.block_on(async {
                let mut handles = Vec::new();
                for t in 0..4u64 {
                    let engine = engine.clone();
                    handles.push(tokio::spawn(async move {
                        let task = engine.task(&format!("t{t}")).unwrap();
                        let mut w = task.writer().unwrap();
                        let len = |i: u64| ((i * 7919 + t) % 50_000) as usize;
                        for i in 0..60 {
                            w.write_async(Bytes::from(record(t * 1000 + i, len(i))))
                                .await
                                .unwrap();
                        }
                        let st = w.finish_async().await.unwrap();
                        assert!(st.segments() > 3, "several rotations");
                        let mut r = st.reader().unwrap();
                        let mut n = 0;
                        while let Some(rec) = r.next_record_async().await.unwrap() {
                            assert_eq!(&rec[..], &record(t * 1000 + n, len(n))[..]);
                            n += 1;
                        }
                        assert_eq!(r.next_record_async().await.unwrap(), None);
                        drop((r, st));
                        task.close();
                        n
                    }));
                }
                let mut n = 0;
                for h in handles {
                    n += h.await.unwrap();
                }
                n
            });
            assert_eq!(n, 4 * 60, "{mode:?} read_max {read_max}");
            assert_clean(&engine, dir.path());
        }
    }
}

/// Direct mode allocates whole segments up front; `finish_async` gives the tails back (on the
/// offload pool), as `finish` does.
fn finish_async_trims_direct_mode_allocations(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).mode(WriteMode::Direct)).unwrap();
    let task = engine.task("trim").unwrap();
    let rt = current_thread();
    let st = rt.block_on(async {
        let mut w = task.writer().unwrap();
        w.write_async(Bytes::from(record(0, 10_000))).await.unwrap();
        w.finish_async().await.unwrap()
    });
    let files = files_under(dir.path());
    assert_eq!(files.len(), 1);
    let len = std::fs::metadata(&files[0]).unwrap().len();
    assert!(
        len < 64 << 10,
        "the preallocated tail is still there: {len} bytes"
    );
    assert_eq!(
        st.reader().unwrap().next_record().unwrap().unwrap().len(),
        10_000
    );
    drop(st);
    drop(task);
    assert_clean(&engine, dir.path());
}

/// `next_record_async` opens the next segment ahead; a reader dropped while that open is held
/// on the offload pool releases everything once the open ends.
fn next_record_async_reads_ahead_and_a_dropped_reader_leaves_nothing(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(5);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    let task = engine.task("ahead").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..12 {
        w.write(Bytes::from(record(i, 100_000))).unwrap();
    }
    let st = w.finish().unwrap();
    assert!(st.segments() >= 3);
    let mut r = st.reader().unwrap();
    let rt = current_thread();
    // The first record: segment 0 opened, segment 1 opening ahead.
    let first = rt.block_on(r.next_record_async()).unwrap().unwrap();
    assert_eq!(&first[..], &record(0, 100_000)[..]);
    let pause = plan.pause_once(FaultPoint::ReaderOpen);
    // Read on (never waiting) until an open, ahead of the reader or for it, is held.
    let mut n = 1;
    while !pause.is_reached() {
        match poll_once(pin!(r.next_record_async())) {
            Poll::Ready(rec) => {
                let rec = rec.unwrap().expect("the pause is reached before the end");
                assert_eq!(&rec[..], &record(n, 100_000)[..]);
                n += 1;
            }
            Poll::Pending => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert!(n < 12);
    drop(first);
    drop(r);
    drop(st);
    pause.release();
    drop(task);
    assert_clean(&engine, dir.path());
}

/// `record_async` slots, in place and owned, across rotations; committed with `commit_async`.
fn record_async_slots_round_trip(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(cfg(dir.path(), b).mode(mode)).unwrap();
        let task = engine.task("slots").unwrap();
        let rt = current_thread();
        let lens: Vec<usize> = (0..40u64)
            .map(|i| {
                if i % 9 == 4 {
                    100_000
                } else {
                    (i as usize * 3001) % 20_000
                }
            })
            .collect();
        let st = rt.block_on(async {
            let mut w = task.writer().unwrap();
            for (i, &len) in lens.iter().enumerate() {
                let mut slot = w.record_async(len).await.unwrap();
                slot.copy_from_slice(&record(i as u64, len));
                slot.commit_async().await.unwrap();
            }
            w.finish_async().await.unwrap()
        });
        assert!(st.segments() > 2, "{mode:?}");
        let mut r = st.reader().unwrap();
        for (i, &len) in lens.iter().enumerate() {
            let rec = r.next_record().unwrap().unwrap();
            assert_eq!(&rec[..], &record(i as u64, len)[..], "{mode:?} record {i}");
        }
        assert_eq!(r.next_record().unwrap(), None);
        drop((r, st));
        drop(task);
        assert_clean(&engine, dir.path());
    }
}

fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + T;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// An async writer that needs a fresh staging buffer (none free: the others are in flight)
/// maps it on the offload pool, never in its poll: `mmap` takes the process's mmap lock for
/// writing, and the first touch of fresh pages faults (issue 13, point 2; seen in the
/// `async_poll` bench as tokio workers asleep in `mmap` and in page faults of `copy_some`).
/// As in `a_rotation_never_runs_on_the_callers_thread`: with the map paused, the runtime's
/// only thread still runs the task that releases it; on a tree that maps in the poll, that
/// thread sits in the pause and only the watchdog ends it.
fn a_fresh_staging_buffer_is_mapped_off_the_callers_thread(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(3);
        let engine = Engine::open(cfg(dir.path(), b).mode(mode).fault_plan(plan.clone())).unwrap();
        let pause = plan.pause_once(FaultPoint::BufferMap);
        let by_watchdog = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let (pause, by_watchdog) = (pause.clone(), by_watchdog.clone());
            std::thread::spawn(move || {
                assert!(pause.wait_reached(T), "no fresh buffer was ever mapped");
                std::thread::sleep(Duration::from_secs(1));
                by_watchdog.store(true, Ordering::SeqCst);
                pause.release();
            })
        };
        let rt = current_thread();
        let task = engine.task("bufmap").unwrap();
        let t2 = task.clone();
        let (released_by_runtime, n) = rt.block_on(async move {
            let writer = tokio::spawn(async move {
                let mut w = t2.writer().unwrap();
                // 10 KB records, 64 KiB buffers: many flushes, so buffers go in flight and
                // the pool maps more.
                for i in 0..60 {
                    w.write_async(Bytes::from(record(i, 10_000))).await?;
                }
                let st = w.finish_async().await?;
                let mut r = st.reader()?;
                let mut n = 0u64;
                while let Some(rec) = r.next_record_async().await? {
                    assert_eq!(&rec[..], &record(n, 10_000)[..]);
                    n += 1;
                }
                Ok::<_, SpillError>(n)
            });
            while !pause.is_reached() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mine = !by_watchdog.load(Ordering::SeqCst);
            pause.release();
            (mine, writer.await.unwrap())
        });
        watchdog.join().unwrap();
        assert!(
            released_by_runtime,
            "{mode:?}: the runtime thread was stuck while a staging buffer was being mapped"
        );
        assert_eq!(n.unwrap(), 60);
        assert!(plan.fired(FaultPoint::BufferMap) >= 1);
        drop(task);
        assert_clean(&engine, dir.path());
    }
}

/// A staging buffer whose map fails (on the offload pool) fails the async write with an I/O
/// error, and the writer's files are deleted once.
fn a_failed_buffer_map_fails_the_write_and_leaves_nothing(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(4);
        let engine = Engine::open(cfg(dir.path(), b).mode(mode).fault_plan(plan.clone())).unwrap();
        plan.fail_always(FaultPoint::BufferMap, libc::ENOMEM);
        let rt = current_thread();
        let task = engine.task("bufmap-fail").unwrap();
        let t2 = task.clone();
        let err = rt.block_on(async move {
            let mut w = t2.writer().unwrap();
            for i in 0..60 {
                if let Err(e) = w.write_async(Bytes::from(record(i, 10_000))).await {
                    return e;
                }
            }
            panic!("{mode:?}: every write passed though each fresh buffer's map fails");
        });
        match &err {
            SpillError::Io { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOMEM), "{err}")
            }
            other => panic!("{mode:?}: expected the map's I/O error, got {other}"),
        }
        assert!(plan.fired(FaultPoint::BufferMap) >= 1);
        drop(task);
        let m = assert_clean(&engine, dir.path());
        assert!(m.files_deleted >= 1, "{mode:?}: {m:?}");
    }
}

/// A `write_async` future dropped while its rotation sits between the create and the abort
/// check (paused there, on the offload pool): the writer gives its files up at its next call
/// (poisoned), so the rotation, when it goes on, finds its file refused and deletes it itself.
/// `settle` waits for that rotation: before, it looked only at queued deletes, returned while
/// the rotation had not yet queued its own, and `assert_clean` saw the file (the way
/// `a_dropped_write_future_mid_rotation_leaves_no_file` failed once under load: the file
/// appears before the rotation records it).
fn settle_waits_for_a_dropped_futures_rotation_to_delete_its_file(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(5);
        let engine = Engine::open(cfg(dir.path(), b).mode(mode).fault_plan(plan.clone())).unwrap();
        let task = engine.task("dropped-late").unwrap();
        let mut w = task.writer().unwrap();
        let pause = plan.pause_once(FaultPoint::WriterAfterCreate);
        {
            let fut = pin!(w.write_async(Bytes::from(record(0, 1000))));
            assert!(
                poll_once(fut).is_pending(),
                "the rotation must be offloaded"
            );
            assert!(pause.wait_reached(T));
        }
        assert_eq!(segment_files(dir.path()), 1, "created, not yet recorded");
        let err = w.write(Bytes::from(record(1, 1000))).unwrap_err();
        assert!(matches!(err, SpillError::WriteFutureDropped), "{err}");
        drop(w);
        drop(task);
        let releaser = {
            let pause = pause.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                pause.release();
            })
        };
        let m = assert_clean(&engine, dir.path());
        assert_eq!(m.files_deleted, 1, "{mode:?}: deleted once: {m:?}");
        releaser.join().unwrap();
    }
}

/// Issue 25, item 1: `shutdown` waits for offload jobs as `settle` does. A dropped future's
/// rotation paused after its create holds a file the cleanup worker does not know of yet. Before
/// the fix, `shutdown(2 s)` returned `drained: true` at once (only queued deletes were looked
/// at), the rotation then found the cleanup worker stopped, and its file stayed on disk after
/// the engine was dropped. Now: released within the budget, the rotation deletes its file and
/// the report says drained; never released within it, the report says not drained (an open
/// on the root reclaims the file once the job has ended).
fn shutdown_waits_for_an_offloaded_rotation_within_its_budget(b: BackendKind) {
    for (release_after, budget, drained) in [
        (Duration::from_millis(300), Duration::from_secs(2), true),
        (
            Duration::from_millis(600),
            Duration::from_millis(100),
            false,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(6);
        let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
        let task = engine.task("shutdown-mid-rotation").unwrap();
        let mut w = task.writer().unwrap();
        let pause = plan.pause_once(FaultPoint::WriterAfterCreate);
        {
            let fut = pin!(w.write_async(Bytes::from(record(0, 1000))));
            assert!(
                poll_once(fut).is_pending(),
                "the rotation must be offloaded"
            );
            assert!(pause.wait_reached(T));
        }
        assert_eq!(segment_files(dir.path()), 1, "created, not yet recorded");
        drop(w);
        drop(task);
        let releaser = {
            let pause = pause.clone();
            std::thread::spawn(move || {
                std::thread::sleep(release_after);
                pause.release();
            })
        };
        let report = engine.shutdown(budget);
        assert_eq!(report.drained, drained, "{report:?}");
        releaser.join().unwrap();
        drop(engine);
        if drained {
            assert!(report.elapsed >= Duration::from_millis(250), "{report:?}");
            assert_eq!(report.tickets_held, 0, "{report:?}");
            assert_eq!(
                files_under(dir.path()),
                Vec::<std::path::PathBuf>::new(),
                "a drained shutdown left a file"
            );
        } else {
            // What it left, an open on the root reclaims once the job has ended (until then
            // the job holds the old engine's core, and so the lock of its process directory).
            let reclaimed = wait_until(|| {
                let again = Engine::open(cfg(dir.path(), b)).unwrap();
                again.settle(T) && segment_files(dir.path()) == 0
            });
            assert!(reclaimed, "not reclaimed: {:?}", files_under(dir.path()));
        }
    }
}
