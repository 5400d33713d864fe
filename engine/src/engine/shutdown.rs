//! Shutting the engine down: on `Engine::shutdown` or the drop of the last handle, within
//! a budget, and what it reports.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::spill::task::TaskShared;

use super::EngineInner;

impl EngineInner {
    pub(super) fn shutdown(&self, budget: Duration) -> ShutdownReport {
        let start = Instant::now();
        let deadline = start + budget;
        if self.core.begin_shutdown() {
            return self.last_report.lock().clone().unwrap_or_else(|| {
                // The first shutdown is still running: nothing is removed yet.
                let dirs = self.core.store.roots.proc_dirs().len() as u64;
                self.report(start, false, dirs)
            });
        }
        let core = &self.core;
        // From the deadline on, queued I/O fails instead of starting: what is left then is
        // what the kernel already has (a few unlinks per ring, the writes in flight).
        core.io.set_deadline(deadline);
        // Abort what is still open: every task scope closes everything registered.
        let tasks: Vec<Arc<TaskShared>> =
            self.tasks.lock().iter().filter_map(Weak::upgrade).collect();
        for t in tasks {
            t.close(true);
        }
        // The pooled files go the way of every other file, and so do the files of a state
        // released from now on.
        crate::cleanup::close_pool(core);
        // The recycled spares hold the core: they go now, and none is kept from now on.
        core.close_spare_lists();
        // An offload job (an async call's rotation whose future was dropped) may hold a file
        // the cleanup queue does not know of yet: wait for the jobs too, as `Engine::settle`
        // does. A job queues its deletes before it counts itself ended, so this order of the
        // two reads holds (issue 25, item 1: before, this looked only at queued deletes and
        // reported drained while such a job's file stayed on disk).
        let drained = wait_until(deadline, || no_delete_work_left(core));
        // The codec pool runs what is queued (its buffers go back to their writers, which the
        // scopes' close failed, or to the pool) and its threads leave, within the budget.
        core.io.codec().shutdown(deadline);
        // The worker checks this inside its batch and its sweep: it finishes the unlink under
        // way and returns.
        core.store.cleanup.stop();
        if let Some(t) = self.cleanup_thread.lock().take()
            && t.join().is_err()
        {
            tracing::error!("spillring cleanup worker panicked");
        }
        core.io.shutdown();
        // Our process directories go too when nothing is left in them (otherwise the next
        // open, of any engine on the root, sweeps them), and the roots the open created.
        let dirs_left = core.store.roots.remove_dirs();
        // The final closes of deleted files free their blocks: wait for them within the
        // budget (and a short grace, so a prompt shutdown still returns with its fds closed).
        let reaped_by = deadline.max(Instant::now() + REAPER_GRACE);
        core.io.reaper().flush_until(reaped_by);
        self.reaper_thread.stop(reaped_by);
        let report = self.report(start, drained, dirs_left);
        *self.last_report.lock() = Some(report.clone());
        report
    }

    fn report(&self, start: Instant, drained: bool, dirs_left: u64) -> ShutdownReport {
        let core = &self.core;
        ShutdownReport {
            drained,
            elapsed: start.elapsed(),
            cleanup_pending: core.store.cleanup.pending(),
            tickets_held: core.store.ledger.used() as u64,
            directories_left: dirs_left,
            orphan_sweeps_left: core.store.cleanup.sweeps_pending(),
        }
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        let budget = self.core.cfg.shutdown_budget;
        let r = self.shutdown(budget);
        if !r.drained {
            tracing::warn!(
                ?r,
                "spillring engine dropped with cleanup left; the next open sweeps it"
            );
        }
        // The last engine empties the decode pool (issue 25, item 2).
        crate::io::DECODE_POOL.engine_closed();
    }
}

/// How long a shutdown waits for the reaper's closes past an already-spent budget.
const REAPER_GRACE: Duration = Duration::from_millis(20);

/// No offload job running and no delete work outstanding: what `shutdown` and
/// `Engine::settle` wait for. The jobs are read first (a job queues its deletes before it
/// counts itself ended).
pub(super) fn no_delete_work_left(core: &crate::shared::EngineShared) -> bool {
    core.io.offload().busy() == 0 && core.store.cleanup.outstanding() == 0
}

pub(super) fn wait_until(deadline: Instant, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What a shutdown left behind.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ShutdownReport {
    /// True if every offload job (an async call's rotation, which may hold a file), queued
    /// delete and cleanup record finished within the budget: then the engine left no file.
    pub drained: bool,
    /// How long the shutdown took.
    pub elapsed: Duration,
    /// Name-only cleanup records left (their files remain for the next open's sweep).
    pub cleanup_pending: u64,
    /// Tickets still held (files the engine could not confirm deleted).
    pub tickets_held: u64,
    /// This engine's process directories not removed (one that still holds a file stays; the
    /// next open on its root sweeps it).
    pub directories_left: u64,
    /// Directories of dead engines not yet swept (the next open sweeps them).
    pub orphan_sweeps_left: u64,
}
