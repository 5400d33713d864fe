//! The first error wins (invariant 7 in ARCHITECTURE.md) and failed deletes keep their tickets
//! (invariant 3), through the fault plan, on both backends.

#[macro_use]
mod common;
use common::*;

use std::time::Duration;

use spillring::{
    BackendKind, Bytes, Engine, FaultAction, FaultPlan, FaultPoint, SpillError, Trigger,
};

per_backend!(
    write_failure_whose_cleanup_fails_reports_the_write_error,
    ambiguous_delete_is_retried_and_found_absent,
    create_failure_leaves_nothing,
    a_create_whose_outcome_is_unknown_keeps_its_ticket_until_settled,
);

fn write_failure_whose_cleanup_fails_reports_the_write_error(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(5);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    let fds = fd_count();
    // The 3rd write fails; every delete fails too (on the normal path and in the worker).
    let task = engine.task("primary").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..2 {
        w.write(Bytes::from(record(i, 64 << 10))).unwrap();
    }
    plan.fail_times(FaultPoint::IoWrite, libc::EIO, 1);
    plan.fail_always(FaultPoint::IoUnlink, libc::EIO);
    plan.fail_always(FaultPoint::CleanupUnlink, libc::EIO);
    let mut err = None;
    for i in 2..200 {
        if let Err(e) = w.write(Bytes::from(record(i, 64 << 10))) {
            err = Some(e);
            break;
        }
    }
    let err = match err {
        Some(e) => e,
        None => w.finish().map(|_| ()).unwrap_err(),
    };
    match &err {
        SpillError::Io { op, source, .. } => {
            assert_eq!(*op, "write", "the caller gets the write's error: {err}");
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("want the write's Io error, got {other}"),
    }
    // The failed cleanup went to metrics and the cleanup worker, keeping its tickets.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while engine.metrics().deletes_in_flight > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "deletes still in flight after 5 s: {:?}",
            engine.metrics()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let m = engine.metrics();
    assert!(m.write_failures >= 1, "{m:?}");
    assert!(m.delete_failures >= 1, "{m:?}");
    assert!(m.cleanup_pending >= 1, "{m:?}");
    assert_eq!(
        m.tickets_used, m.cleanup_pending,
        "retained names keep their tickets"
    );
    assert!(
        !files_under(dir.path()).is_empty(),
        "the undeletable files are still there"
    );
    let report = engine.cleanup_report();
    assert_eq!(report.pending, m.cleanup_pending);
    assert!(!report.examples.is_empty());
    // Storage recovers: the worker deletes them and capacity returns.
    plan.clear_all();
    engine.retry_cleanup_now();
    drop(task);
    let m = assert_clean(&engine, dir.path());
    assert!(m.cleanup_released >= 1);
    assert_fds_back_to(fds);
}

fn ambiguous_delete_is_retried_and_found_absent(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(6);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    let task = engine.task("ambiguous").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..50 {
        w.write(Bytes::from(record(i, 20_000))).unwrap();
    }
    let st = w.finish().unwrap();
    let n = st.segments() as u64;
    // The unlinks happen, but report EIO: their outcome is unknown to the engine.
    plan.arm(
        FaultPoint::IoUnlink,
        FaultAction::FailAfter(libc::EIO),
        Trigger::Always,
    );
    drop(st);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while engine.metrics().cleanup_released < n {
        assert!(
            std::time::Instant::now() < deadline,
            "the cleanup worker released fewer than {n} names in 5 s: {:?}",
            engine.metrics()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let m = engine.metrics();
    assert_eq!(m.delete_failures, n, "{m:?}");
    // The worker's retry finds each file absent: confirmed, tickets released once.
    assert_eq!(m.cleanup_released, n, "{m:?}");
    plan.clear_all();
    task.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.files_deleted, 0);
}

fn create_failure_leaves_nothing(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(7);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .fault_plan(plan.clone())
            .segment_size(64 << 10),
    )
    .unwrap();
    let task = engine.task("create").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..100 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    plan.fail_times(FaultPoint::WriterCreate, libc::EACCES, 1);
    let err = (100..1000)
        .find_map(|i| w.write(Bytes::from(record(i, 1000))).err())
        .unwrap();
    match &err {
        SpillError::Io { op, source, .. } => {
            assert_eq!(
                (*op, source.raw_os_error()),
                ("create", Some(libc::EACCES)),
                "{err}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(matches!(
        w.write(Bytes::from_static(b"x")),
        Err(SpillError::WriterFailed)
    ));
    drop(w);
    task.close();
    assert_clean(&engine, dir.path());
}

fn a_create_whose_outcome_is_unknown_keeps_its_ticket_until_settled(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(8);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    let task = engine.task("ambiguous-create").unwrap();
    let mut w = task.writer().unwrap();
    // The create happens, then reports EIO: the file exists, the writer cannot know.
    plan.arm(
        FaultPoint::WriterCreate,
        FaultAction::FailAfter(libc::EIO),
        Trigger::Times(1),
    );
    let err = w.write(Bytes::from_static(b"x")).unwrap_err();
    assert!(matches!(&err, SpillError::Io { op: "create", .. }), "{err}");
    drop(w);
    task.close();
    // The cleanup worker settles the name; nothing is left and the ticket comes back.
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.cleanup_released, 1, "{m:?}");
}
