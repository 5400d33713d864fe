//! Writers driven from a multi-threaded tokio runtime: no runtime is imposed by the engine,
//! and the async paths wait for budget without blocking a worker thread.

#[macro_use]
mod common;
use common::*;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, FaultPlan, FaultPoint, SpillError};

const T: Duration = Duration::from_secs(10);

per_backend!(
    many_async_writers_on_a_multi_thread_runtime,
    cancel_wakes_an_async_writer_waiting_for_budget,
    a_panicking_waker_does_not_kill_the_io_thread,
);

fn many_async_writers_on_a_multi_thread_runtime(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).queue_depth(2)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let total = rt.block_on(async {
        let mut handles = Vec::new();
        for t in 0..8u64 {
            let engine = engine.clone();
            handles.push(tokio::spawn(async move {
                let task = engine.task(&format!("async-{t}")).unwrap();
                let mut w = task.writer().unwrap();
                for i in 0..300u64 {
                    let len = ((i * 7919 + t * 31) % 40_000) as usize;
                    w.write_async(Bytes::from(record(t * 10_000 + i, len)))
                        .await
                        .unwrap();
                }
                let st = w.finish_async().await.unwrap();
                let mut r = st.reader().unwrap();
                let mut n = 0;
                while let Some(rec) = r.next_record().unwrap() {
                    let len = ((n * 7919 + t * 31) % 40_000) as usize;
                    assert_eq!(&rec[..], &record(t * 10_000 + n, len)[..]);
                    n += 1;
                    tokio::task::yield_now().await;
                }
                drop((r, st));
                task.close();
                n
            }));
        }
        let mut total = 0;
        for h in handles {
            total += h.await.unwrap();
        }
        total
    });
    assert_eq!(total, 8 * 300);
    assert_clean(&engine, dir.path());
}

fn cancel_wakes_an_async_writer_waiting_for_budget(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(9);
    let engine = Engine::open(cfg(dir.path(), b).queue_depth(2).fault_plan(plan.clone())).unwrap();
    let pause = plan.pause_once(FaultPoint::IoWrite);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let task = engine.task("async-cancel").unwrap();
    let t2 = task.clone();
    let err = rt.block_on(async move {
        let writer = tokio::spawn(async move {
            let mut w = t2.writer().unwrap();
            let mut i = 0;
            loop {
                if let Err(e) = w.write_async(Bytes::from(record(i, 64 << 10))).await {
                    return e;
                }
                i += 1;
            }
        });
        // The writer parks on its budget while the I/O thread is stuck; the runtime
        // stays free (this sleep runs on it).
        let p2 = pause.clone();
        assert!(
            tokio::task::spawn_blocking(move || p2.wait_reached(Duration::from_secs(10)))
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!writer.is_finished());
        task.cancel();
        let err = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("cancel did not wake the async writer")
            .unwrap();
        // Only now does the device come back.
        pause.release();
        err
    });
    assert!(matches!(err, SpillError::Aborted), "{err}");
    drop(rt);
    assert_clean(&engine, dir.path());
}

/// A waker that panics when woken, as a buggy host's might.
struct PanickingWaker;
impl std::task::Wake for PanickingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        panic!("host waker panicked");
    }
}

/// Found by reading: a panic in a completion handler on an I/O thread (a host's waker, a debug
/// assertion) killed the thread, dropping its in-flight ops without completing them: every
/// writer of the engine then waited forever. The thread now survives such a panic.
fn a_panicking_waker_does_not_kill_the_io_thread(b: BackendKind) {
    use std::future::Future;
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(41);
    let engine = Engine::open(cfg(dir.path(), b).queue_depth(1).fault_plan(plan.clone())).unwrap();
    let task = engine.task("waker").unwrap();
    let mut w = task.writer().unwrap();
    let pause = plan.pause_once(FaultPoint::IoWrite);
    // A 64 KiB staging buffer: this record fills one, which goes to the I/O thread and stops
    // there (paused): the writer's one in-flight slot is taken.
    w.write(Bytes::from(record(0, 70 << 10))).unwrap();
    assert!(pause.wait_reached(T));
    let waker = std::task::Waker::from(std::sync::Arc::new(PanickingWaker));
    let mut cx = std::task::Context::from_waker(&waker);
    {
        let mut fut = Box::pin(w.write_async(Bytes::from(record(1, 70 << 10))));
        assert!(
            fut.as_mut().poll(&mut cx).is_pending(),
            "the write must wait for the in-flight slot"
        );
        // The write completes on the I/O thread, which wakes the panicking waker.
        pause.release();
        thread::sleep(Duration::from_millis(100));
    }
    drop(w); // poisoned by the dropped future; deletes its files
    // The engine's I/O thread still serves other writers.
    let (tx, rx) = mpsc::channel();
    let t2 = task.clone();
    thread::spawn(move || {
        let r = (|| {
            let mut w2 = t2.writer()?;
            w2.write(Bytes::from(record(2, 200 << 10)))?;
            let s = w2.finish()?;
            let rec = s.reader()?.next_record()?;
            Ok::<_, SpillError>(rec.map(|r| r.len()))
        })();
        let _ = tx.send(r);
    });
    let r = rx
        .recv_timeout(T)
        .expect("the I/O thread died with the panic: a later spill never completed");
    assert_eq!(r.unwrap(), Some(200 << 10));
    drop(task);
    assert_clean(&engine, dir.path());
}
