//! Rotation ahead of need (issue 27, point 1): once a segment is half full, the next one is
//! opened on the offload pool while the writer fills the rest, under the rotation's own rules
//! (ticket first, the abort check after the create, the file in the writer's list); a writer
//! that finishes before it needs the segment gives it back; a cancel at any step of the early
//! rotation leaves nothing, each file deleted once.

#[macro_use]
mod common;
use common::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spillring::{BackendKind, Bytes, Engine, EngineConfig, FaultPlan, FaultPoint, SpillError};

const T: Duration = Duration::from_secs(10);

/// The smallest segment whose writers rotate ahead (`AHEAD_MIN_SEGMENT`).
const SEG: u64 = 8 << 20;
/// Records of 64 KiB: a segment holds a little less than 128 of them.
const REC: usize = 64 << 10;

per_backend!(
    the_next_segment_opens_off_the_producers_thread,
    a_cancel_at_each_step_of_the_early_rotation_leaves_nothing,
    a_writer_that_finishes_first_gives_its_early_segment_back,
    an_early_segment_goes_to_the_pool_when_the_writer_finishes_first,
    a_failed_early_rotation_is_retried_at_need_and_its_error_then_reported,
    a_writer_dropped_while_its_early_rotation_runs_leaves_nothing,
);

fn ahead_cfg(root: &std::path::Path, b: BackendKind, plan: &Arc<FaultPlan>) -> EngineConfig {
    cfg(root, b).segment_size(SEG).fault_plan(plan.clone())
}

/// Writes records `from..to` of `REC` bytes.
fn write_range(w: &mut spillring::SpillWriter, from: u64, to: u64) {
    for i in from..to {
        w.write(Bytes::from(record(i, REC))).unwrap();
    }
}

/// Records of a segment's first half and then some: the early rotation has started.
const HALF: u64 = (SEG / REC as u64) / 2 + 2;

/// The early rotation's create held (paused) on the offload pool: the producer writes the rest
/// of its segment meanwhile (a rotation on its own thread would sit in the pause until the
/// watchdog released it); the next write that needs the segment waits for the rotation, which
/// it then uses (no second rotation at need).
fn the_next_segment_opens_off_the_producers_thread(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(1);
    let engine = Engine::open(ahead_cfg(dir.path(), b, &plan)).unwrap();
    let task = engine.task("ahead").unwrap();
    let mut w = task.writer().unwrap();
    write_range(&mut w, 0, 1);
    let pause = plan.pause_once(FaultPoint::WriterCreate);
    let by_watchdog = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (pause, by_watchdog, written) = (pause.clone(), by_watchdog.clone(), written.clone());
        std::thread::spawn(move || {
            assert!(
                pause.wait_reached(T),
                "the early rotation never created its file"
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            while !written.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if !written.load(Ordering::SeqCst) {
                by_watchdog.store(true, Ordering::SeqCst);
                pause.release();
            }
        })
    };
    // Past half: the early rotation starts and pauses in its create.
    write_range(&mut w, 1, HALF);
    assert!(pause.wait_reached(T));
    // The rest of the segment, while the create is held.
    let full = SEG / REC as u64 - 2;
    write_range(&mut w, HALF, full);
    written.store(true, Ordering::SeqCst);
    assert!(
        !by_watchdog.load(Ordering::SeqCst),
        "the producer waited for the early rotation's create"
    );
    pause.release();
    watchdog.join().unwrap();
    // Into the next segment (and most of a third).
    write_range(&mut w, full, 2 * full + 10);
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 3);
    let m = engine.metrics();
    assert!(m.rotations_ahead >= 1, "{m:?}");
    assert_eq!(
        m.segments_created, 3,
        "no rotation at need beside the early ones: {m:?}"
    );
    let mut r = st.reader().unwrap();
    for i in 0..2 * full + 10 {
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, REC)[..]);
    }
    assert!(r.next_record().unwrap().is_none());
    drop((r, st));
    task.close();
    assert_clean(&engine, dir.path());
}

/// A cancel of the scope while the early rotation is held at its reserve, its create, or
/// between its create and its record: the writer says `Aborted`, and every file (the early
/// one included) is deleted once: no file, no ticket, no late file left.
fn a_cancel_at_each_step_of_the_early_rotation_leaves_nothing(b: BackendKind) {
    for point in [
        FaultPoint::WriterReserve,
        FaultPoint::WriterCreate,
        FaultPoint::WriterAfterCreate,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(2);
        let engine = Engine::open(ahead_cfg(dir.path(), b, &plan)).unwrap();
        let task = engine.task("cancel-ahead").unwrap();
        let mut w = task.writer().unwrap();
        write_range(&mut w, 0, 1);
        let pause = plan.pause_once(point);
        write_range(&mut w, 1, HALF);
        assert!(
            pause.wait_reached(T),
            "{point:?}: the early rotation never got there"
        );
        task.cancel();
        pause.release();
        let err = loop {
            match w.write(Bytes::from(record(0, REC))) {
                Ok(()) => continue,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, SpillError::Aborted), "{point:?}: {err}");
        drop(w);
        assert!(engine.settle(T), "{point:?}");
        let m = assert_clean(&engine, dir.path());
        // A late file (made after the cancel took the list) is deleted by its rotation and
        // counted in both.
        assert_eq!(
            m.files_deleted, m.segments_created,
            "{point:?}: every file created deleted once: {m:?}"
        );
        assert!(m.late_files_deleted <= 1, "{point:?}: {m:?}");
        drop(task);
    }
}

/// A writer that finishes between half a segment and its end: the early segment is not
/// handed to the state (one segment, all records); with the pool off it is deleted at once.
fn a_writer_that_finishes_first_gives_its_early_segment_back(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(3);
        let engine = Engine::open(ahead_cfg(dir.path(), b, &plan).mode(mode)).unwrap();
        let task = engine.task("finish-first").unwrap();
        let mut w = task.writer().unwrap();
        write_range(&mut w, 0, HALF + 4);
        let st = w.finish().unwrap();
        assert_eq!(st.segments(), 1, "{mode:?}");
        assert!(engine.settle(T));
        let m = engine.metrics();
        assert_eq!(
            m.segments_created, 2,
            "{mode:?}: the early segment was made: {m:?}"
        );
        assert_eq!(
            segment_files(dir.path()),
            1,
            "{mode:?}: the early file is gone"
        );
        assert_eq!(m.files_deleted, 1, "{mode:?}: {m:?}");
        let mut r = st.reader().unwrap();
        for i in 0..HALF + 4 {
            assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, REC)[..]);
        }
        assert!(r.next_record().unwrap().is_none());
        drop((r, st));
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// With the segment pool on, the unused early segment goes to the pool, and the next writer
/// takes it from there.
fn an_early_segment_goes_to_the_pool_when_the_writer_finishes_first(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(4);
    let engine = Engine::open(
        pooled_cfg(dir.path(), b)
            .segment_size(SEG)
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("pooled").unwrap();
    let mut w = task.writer().unwrap();
    write_range(&mut w, 0, HALF + 4);
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 1);
    assert_eq!(
        engine.metrics().pool_segments,
        1,
        "the early segment is pooled"
    );
    let mut w2 = task.writer().unwrap();
    write_range(&mut w2, 0, 1);
    assert!(engine.metrics().pool_hits >= 1);
    let st2 = w2.finish().unwrap();
    let mut r = st2.reader().unwrap();
    assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(0, REC)[..]);
    assert!(r.next_record().unwrap().is_none());
    drop((r, st, st2));
    task.close();
    engine.trim_pool();
    assert_clean(&engine, dir.path());
}

/// The early rotation's create fails: the writer goes on and rotates at need, where the
/// create succeeds. When every create fails, the write that needs the segment reports it.
fn a_failed_early_rotation_is_retried_at_need_and_its_error_then_reported(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(5);
    let engine = Engine::open(ahead_cfg(dir.path(), b, &plan)).unwrap();
    let task = engine.task("failed-ahead").unwrap();
    let mut w = task.writer().unwrap();
    write_range(&mut w, 0, 1);
    plan.arm(
        FaultPoint::WriterCreate,
        spillring::FaultAction::Fail(libc::EIO),
        spillring::Trigger::Times(1),
    );
    let full = SEG / REC as u64 - 2;
    write_range(&mut w, 1, full + 4);
    assert_eq!(
        plan.fired(FaultPoint::WriterCreate),
        1,
        "the early create failed"
    );
    assert_eq!(w.segments(), 2, "rotated at need");
    // Every create fails now: the next segment's rotation, at need, says so.
    plan.fail_always(FaultPoint::WriterCreate, libc::EIO);
    let err = (full + 4..3 * full)
        .find_map(|i| w.write(Bytes::from(record(i, REC))).err())
        .expect("a write needs a new segment");
    assert!(err.to_string().contains("create"), "{err}");
    plan.clear_all();
    drop(w);
    assert!(engine.settle(T));
    task.close();
    assert_clean(&engine, dir.path());
}

/// The writer is dropped while its early rotation is held between create and record: the
/// list refuses the late file and the rotation deletes it.
fn a_writer_dropped_while_its_early_rotation_runs_leaves_nothing(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(6);
    let engine = Engine::open(ahead_cfg(dir.path(), b, &plan)).unwrap();
    let task = engine.task("dropped-ahead").unwrap();
    let mut w = task.writer().unwrap();
    write_range(&mut w, 0, 1);
    let pause = plan.pause_once(FaultPoint::WriterAfterCreate);
    write_range(&mut w, 1, HALF);
    assert!(pause.wait_reached(T));
    assert_eq!(
        segment_files(dir.path()),
        2,
        "the early file exists, unrecorded"
    );
    drop(w);
    pause.release();
    assert!(engine.settle(T));
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.late_files_deleted, 1, "{m:?}");
    drop(task);
}
