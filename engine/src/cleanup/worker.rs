//! The cleanup worker: one thread that owns the name-only records of deletes not confirmed and
//! the orphan sweeps. It deletes in batches; after each batch exactly the confirmed names
//! release their tickets (invariant 4); the failed ones rotate to the back of the queue, and the
//! worker waits `cleanup_retry_delay` (plus jitter) only after a failure.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::Unlinked;
use crate::fault::FaultPoint;
use crate::io::{NameBuf, Op, OpKind, OpSink};
use crate::metrics::Counters;
use crate::shared::EngineShared;
use crate::store::ledger::RetainedTicket;
use crate::store::queue::{Record, Work};
use crate::sync;
use crate::sys::errno;

/// Collects the outcomes of one worker batch, completed on I/O threads (or inline) while the
/// worker waits: the worker sees every outcome, each exactly where its name is, before it
/// releases exactly the confirmed names (invariant 4; modelled by
/// `loom_worker_batch_sees_every_outcome`). Its lock and condvar come from the `sync` shim.
struct WorkerBatch {
    results: sync::Mutex<Vec<Option<io::Result<usize>>>>,
    left: sync::Mutex<usize>,
    cv: sync::Condvar,
}

impl WorkerBatch {
    fn new(n: usize) -> Self {
        WorkerBatch {
            results: sync::Mutex::new((0..n).map(|_| None).collect()),
            left: sync::Mutex::new(n),
            cv: sync::Condvar::new(),
        }
    }

    /// Waits until every name of the batch arrived; returns the outcomes, in batch order
    /// (`None`: not attempted).
    fn wait(&self) -> Vec<Option<io::Result<usize>>> {
        {
            let mut left = self.left.lock();
            while *left > 0 {
                self.cv.wait(&mut left);
            }
        }
        std::mem::take(&mut *self.results.lock())
    }

    /// Counts one record as done: completed, or not attempted (its result stays `None`).
    fn arrived(&self) {
        let mut left = self.left.lock();
        *left -= 1;
        if *left == 0 {
            self.cv.notify_all();
        }
    }
}

impl OpSink for WorkerBatch {
    fn complete(&self, token: u64, res: io::Result<usize>) {
        if let Some(slot) = self.results.lock().get_mut(token as usize) {
            *slot = Some(res);
        }
        self.arrived();
    }
}

/// The cleanup worker: runs until [`CleanupQueue::stop`](crate::store::queue::CleanupQueue::stop).
pub(crate) fn worker_loop(core: Arc<EngineShared>) {
    let cl = &core.store.cleanup;
    let take = || {
        let _ = crate::fault::check(&core.fault, FaultPoint::CleanupTake);
    };
    let take: Option<&dyn Fn()> = (crate::fault::ENABLED && core.fault.is_some()).then_some(&take);
    let mut rescan_at = Instant::now() + core.cfg.orphan_rescan;
    while let Some(work) = cl.next_work_until(core.cfg.cleanup_batch, take, Some(rescan_at)) {
        match work {
            Work::Tick => {
                super::sweep::claim_dead_engines(&core);
                rescan_at = Instant::now() + core.cfg.orphan_rescan;
            }
            Work::Records(batch) => retry(&core, batch),
            Work::Sweep(path) => super::sweep::delete_tree(&core, &path),
        }
    }
}

/// `Engine::retry_cleanup_now`: the delay is off; while the worker waits and at most
/// [`INLINE_BATCH`] records are queued, the caller deletes a batch of them itself (it asked for
/// now: no thread wake-up, done when it returns), and the worker is woken for the rest.
pub(crate) fn retry_now(core: &Arc<EngineShared>) {
    let cl = &core.store.cleanup;
    let batch = cl.take_while_idle(INLINE_BATCH, core.cfg.cleanup_batch);
    cl.retry_now();
    if !batch.is_empty() {
        retry(core, batch);
    }
}

/// Deletes a batch and puts the failed records back, to wait `cleanup_retry_delay` plus a
/// jitter of up to 25% (the clock's nanoseconds: engines that share a device retry apart).
fn retry(core: &Arc<EngineShared>, batch: Vec<Record>) {
    let failed = run_batch(core, batch);
    let retry_at = (!failed.is_empty()).then(|| {
        Counters::add(&core.counters.cleanup_retries, failed.len() as u64);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let base = core.cfg.cleanup_retry_delay;
        Instant::now() + base + base.mul_f64(f64::from(nanos % 1000) / 4000.0)
    });
    core.store.cleanup.put_back(&failed, retry_at);
}

/// Batches up to this size run as plain `unlinkat` calls on the thread that runs the batch (the
/// worker's, or `retry_now`'s caller's): [`unlink_here`]; larger ones go to the ring:
/// [`unlink_on_ring`].
const INLINE_BATCH: usize = 64;

/// Deletes one batch of records; returns the ones that failed (whole, in order).
fn run_batch(core: &Arc<EngineShared>, batch: Vec<Record>) -> Vec<Record> {
    let started = std::time::Instant::now();
    let results = if batch.len() <= INLINE_BATCH {
        unlink_here(core, &batch)
    } else {
        unlink_on_ring(core, &batch)
    };
    // One latency per unlink: the batch's start to its end (the worker waits for all).
    let elapsed = started.elapsed();
    let mut failed = Vec::new();
    let mut released = 0;
    for (r, res) in batch.into_iter().zip(results) {
        if res.is_some() {
            core.counters.latency.delete.record(elapsed);
        }
        // Not attempted (the worker or the engine is stopping): back to the queue, not a
        // failure.
        let outcome = res.as_ref().map_or(Unlinked::NotStarted, Unlinked::of);
        match outcome {
            Unlinked::Deleted | Unlinked::Absent => {}
            Unlinked::NotStarted | Unlinked::Failed => {
                if outcome == Unlinked::Failed {
                    Counters::add(&core.counters.delete_failures, 1);
                }
                failed.push(r);
                continue;
            }
        }
        core.store
            .ledger
            .release_retained_on(r.dir as usize, RetainedTicket::from_pages(r.pages));
        released += 1;
    }
    // After the tickets: a record counts as pending until its ticket is back.
    Counters::add(&core.counters.cleanup_released, released);
    core.store.cleanup.records_done(released);
    failed
}

/// The unlink of `r`'s name, completing into `sink` as `token`; `None` when its directory
/// index names no root in use (a record never does).
fn unlink_op(core: &EngineShared, r: &Record, sink: Arc<dyn OpSink>, token: usize) -> Option<Op> {
    let dir = core.store.dir(r.dir as usize)?;
    Some(Op {
        kind: OpKind::Unlink {
            dir: dir.fd.clone(),
            name: NameBuf::segment(r.seg),
            point: FaultPoint::CleanupUnlink,
        },
        sink,
        token: token as u64,
    })
}

/// No such directory: nothing to delete.
fn absent() -> io::Result<usize> {
    Err(io::Error::from_raw_os_error(errno::ENOENT))
}

/// A small batch: plain syscalls on this thread, which cost less than two thread hand-offs
/// through a ring. Each outcome in batch order; `None` for a record not attempted because the
/// worker is stopping (it stays queued).
fn unlink_here(core: &Arc<EngineShared>, batch: &[Record]) -> Vec<Option<io::Result<usize>>> {
    // The ops are run here, never completed: their sink is only a placeholder.
    let sink: Arc<dyn OpSink> = Arc::new(WorkerBatch::new(0));
    let mut results = Vec::with_capacity(batch.len());
    for (i, r) in batch.iter().enumerate() {
        if core.store.cleanup.stopping() {
            results.resize_with(batch.len(), || None);
            break;
        }
        results.push(Some(match unlink_op(core, r, sink.clone(), i) {
            Some(mut op) => core.io.run_inline(&mut op),
            None => absent(),
        }));
    }
    results
}

/// A large batch: queued to the ring, whose io-wq workers unlink in parallel, and waited for.
fn unlink_on_ring(core: &Arc<EngineShared>, batch: &[Record]) -> Vec<Option<io::Result<usize>>> {
    let sink = Arc::new(WorkerBatch::new(batch.len()));
    for (i, r) in batch.iter().enumerate() {
        match unlink_op(core, r, sink.clone(), i) {
            Some(op) => core.io.submit(0, op),
            None => sink.complete(i as u64, absent()),
        }
    }
    sink.wait()
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// Invariant 4's collection step: two names of a batch complete on two I/O threads (one
    /// confirmed, one failed) and a third is not attempted, while the worker waits. In every
    /// interleaving the worker returns only once all three arrived, and sees each outcome at
    /// its own name: so exactly the confirmed name is released.
    #[test]
    fn loom_worker_batch_sees_every_outcome() {
        loom::model(|| {
            let b = std::sync::Arc::new(WorkerBatch::new(3));
            let b1 = b.clone();
            let t1 = thread::spawn(move || b1.complete(0, Ok(0)));
            let b2 = b.clone();
            let t2 = thread::spawn(move || {
                b2.complete(1, Err(io::Error::from_raw_os_error(errno::EIO)))
            });
            b.arrived(); // name 2: not attempted
            let results = b.wait();
            assert!(
                matches!(results[0], Some(Ok(0))),
                "a confirmed outcome was lost"
            );
            assert!(
                matches!(&results[1], Some(Err(e)) if e.raw_os_error() == Some(errno::EIO)),
                "a failure was lost or misplaced"
            );
            assert!(results[2].is_none());
            t1.join().unwrap();
            t2.join().unwrap();
        });
    }
}
