//! The worker loop: runs ops one after the other until the run ends, on a plain thread (driven
//! by [`block_on`]) or as an async task.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;

use super::ops::Op;
use super::phase::Phase;
use super::{Ctx, Flavor};
use crate::data::Expect;
use crate::stats::{Counters, Hists};

/// A worker's own state: its latency histograms and records kept past their spill's abort.
#[derive(Debug)]
pub struct Worker {
    pub wid: usize,
    pub flavor: Flavor,
    pub hists: Hists,
    /// Records read before a cancel, kept (zero-copy, pointing into a map of a file since
    /// deleted) and checked again at the next op.
    pub(super) kept: Vec<(u64, Bytes, Expect)>,
}

/// Runs ops until the run ends; returns the worker's histograms.
pub async fn worker(ctx: Arc<Ctx>, wid: usize, flavor: Flavor) -> Hists {
    let mut wk = Worker {
        wid,
        flavor,
        hists: Hists::default(),
        kept: Vec::new(),
    };
    loop {
        if ctx.done() {
            break;
        }
        let idx = ctx.next_op.fetch_add(1, Ordering::Relaxed);
        if ctx.ops_limit.is_some_and(|n| idx >= n) {
            break;
        }
        let slot = &ctx.slots[wid];
        slot.op.store(idx, Ordering::Relaxed);
        Counters::add(&ctx.stats.c.ops_started, 1);
        Counters::add(
            match flavor {
                Flavor::Thread => &ctx.stats.c.ops_thread,
                Flavor::Async => &ctx.stats.c.ops_async,
            },
            1,
        );
        if let Some(mut op) = Op::new(&ctx, &mut wk, idx) {
            op.run().await;
        }
        slot.set_phase(Phase::Idle);
        Counters::add(&ctx.stats.c.ops_done, 1);
        check_kept(&ctx, &mut wk);
    }
    check_kept(&ctx, &mut wk);
    ctx.slots[wid].set_phase(Phase::Done);
    wk.hists
}

fn check_kept(ctx: &Ctx, wk: &mut Worker) {
    for (op, b, e) in wk.kept.drain(..) {
        Counters::add(&ctx.stats.c.kept_records_checked, 1);
        if let Some(why) = e.mismatch(&b) {
            ctx.violation(
                "data",
                format!(
                    "a record read before the cancel changed after its file was deleted: {why}"
                ),
                format!("op{op} kept record"),
                Some(op),
            );
        }
    }
}

/// Drives a future on this thread (plain-thread workers never return `Pending` except while a
/// control thread runs, and then are woken by nothing but their own blocking calls).
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
