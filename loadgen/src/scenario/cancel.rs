//! Cancels: from the op's own thread, from a control thread after a short delay, or from a
//! control thread once the writer is paused at a fault point.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spillring::{FaultPlan, FaultPoint};

use super::Flavor;
use super::ops::Op;
use super::phase::Phase;
use crate::data::op_seed;
use crate::stats::Counters;

/// A control thread: cancels from another thread, or waits at a pause point then cancels.
pub(super) enum Ctl<T> {
    Thread(std::thread::JoinHandle<T>),
    Tokio(tokio::task::JoinHandle<T>),
}

fn spawn_ctl<T: Send + 'static>(flavor: Flavor, f: impl FnOnce() -> T + Send + 'static) -> Ctl<T> {
    match flavor {
        Flavor::Thread => Ctl::Thread(std::thread::spawn(f)),
        // The blocking pool, never a runtime worker: a worker may be held at a pause point.
        Flavor::Async => Ctl::Tokio(tokio::task::spawn_blocking(f)),
    }
}

impl<T> Ctl<T> {
    pub(super) async fn join(self) -> Option<T> {
        match self {
            Ctl::Thread(h) => h.join().ok(),
            Ctl::Tokio(h) => h.await.ok(),
        }
    }
}

impl Op<'_> {
    /// Cancels now (this thread) and starts timing abort-to-clean if files exist.
    pub(super) fn cancel_now(&self, files: bool) {
        self.phase(Phase::Cancelling);
        let t0 = Instant::now();
        self.task.cancel();
        if files {
            self.ctx.watch.aborted(self.idx, t0);
        }
    }

    /// Arms a pause of this task's writer at `point` and returns the control thread that
    /// cancels the task once the writer is paused there (or once `done` says the writer got
    /// past without pausing), then releases it. Its result: whether the pause was reached.
    pub(super) fn cancel_at(
        &mut self,
        point: FaultPoint,
        done: Arc<AtomicBool>,
        files: bool,
    ) -> Ctl<bool> {
        let plan = FaultPlan::new(op_seed(self.ctx.seed, self.idx));
        let pause = plan.pause_once(point);
        self.task.set_fault_plan(plan);
        let (task, watch, idx) = (self.task.clone(), self.ctx.watch.clone(), self.idx);
        spawn_ctl(self.flavor(), move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let reached = loop {
                if pause.wait_reached(Duration::from_millis(2)) {
                    break true;
                }
                if done.load(Ordering::Acquire) || Instant::now() > deadline {
                    break false;
                }
            };
            let t0 = Instant::now();
            task.cancel();
            if reached && files {
                watch.aborted(idx, t0);
            }
            pause.release();
            reached
        })
    }

    /// Cancels from a control thread after a short random delay.
    pub(super) fn cancel_soon(&mut self, files: bool) -> Ctl<()> {
        Counters::add(&self.ctx.stats.c.cross_thread_cancels, 1);
        let task = self.task.clone();
        let watch = self.ctx.watch.clone();
        let idx = self.idx;
        let delay = Duration::from_micros(self.rng.below(300));
        spawn_ctl(self.flavor(), move || {
            std::thread::sleep(delay);
            let t0 = Instant::now();
            task.cancel();
            if files {
                watch.aborted(idx, t0);
            }
        })
    }
}
