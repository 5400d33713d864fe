//! The codec stage (issue 26, point 2): a writer's blocks are compressed on the codec pool's
//! threads, off the producer's, and written strictly in order. Each test holds a compression
//! at fault point `codec::compress` (the engine's plan) to open the windows the stage makes:
//! the producer goes on meanwhile; a cancel, a drop or a write failure with compressions
//! pending gives their buffers back to the pool, seals and writes nothing after, and deletes
//! every file once; a writer short of buffer budget writes its own queued buffers rather than
//! fail; shutdown keeps its budget and joins the pool's threads.

#[macro_use]
mod common;
use common::*;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use spillring::testing::buffer_stats;
use spillring::{
    BackendKind, Bytes, Compression, Engine, EngineConfig, FaultAction, FaultPlan, FaultPoint,
    Metrics, PauseHandle, SpillError, Trigger,
};

per_backend!(
    compression_runs_off_the_producers_thread_and_blocks_are_written_in_order,
    a_cancel_while_a_compression_is_held_gives_its_buffers_back_and_writes_nothing_after,
    a_writer_dropped_with_compressions_pending_deletes_its_files_once,
    a_write_failure_with_compressions_pending_fails_the_writer,
    a_writer_short_of_buffer_budget_writes_its_queued_buffers_first,
    shutdown_keeps_its_budget_with_a_compression_held_and_joins_the_codec_threads,
);

const T: Duration = Duration::from_secs(20);
const BUF: usize = 64 << 10;

/// Compressible bytes: `record(i, 64)` repeated.
fn compressible(i: u64, len: usize) -> Vec<u8> {
    record(i, 64).into_iter().cycle().take(len).collect()
}

/// `cfg` with Lz4, 64 KiB buffers, 1 MiB segments (a few buffers never fill one) and `plan`.
fn lz4_cfg(
    root: &std::path::Path,
    b: BackendKind,
    plan: &std::sync::Arc<FaultPlan>,
) -> EngineConfig {
    cfg(root, b)
        .io_buffer_size(BUF as u64)
        .segment_size(1 << 20)
        .compression(Compression::Lz4)
        .fault_plan(plan.clone())
}

/// Releases a pause after a while unless the test did first (then a thread held in it, or
/// waiting for it, ends).
struct Watchdog {
    done: mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
}

impl Watchdog {
    fn new(pause: &std::sync::Arc<PauseHandle>, after: Duration) -> Self {
        let (done, watch) = mpsc::channel::<()>();
        let pause = pause.clone();
        let thread = thread::spawn(move || {
            let _ = watch.recv_timeout(after);
            pause.release();
        });
        Watchdog { done, thread }
    }

    /// Releases the pause now.
    fn release(self) {
        let _ = self.done.send(());
        self.thread.join().unwrap();
    }
}

/// What was sealed and written so far.
fn sealed(m: &Metrics) -> (u64, u64, u64) {
    (m.physical_bytes_written, m.blocks_lz4, m.blocks_raw)
}

/// Waits until every staging buffer is back in the pool (the held compression's included).
fn wait_buffers_back(engine: &Engine) {
    wait_for("every staging buffer back in the pool", || {
        buffer_stats(engine).held == 0
    });
}

/// Threads of the codec pool alive in this process (`spillring-codec-N`, whose name the
/// kernel cuts to 15 bytes).
fn codec_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim() == "spillring-codec")
        .count()
}

/// The first buffer's compression is held on a codec thread: the producer writes three more
/// buffers meanwhile (were the compression on its thread, it would sit in the pause until the
/// watchdog's 2 s), and none of them is sealed or written before the first (the later ones
/// compress on the pool's other threads, and wait). Released, everything reads back in order.
fn compression_runs_off_the_producers_thread_and_blocks_are_written_in_order(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(1);
        let engine = Engine::open(lz4_cfg(dir.path(), b, &plan).mode(mode)).unwrap();
        let task = engine.task("offthread").unwrap();
        let pause = plan.pause_once(FaultPoint::CodecCompress);
        let dog = Watchdog::new(&pause, Duration::from_secs(2));
        let mut w = task.writer().unwrap();
        let recs: Vec<Vec<u8>> = (0..4 * BUF as u64 / 1000)
            .map(|i| compressible(i, 1000))
            .collect();
        let t = Instant::now();
        for r in &recs {
            w.write_slice(r).unwrap();
        }
        let took = t.elapsed();
        assert!(pause.wait_reached(T), "{mode:?}: a compression ran");
        assert!(
            took < Duration::from_secs(1),
            "{mode:?}: the producer waited {took:?} for the held compression"
        );
        assert_eq!(
            sealed(&engine.metrics()),
            (0, 0, 0),
            "{mode:?}: a buffer was sealed before the first one"
        );
        dog.release();
        let st = w.finish().unwrap();
        let got: Vec<Bytes> = st.reader().unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(got.len(), recs.len(), "{mode:?}");
        assert!(
            got.iter().zip(&recs).all(|(g, r)| g[..] == r[..]),
            "{mode:?}"
        );
        let m = engine.metrics();
        assert!(m.blocks_lz4 >= 4, "{mode:?}: {m:?}");
        assert_eq!(plan.fired(FaultPoint::CodecCompress), 1);
        drop((got, st));
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// Writes compressible records on a thread until a write fails; the failure comes on the
/// channel, then the thread ends.
fn write_until_it_fails(
    mut w: spillring::SpillWriter,
) -> (thread::JoinHandle<()>, mpsc::Receiver<SpillError>) {
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let mut i = 0;
        let err = loop {
            if let Err(e) = w.write_slice(&compressible(i, 1000)) {
                break e;
            }
            i += 1;
        };
        tx.send(err).unwrap();
    });
    (h, rx)
}

/// A writer blocked on its queue (depth 2) behind a held compression: the scope's cancel
/// wakes it and it returns `Aborted` while the compression is still held. Released, the
/// compressed buffer goes back to the pool: nothing is sealed or written after the cancel,
/// and every file is deleted once.
fn a_cancel_while_a_compression_is_held_gives_its_buffers_back_and_writes_nothing_after(
    b: BackendKind,
) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(2);
    let engine = Engine::open(lz4_cfg(dir.path(), b, &plan).queue_depth(2)).unwrap();
    let fds = fd_count();
    let task = engine.task("cancel").unwrap();
    let pause = plan.pause_once(FaultPoint::CodecCompress);
    let dog = Watchdog::new(&pause, T);
    let (h, rx) = write_until_it_fails(task.writer().unwrap());
    assert!(pause.wait_reached(T));
    // The writer fills the next buffers and waits for the held one.
    thread::sleep(Duration::from_millis(50));
    assert!(rx.try_recv().is_err(), "the writer waits for its queue");
    task.cancel();
    let err = rx.recv_timeout(T).expect("the writer returned while held");
    h.join().unwrap();
    assert!(matches!(err, SpillError::Aborted), "{err}");
    let before = sealed(&engine.metrics());
    assert!(
        buffer_stats(&engine).held > 0,
        "the held compression keeps its buffer until it ends"
    );
    dog.release();
    wait_buffers_back(&engine);
    assert_eq!(
        sealed(&engine.metrics()),
        before,
        "sealed or written after the cancel"
    );
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.files_deleted, m.segments_created);
    assert_eq!(m.files_already_absent, 0, "a file was deleted twice");
    assert_fds_back_to(fds);
}

/// A writer dropped with compressions pending (the first held, the others compressed and
/// queued behind it): its files are deleted once, its buffers come back (the held one when it
/// ends), and nothing of it is sealed or written after the drop.
fn a_writer_dropped_with_compressions_pending_deletes_its_files_once(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(3);
        let engine = Engine::open(lz4_cfg(dir.path(), b, &plan).mode(mode)).unwrap();
        let task = engine.task("drop").unwrap();
        let pause = plan.pause_once(FaultPoint::CodecCompress);
        let dog = Watchdog::new(&pause, T);
        let mut w = task.writer().unwrap();
        for i in 0..3 * BUF as u64 / 1000 {
            w.write_slice(&compressible(i, 1000)).unwrap();
        }
        assert!(pause.wait_reached(T));
        assert_eq!(segment_files(dir.path()), 1);
        drop(w);
        let before = sealed(&engine.metrics());
        assert!(engine.settle(T), "{mode:?}: the deletes ran");
        assert_eq!(segment_files(dir.path()), 0, "{mode:?}: deleted while held");
        dog.release();
        wait_buffers_back(&engine);
        assert_eq!(
            sealed(&engine.metrics()),
            before,
            "{mode:?}: written after the drop"
        );
        let m = assert_clean(&engine, dir.path());
        assert_eq!(m.files_deleted, m.segments_created, "{mode:?}");
        assert_eq!(
            m.files_already_absent, 0,
            "{mode:?}: a file was deleted twice"
        );
    }
}

/// The first write fails (EIO) while the second buffer's compression is held: the writer
/// fails with the write's error at its next flush, without waiting for the compression, and
/// deletes its files; the held buffer goes back to the pool when it ends, unwritten. The
/// write is held until the compression is (`PauseThenFail`): failing at once, a loaded
/// machine let the writer see the error before its second buffer reached the codec pool.
fn a_write_failure_with_compressions_pending_fails_the_writer(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(4);
    let engine = Engine::open(lz4_cfg(dir.path(), b, &plan)).unwrap();
    let task = engine.task("fail").unwrap();
    let write = std::sync::Arc::new(PauseHandle::default());
    plan.arm(
        FaultPoint::IoWrite,
        FaultAction::PauseThenFail(write.clone(), libc::EIO),
        Trigger::Times(1),
    );
    let pause = std::sync::Arc::new(PauseHandle::default());
    plan.arm(
        FaultPoint::CodecCompress,
        FaultAction::Pause(pause.clone()),
        Trigger::After { skip: 1, times: 1 },
    );
    let dog = Watchdog::new(&pause, T);
    let write_dog = Watchdog::new(&write, T);
    let (h, rx) = write_until_it_fails(task.writer().unwrap());
    assert!(pause.wait_reached(T), "the second compression is held");
    assert!(write.wait_reached(T), "the first write is held");
    write_dog.release();
    let err = rx.recv_timeout(T).expect("the writer failed while held");
    h.join().unwrap();
    assert!(
        matches!(&err, SpillError::Io { source, .. } if source.raw_os_error() == Some(libc::EIO)),
        "{err:?}"
    );
    assert_eq!(plan.fired(FaultPoint::IoWrite), 1);
    let before = sealed(&engine.metrics());
    dog.release();
    wait_buffers_back(&engine);
    assert_eq!(
        sealed(&engine.metrics()),
        before,
        "written after the failure"
    );
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.files_deleted, m.segments_created);
    assert_eq!(m.write_failures, 1);
}

/// A budget of two buffers: the writer's first buffer is queued behind a held compression and
/// the budget has no room for a buffer after the next. Nothing is in flight, so the pool would
/// refuse (`BufferBudgetExhausted`: only a write in flight is sure to come back); the writer
/// first writes its own queued buffers (waiting for the compression), and goes on. Every record
/// reads back.
fn a_writer_short_of_buffer_budget_writes_its_queued_buffers_first(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(5);
        let engine = Engine::open(
            lz4_cfg(dir.path(), b, &plan)
                .mode(mode)
                .max_buffer_memory(2 * BUF as u64),
        )
        .unwrap();
        let task = engine.task("budget").unwrap();
        let pause = plan.pause_once(FaultPoint::CodecCompress);
        let dog = Watchdog::new(&pause, Duration::from_millis(300));
        let mut w = task.writer().unwrap();
        let recs: Vec<Vec<u8>> = (0..6 * BUF as u64 / 1000)
            .map(|i| compressible(i, 1000))
            .collect();
        let t = Instant::now();
        for r in &recs {
            w.write_slice(r).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        }
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{mode:?}: the writer waited for its held compression"
        );
        dog.release();
        assert!(
            plan.fired(FaultPoint::CodecCompress) == 1,
            "{mode:?}: held once"
        );
        let st = w.finish().unwrap();
        let got: Vec<Bytes> = st.reader().unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(got.len(), recs.len(), "{mode:?}");
        assert!(
            got.iter().zip(&recs).all(|(g, r)| g[..] == r[..]),
            "{mode:?}"
        );
        assert!(buffer_stats(&engine).peak <= 2 * BUF, "{mode:?}");
        drop((got, st));
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// Shutdown with a compression held past its budget returns within it (the held job holds a
/// buffer, not a file: the report says drained) and leaves the pool's threads to end with
/// their jobs; without one held, it joins them before it returns (invariant 9).
fn shutdown_keeps_its_budget_with_a_compression_held_and_joins_the_codec_threads(b: BackendKind) {
    for hold in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new(6);
        let engine = Engine::open(lz4_cfg(dir.path(), b, &plan)).unwrap();
        let task = engine.task("shutdown").unwrap();
        let held = hold.then(|| {
            let pause = plan.pause_once(FaultPoint::CodecCompress);
            (pause.clone(), Watchdog::new(&pause, T))
        });
        let mut w = task.writer().unwrap();
        for i in 0..2 * BUF as u64 / 1000 {
            w.write_slice(&compressible(i, 1000)).unwrap();
        }
        if let Some((pause, _)) = &held {
            assert!(pause.wait_reached(T));
        }
        // A thread names itself once it runs: until then it has its parent's name.
        wait_for("the pool's threads to start", || codec_threads() > 0);
        let budget = Duration::from_millis(200);
        let report = engine.shutdown(budget);
        assert!(report.drained, "hold={hold}: {report:?}");
        assert!(
            report.elapsed < budget + Duration::from_millis(500),
            "hold={hold}: {report:?}"
        );
        assert_eq!(segment_files(dir.path()), 0, "hold={hold}");
        match held {
            Some((_, dog)) => {
                assert!(codec_threads() > 0, "the held thread is not joined");
                dog.release();
                wait_for("the codec threads to leave", || codec_threads() == 0);
            }
            None => assert_eq!(codec_threads(), 0, "joined before shutdown returned"),
        }
        assert!(matches!(w.write_slice(b"late"), Err(SpillError::Aborted)));
        drop(w);
        wait_buffers_back(&engine);
    }
}
