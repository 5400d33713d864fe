//! Cooperative yielding (`spill/budget.rs`): a loop of `_async` calls that each complete at
//! once holds its runtime thread only for a short slice of work before a call yields
//! (`Pending`, its task woken). On a `current_thread` runtime a second task, which runs only
//! when the runtime gets to poll its other tasks and its driver, must run many times during
//! such a loop; without the budget it ran once at most (at the one segment open, the loop's
//! only natural `Pending`).

#[macro_use]
mod common;
use common::*;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use spillring::{BackendKind, Bytes, Engine};

per_backend!(
    a_read_back_loop_yields_to_the_other_tasks,
    a_write_loop_that_never_waits_yields,
);

const TOTAL: usize = 64 << 20;
const REC: usize = 1024;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `work` on a `current_thread` runtime beside a task that counts its own runs (in the
/// counter `work` is given); returns what `work` returns.
fn runs_beside<F: std::future::Future<Output = u64>>(
    work: impl FnOnce(Arc<AtomicU64>) -> F,
) -> u64 {
    let rt = current_thread();
    rt.block_on(async {
        let (runs, done) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let counter = {
            let (runs, done) = (runs.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::SeqCst) {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                }
            })
        };
        let during = work(runs.clone()).await;
        done.store(true, Ordering::SeqCst);
        counter.await.unwrap();
        during
    })
}

/// 64 MiB in 1 KiB records, one segment (mapped and touched on the offload pool), read back
/// with `next_record_async`: no call waits for anything after the open.
fn a_read_back_loop_yields_to_the_other_tasks(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(128 << 20)).unwrap();
    let task = engine.task("read").unwrap();
    let mut w = task.writer().unwrap();
    let rec = record(1, REC);
    for _ in 0..TOTAL / REC {
        w.write_slice(&rec).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 1);
    let mut r = st.reader().unwrap();
    let mut n = 0;
    // Counted from the first record on: while the segment is opened (mapped, its pages
    // touched) on the offload pool, the runtime is idle and the other task runs freely.
    let (rr, nn) = (&mut r, &mut n);
    let runs = runs_beside(|runs| async move {
        let mut before = 0;
        while let Some(got) = rr.next_record_async().await.unwrap() {
            assert_eq!(got.len(), REC);
            if *nn == 0 {
                before = runs.load(Ordering::SeqCst);
            }
            *nn += 1;
        }
        runs.load(Ordering::SeqCst) - before
    });
    assert_eq!(n, TOTAL / REC);
    assert!(
        runs >= 3,
        "the other task ran {runs} times during the read-back loop"
    );
    drop((r, st));
    task.close();
    assert_clean(&engine, dir.path());
}

/// 40,000 records of 16 bytes with `write_async`, all into the first staging buffer (1 MiB):
/// no call waits for anything after the first (its rotation ran on the offload pool). Each is
/// polled by hand, again after a `Pending`: some must yield. (Without the budget: none.)
fn a_write_loop_that_never_waits_yields(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(16 << 20)
            .io_buffer_size(1 << 20),
    )
    .unwrap();
    let task = engine.task("write").unwrap();
    let rec = Bytes::from(record(2, 16));
    let mut w = task.writer().unwrap();
    current_thread()
        .block_on(w.write_async(rec.clone()))
        .unwrap();
    let (mut yields, t) = (0u64, std::time::Instant::now());
    for _ in 1..40_000 {
        let mut f = std::pin::pin!(w.write_async(rec.clone()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while std::future::Future::poll(f.as_mut(), &mut cx).is_pending() {
            yields += 1;
        }
    }
    let took = t.elapsed();
    assert_eq!(engine.metrics().records_written, 40_000);
    assert!(
        yields >= 3,
        "{yields} yields in 40,000 writes that never waited ({took:?})"
    );
    let st = w.finish().unwrap();
    assert_eq!(st.records(), 40_000);
    drop(st);
    task.close();
    assert_clean(&engine, dir.path());
}
