//! Tests prompted by cargo-mutants on the writer's failure paths (`spill/writer/hook.rs`,
//! `rotate.rs`): see results/MUTANTS.md. Invariant 7 (the primary error wins over a cleanup
//! failure) where both meet in one call: a rotation refused by a full ledger whose trim of a
//! pooled file fails.

#[macro_use]
mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, SpillError, SpilledState, TaskSpill};

per_backend!(
    inv7_a_refused_rotation_whose_pool_trim_fails_reports_the_refusal,
    a_pooled_file_found_absent_at_a_trim_releases_its_ticket,
);

const T: Duration = Duration::from_secs(10);

fn spill(task: &TaskSpill, first: u64, n: u64) -> SpilledState {
    let mut w = task.writer().unwrap();
    for i in first..first + n {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    w.finish().unwrap()
}

/// Two roots and a ledger of two tickets: a state on r0 holds one, a released state's file sits
/// in r1's pool with the other. Returns the engine, the task, the live state and the pooled
/// file's path. The next segment goes to r0 (round-robin), whose pool is empty, so it must
/// trim r1's pooled file to get a ticket.
fn full_ledger_with_a_pooled_file(
    r0: &Path,
    r1: &Path,
    b: BackendKind,
) -> (Engine, TaskSpill, SpilledState, PathBuf) {
    let engine = Engine::open(pooled_cfg(r0, b).add_root(r1).ticket_capacity(2)).unwrap();
    let task = engine.task("trim").unwrap();
    let a = spill(&task, 0, 10);
    assert!(a.paths()[0].starts_with(r0), "{:?}", a.paths());
    let p = spill(&task, 100, 10);
    let pooled = p.paths()[0].clone();
    assert!(pooled.starts_with(r1), "{pooled:?}");
    drop(p);
    let m = engine.metrics();
    assert_eq!((m.pool_segments, m.tickets_used), (1, 2), "{m:?}");
    (engine, task, a, pooled)
}

/// Invariant 7 where a cleanup failure and the primary error meet in one call: the rotation's
/// reservation finds the ledger full and trims the pool on the caller's thread (a synchronous
/// unlink); that unlink fails for real (the pooled file's name is now a directory: EISDIR), so
/// the name goes to the cleanup worker with its ticket and the ledger stays full. The caller
/// gets the refusal, `LedgerFull`, never the unlink's error; nothing is lost, and once the
/// storage recovers the worker releases the ticket and the next write goes through.
fn inv7_a_refused_rotation_whose_pool_trim_fails_reports_the_refusal(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let (r0, r1) = (dir.path().join("r0"), dir.path().join("r1"));
    let (engine, task, a, pooled) = full_ledger_with_a_pooled_file(&r0, &r1, b);
    std::fs::remove_file(&pooled).unwrap();
    std::fs::create_dir(&pooled).unwrap();

    let mut w = task.writer().unwrap();
    let err = w.write(Bytes::from(record(200, 1000))).unwrap_err();
    assert!(
        matches!(err, SpillError::LedgerFull { capacity: 2 }),
        "the refusal must win over the failed trim: {err:?}"
    );
    let m = engine.metrics();
    assert_eq!((m.pool_trims, m.pool_segments), (1, 0), "{m:?}");
    // The trim's failure; the worker may have failed its retry already too.
    assert!(m.delete_failures >= 1, "{m:?}");
    assert_eq!(
        m.admission_failures, 2,
        "refused before and after the trim: {m:?}"
    );
    assert_eq!(
        (m.tickets_used, m.cleanup_pending),
        (2, 1),
        "the undeleted name keeps its ticket, with the worker: {m:?}"
    );
    assert!(pooled.is_dir(), "nothing removed what the engine could not");
    drop(w);

    // The storage recovers: the worker finds the name gone and gives the ticket back.
    std::fs::remove_dir(&pooled).unwrap();
    engine.retry_cleanup_now();
    assert!(engine.settle(T), "engine did not settle");
    let m = engine.metrics();
    assert_eq!((m.tickets_used, m.cleanup_pending), (1, 0), "{m:?}");
    let again = spill(&task, 300, 10);
    assert_eq!(again.reader().unwrap().count(), 10);
    drop((a, again));
    task.close();
    assert_clean(&engine, &r0);
    assert_clean(&engine, &r1);
}

/// The same trim finding the pooled file already gone (ENOENT) counts it as deleted: its
/// ticket comes back at once and the rotation goes through.
fn a_pooled_file_found_absent_at_a_trim_releases_its_ticket(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let (r0, r1) = (dir.path().join("r0"), dir.path().join("r1"));
    let (engine, task, a, pooled) = full_ledger_with_a_pooled_file(&r0, &r1, b);
    std::fs::remove_file(&pooled).unwrap();

    let w = spill(&task, 200, 10);
    assert!(w.paths()[0].starts_with(&r0), "{:?}", w.paths());
    let m = engine.metrics();
    assert_eq!(
        (
            m.pool_trims,
            m.files_already_absent,
            m.delete_failures,
            m.cleanup_pending
        ),
        (1, 1, 0, 0),
        "{m:?}"
    );
    assert_eq!((m.tickets_used, m.admission_failures), (2, 1), "{m:?}");
    drop((a, w));
    task.close();
    assert_clean(&engine, &r0);
    assert_clean(&engine, &r1);
}
