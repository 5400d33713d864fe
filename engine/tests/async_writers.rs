//! Writers driven from a multi-threaded tokio runtime: no runtime is imposed by the engine,
//! and the async paths wait for budget without blocking a worker thread.

#[macro_use]
mod common;
use common::*;

use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, FaultPlan, FaultPoint, SpillError};

per_backend!(
    many_async_writers_on_a_multi_thread_runtime,
    cancel_wakes_an_async_writer_waiting_for_budget,
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
