//! The reaper: threads that close fds and unmap segments off the callers' and ring threads'
//! paths (the final close of a deleted file frees its blocks, which can take tens of ms).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memmap2::Mmap;

use super::FdPermit;
use super::handoff::{Handoff, spawn_consumers, stop_consumers};
use parking_lot::Mutex;

/// Something whose drop may be slow, dropped on the reaper thread.
#[derive(Debug)]
pub(crate) enum Reaped {
    /// An fd, and the permit of the engine's fd bound it counts in (if any), given back once
    /// the fd is closed (fields drop in order).
    Fd(
        #[expect(dead_code, reason = "held only to be closed on the reaper thread")] OwnedFd,
        #[expect(dead_code, reason = "given back after the close")] Option<FdPermit>,
    ),
    Map(#[expect(dead_code, reason = "held only to be unmapped on the reaper thread")] Mmap),
    /// Barrier: see [`FlushGate`].
    Flush(Arc<FlushGate>),
}

/// Items the reaper queue holds before `reap` waits. Each is usually an fd or a map of a
/// file whose blocks are freed when it closes, so this bounds what the engine holds of
/// deleted files.
const REAPER_CAPACITY: usize = 256;

/// Threads closing and unmapping: the final close of a deleted file frees its blocks (tens of
/// ms with online discard), and several run in parallel.
const REAPER_THREADS: usize = 4;

/// Sends slow drops to the reaper thread; drops inline when the thread is gone.
///
/// The queue is a [`Handoff`] (its push takes no lock), not a crossbeam channel, whose send
/// could sleep on the channel's waker mutex in an async caller's poll: a reader dropping a
/// segment's map in `next_record_async` did, in the `async_poll` bench.
#[derive(Debug, Clone)]
pub(crate) struct Reaper {
    tx: Option<Arc<Handoff<Reaped>>>,
    /// Its threads (a flush sends each a gate).
    threads: usize,
    /// One flush at a time: a flush sends one gate per reaper thread, and two interleaved
    /// flushes would leave every thread waiting on a gate that cannot fill.
    flushing: Arc<Mutex<()>>,
}

impl Reaper {
    /// Starts the reaper threads.
    pub(crate) fn start() -> io::Result<(Self, ReaperThread)> {
        let tx = Arc::new(Handoff::<Reaped>::new(
            REAPER_THREADS,
            Some(REAPER_CAPACITY),
        ));
        let joins = spawn_consumers(&tx, "spillring-reaper", reap_one)?;
        Ok((
            Reaper {
                tx: Some(tx.clone()),
                threads: joins.len(),
                flushing: Arc::default(),
            },
            ReaperThread {
                tx,
                joins: Mutex::new(joins),
            },
        ))
    }

    /// A reaper with no threads: everything is dropped where it is reaped (unit tests).
    #[cfg(test)]
    pub(crate) fn inline() -> Self {
        Reaper {
            tx: None,
            threads: 0,
            flushing: Arc::default(),
        }
    }

    /// Hands `item` to the reaper threads. Waits while [`REAPER_CAPACITY`] items are queued
    /// (back-pressure, so the fds of deleted files the engine holds stay bounded); drops it
    /// here if the reapers are gone.
    pub(crate) fn reap(&self, item: Reaped) {
        if let Some(tx) = &self.tx
            && let Err(item) = tx.push(item, None)
        {
            drop(item);
        }
    }

    /// Waits (up to 10 s) until everything reaped before this call was dropped.
    pub(crate) fn flush(&self) {
        self.flush_until(Instant::now() + FLUSH_LIMIT);
    }

    /// Waits until everything reaped before this call was dropped, or until `deadline`; true
    /// if everything was.
    pub(crate) fn flush_until(&self, deadline: Instant) -> bool {
        let Some(tx) = &self.tx else { return true };
        let Some(_one_at_a_time) = self.flushing.try_lock_until(deadline) else {
            return false;
        };
        let gate = Arc::new(FlushGate {
            left: Mutex::new(self.threads),
            cv: parking_lot::Condvar::new(),
            deadline,
        });
        for _ in 0..self.threads {
            if tx
                .push(Reaped::Flush(gate.clone()), Some(deadline))
                .is_err()
            {
                // Gone, or full until the deadline: the gates sent so far expire at it.
                return false;
            }
        }
        gate.wait()
    }
}

/// A flush barrier: every reaper thread (and the flusher) waits until all threads reached it,
/// so everything queued before it was dropped. Waits are bounded, so a reaper that is gone
/// cannot hang anyone.
#[derive(Debug)]
pub(crate) struct FlushGate {
    left: Mutex<usize>,
    cv: parking_lot::Condvar,
    /// Nobody waits at the gate past this.
    deadline: Instant,
}

/// Longest a plain [`Reaper::flush`] waits.
const FLUSH_LIMIT: Duration = Duration::from_secs(10);

impl FlushGate {
    fn arrive(&self) {
        let mut left = self.left.lock();
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until every thread arrived (true) or the gate's deadline passed (false).
    fn wait(&self) -> bool {
        let mut left = self.left.lock();
        while *left > 0 {
            if self.cv.wait_until(&mut left, self.deadline).timed_out() {
                return *left == 0;
            }
        }
        true
    }
}

/// A reaper thread's work on one item. (The last thread to leave closes the queue: later
/// reaps drop where they are made.)
fn reap_one(m: Reaped) {
    match m {
        Reaped::Flush(gate) => {
            gate.arrive();
            let _ = gate.wait();
        }
        other => drop(other),
    }
}

/// The reaper threads' stop handle.
#[derive(Debug)]
pub(crate) struct ReaperThread {
    tx: Arc<Handoff<Reaped>>,
    joins: Mutex<Vec<JoinHandle<()>>>,
}

impl ReaperThread {
    /// Stops the reaper threads once they dropped what was queued before this call, waiting
    /// for them until `deadline`: threads still closing files then are left to finish on
    /// their own (detached). Later reaps are dropped on the thread that makes them.
    pub(crate) fn stop(&self, deadline: Instant) {
        stop_consumers(&self.tx, std::mem::take(&mut *self.joins.lock()), deadline);
    }
}

impl Drop for ReaperThread {
    /// A handle dropped without [`ReaperThread::stop`] still lets its threads go once they
    /// drained the queue (they hold the queue themselves, so nothing else would end them).
    fn drop(&mut self) {
        self.tx.close();
        self.tx.wake_all();
    }
}
