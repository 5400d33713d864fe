//! A blocking `finish` takes back its writer's queued write (a large record's vectored write,
//! buffered mode) and makes it on its own thread when no I/O thread started it: the write is
//! made exactly once, its failure fails the `finish`, and the files end as always. On both
//! backends, with the fault plan holding the I/O thread in the segment header's write so that
//! the large record's write is still queued when `finish` comes.

#[macro_use]
mod common;
use common::*;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spillring::{
    BackendKind, Bytes, Engine, FaultPlan, FaultPoint, PauseHandle, SpillError, SpilledState,
    TaskSpill,
};

per_backend!(
    finish_takes_back_a_queued_write_and_makes_it_once,
    a_taken_back_write_that_fails_fails_the_finish,
    repeated_cycles_read_back_whoever_makes_the_write,
);

const MIB: usize = 1 << 20;

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One writer whose I/O thread is held in its segment header's write, with its 1 MiB record's
/// write queued behind it, and a `finish` on another thread that has made that write itself.
struct Held {
    engine: Engine,
    plan: std::sync::Arc<FaultPlan>,
    pause: std::sync::Arc<PauseHandle>,
    task: TaskSpill,
    rec: Bytes,
    /// `writes_inline` before the `finish`.
    before: u64,
    finishing: JoinHandle<spillring::Result<SpilledState>>,
}

/// Sets up [`Held`] under `dir`; with `fail`, the taken-back write fails with EIO.
fn held_finish(dir: &std::path::Path, b: BackendKind, seed: u64, fail: bool) -> Held {
    let plan = FaultPlan::new(seed);
    let engine = Engine::open(pooled_cfg(dir, b).fault_plan(plan.clone())).unwrap();
    let task = engine.task("claim").unwrap();
    let mut w = task.writer().unwrap();
    let pause = plan.pause_once(FaultPoint::IoWrite);
    let rec = Bytes::from(record(seed, MIB));
    w.write(rec.clone()).unwrap();
    assert!(
        pause.wait_reached(Duration::from_secs(10)),
        "the header's write reached the I/O thread"
    );
    if fail {
        // The next write made fails: the one `finish` takes back (the I/O thread is held).
        plan.fail_times(FaultPoint::IoWrite, libc::EIO, 1);
    }
    let before = engine.metrics().writes_inline;
    let finishing = std::thread::spawn(move || w.finish());
    wait_for("finish to make the queued write", || {
        engine.metrics().writes_inline > before
    });
    Held {
        engine,
        plan,
        pause,
        task,
        rec,
        before,
        finishing,
    }
}

/// The I/O thread is held in the header's write; `finish` (on another thread) makes the
/// record's write itself while it is held, then waits for the header's; every byte reads back.
fn finish_takes_back_a_queued_write_and_makes_it_once(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let h = held_finish(dir.path(), b, 1, false);
    assert!(
        !h.finishing.is_finished(),
        "finish waits for the held header"
    );
    h.pause.release();
    let st = h.finishing.join().unwrap().unwrap();
    assert_eq!(h.engine.metrics().writes_inline, h.before + 1);
    assert_eq!(
        h.plan.fired(FaultPoint::IoWrite),
        1,
        "only the header was held"
    );
    let got: Vec<Bytes> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(got, vec![h.rec]);
    drop((got, st));
    h.task.close();
    assert_clean_and_unmapped(&h.engine, dir.path());
}

/// The write `finish` took back fails: `finish` reports that write's error, and the writer's
/// files are deleted once.
fn a_taken_back_write_that_fails_fails_the_finish(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let h = held_finish(dir.path(), b, 2, true);
    h.pause.release();
    match h.finishing.join().unwrap() {
        Err(SpillError::Io { op, source, .. }) => {
            assert_eq!(op, "write");
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("want the taken-back write's EIO, got {other:?}"),
    }
    h.task.close();
    let m = assert_clean_and_unmapped(&h.engine, dir.path());
    assert_eq!(m.tickets_used, 0);
}
/// Cycles of one large record each, no fault plan: the I/O thread and `finish` race for each
/// queued write, and every cycle reads back its own bytes whoever made it.
fn repeated_cycles_read_back_whoever_makes_the_write(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).segment_size(4 << 20)).unwrap();
    for i in 0..200u64 {
        let task = engine.task("cycle").unwrap();
        let mut w = task.writer().unwrap();
        let rec = Bytes::from(record(i, MIB + (i as usize % 7) * 4096));
        w.write(rec.clone()).unwrap();
        let st = w.finish().unwrap();
        let got: Vec<Bytes> = st.reader().unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(got, vec![rec], "cycle {i}");
    }
    let m = engine.metrics();
    assert!(m.pool_hits > 0, "{m:?}");
    assert_clean_and_unmapped(&engine, dir.path());
}
