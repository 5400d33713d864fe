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

use spillring::{BackendKind, Bytes, Engine, SpilledState, TaskSpill};

per_backend!(
    a_read_back_loop_yields_to_the_other_tasks,
    a_write_loop_that_never_waits_yields,
    a_read_back_loop_lets_the_runtime_poll_its_driver_at_each_yield,
);

const TOTAL: usize = 64 << 20;
const REC: usize = 1024;

/// Another task on the runtime: counts its runs, yielding after each, until `done`.
fn spawn_counter(runs: &Arc<AtomicU64>, done: &Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let (runs, done) = (runs.clone(), done.clone());
    tokio::spawn(async move {
        while !done.load(Ordering::SeqCst) {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
    })
}

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
        let counter = spawn_counter(&runs, &done);
        let during = work(runs.clone()).await;
        done.store(true, Ordering::SeqCst);
        counter.await.unwrap();
        during
    })
}

/// An engine at `dir` and its task `id`, with `TOTAL` bytes of `record(seed, REC)` spilled and
/// finished in one segment: what the read-back loops read.
fn one_segment(
    dir: &std::path::Path,
    b: BackendKind,
    id: &str,
    seed: u64,
) -> (Engine, TaskSpill, SpilledState) {
    let engine = Engine::open(cfg(dir, b).segment_size(128 << 20)).unwrap();
    let task = engine.task(id).unwrap();
    let mut w = task.writer().unwrap();
    let rec = record(seed, REC);
    for _ in 0..TOTAL / REC {
        w.write_slice(&rec).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 1);
    (engine, task, st)
}

/// 64 MiB in 1 KiB records, one segment (mapped and touched on the offload pool), read back
/// with `next_record_async`: no call waits for anything after the open.
fn a_read_back_loop_yields_to_the_other_tasks(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, task, st) = one_segment(dir.path(), b, "read", 1);
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

/// The read-back loop of `a_read_back_loop_yields_to_the_other_tasks` as a spawned task (as
/// the yielding bench runs it), each call's polls counted: every yield must let the runtime
/// poll its driver (timers, I/O). The other task waits with `tokio::task::yield_now`, whose
/// wake tokio defers until it has polled its driver, so it runs once per driver poll. A loop
/// task that woke itself at once stayed ready, and a `current_thread` runtime with a ready
/// task polls its driver only every 61 task polls: the other task ran about once per 60
/// yields (and a 1 ms timer was 2-3 ms late, 6-8 ms with the thread preempted once: the
/// yielding bench).
fn a_read_back_loop_lets_the_runtime_poll_its_driver_at_each_yield(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let (engine, task, st) = one_segment(dir.path(), b, "driver", 3);
    let mut r = st.reader().unwrap();
    let (runs, done) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let (calls, yields, during) = current_thread().block_on(async {
        let counter = spawn_counter(&runs, &done);
        let runs2 = runs.clone();
        let reader = tokio::spawn(async move {
            let (mut calls, mut polls, mut before) = (0u64, 0u64, 0u64);
            loop {
                let got = {
                    let mut f = std::pin::pin!(r.next_record_async());
                    std::future::poll_fn(|cx| {
                        if calls > 0 {
                            polls += 1;
                        }
                        f.as_mut().poll(cx)
                    })
                    .await
                    .unwrap()
                };
                let Some(got) = got else { break };
                assert_eq!(got.len(), REC);
                if calls == 0 {
                    before = runs2.load(Ordering::SeqCst);
                }
                calls += 1;
            }
            let during = runs2.load(Ordering::SeqCst) - before;
            // From the second call on, and the last (None) call's polls: one per call.
            (calls, polls - calls, during, r)
        });
        let (calls, yields, during, r) = reader.await.unwrap();
        done.store(true, Ordering::SeqCst);
        counter.await.unwrap();
        drop(r);
        (calls, yields, during)
    });
    assert_eq!(calls, (TOTAL / REC) as u64);
    assert!(yields >= 10, "{yields} yields in {calls} calls");
    assert!(
        during * 2 >= yields,
        "the runtime polled its driver {during} times in {yields} yields of the loop"
    );
    drop(st);
    task.close();
    assert_clean(&engine, dir.path());
}
