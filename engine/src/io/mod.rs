//! How bytes move: the I/O request types, the handle the engine submits through, staging
//! buffers, the reaper that closes files off the callers' threads, the offload pool that
//! runs the blocking steps of `_async` calls, and the codec pool that compresses staging
//! buffers' blocks off the writers' threads.
//!
//! The backends live in [`uring`] (an io_uring ring thread) and [`psync`] (plain syscalls on an
//! I/O thread). Both take the same [`Op`]s over a crossbeam channel and report each one's
//! outcome to its [`OpSink`]. Nothing here knows about tickets, segments or scopes.

mod buf;
mod compress;
mod decode;
mod fdcache;
mod handoff;
#[cfg(loom)]
mod handoff_loom;
mod keptmap;
mod lane;
mod offload;
mod op;
mod psync;
mod readbuf;
mod reaper;
pub(crate) mod uring;

pub(crate) use buf::{BufferPool, IoBuf, Mapping, NoBuffer, OpenBlock, Refused, Taken};
pub(crate) use compress::{Compress, CompressPool, CompressSink};
pub(crate) use decode::{DECODE_POOL, DecodePool};
pub(crate) use fdcache::{CachedFile, FdCache, FdPermit};
pub(crate) use keptmap::{KeptMaps, SharedMap};
pub(crate) use lane::*;
pub(crate) use offload::{Offload, Offloaded};
pub(crate) use op::*;
pub(crate) use readbuf::ReadBufs;
pub(crate) use reaper::{Reaped, Reaper, ReaperThread};

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::Backend;
use crate::fault::FaultPlan;

/// The engine's handle on its I/O threads.
pub(crate) struct IoHandle {
    lanes: Vec<Lane>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
    kind: Backend,
    deadline: Arc<Deadline>,
    pool: Arc<BufferPool>,
    reaper: Reaper,
    fault: Option<Arc<FaultPlan>>,
    fds: Arc<FdCache>,
    maps: Arc<KeptMaps>,
    offload: Offload,
    codec: CompressPool,
}

impl std::fmt::Debug for IoHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoHandle")
            .field("backend", &self.kind)
            .field("lanes", &self.lanes.len())
            .finish()
    }
}

/// What starting a backend needs.
pub(crate) struct IoSetup {
    pub threads: usize,
    pub ring_entries: u32,
    /// Ops a lane's channel holds before senders wait.
    pub channel_capacity: usize,
    pub pool: Arc<BufferPool>,
    pub fault: Option<Arc<FaultPlan>>,
    pub deadline: Arc<Deadline>,
    pub reaper: Reaper,
    /// The bound on segment fds writers hold (`max_open_files`).
    pub max_open_files: usize,
    /// The bound on mapped bytes kept with pooled files (`keptmap.rs`).
    pub max_kept_map_bytes: u64,
    /// Page-cache writes (buffered mode): a ring thread makes them itself with `pwritev`
    /// rather than through io_uring, which cannot make them without blocking and hands each
    /// to an io-wq worker: two more thread wake-ups per write (see `uring/mod.rs`).
    pub page_cache_writes: bool,
}

impl IoHandle {
    /// Starts io_uring ring threads.
    pub(crate) fn start_uring(setup: &IoSetup) -> io::Result<Self> {
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..setup.threads {
            let LaneChannel { id, tx, rx } = lane_channel(setup.channel_capacity);
            let gate = rx.gate.clone();
            let (wake, join) = uring::spawn(i, id, rx, setup)?;
            lanes.push(Lane { id, tx, wake, gate });
            threads.push(join);
        }
        Ok(Self::assemble(lanes, threads, Backend::IoUring, setup))
    }

    /// Starts psync I/O threads.
    pub(crate) fn start_psync(setup: &IoSetup) -> io::Result<Self> {
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..setup.threads {
            let LaneChannel { id, tx, rx } = lane_channel(setup.channel_capacity);
            let gate = rx.gate.clone();
            let join = psync::spawn(i, id, rx, setup.fault.clone(), setup.deadline.clone())?;
            lanes.push(Lane {
                id,
                tx,
                wake: Arc::new(NoWake),
                gate,
            });
            threads.push(join);
        }
        Ok(Self::assemble(lanes, threads, Backend::Psync, setup))
    }

    fn assemble(
        lanes: Vec<Lane>,
        threads: Vec<JoinHandle<()>>,
        kind: Backend,
        setup: &IoSetup,
    ) -> Self {
        IoHandle {
            lanes,
            threads: Mutex::new(threads),
            next: AtomicUsize::new(0),
            kind,
            deadline: setup.deadline.clone(),
            pool: setup.pool.clone(),
            reaper: setup.reaper.clone(),
            fault: setup.fault.clone(),
            fds: FdCache::new(setup.max_open_files),
            maps: Arc::new(KeptMaps::new(setup.max_kept_map_bytes)),
            offload: Offload::new(),
            codec: CompressPool::new(setup.fault.clone()),
        }
    }

    /// The bound on segment fds writers hold, shared by every lane and backend.
    pub(crate) fn fds(&self) -> &Arc<FdCache> {
        &self.fds
    }

    /// The bound on segment maps kept with pooled files (`keptmap.rs`).
    pub(crate) fn kept_maps(&self) -> &Arc<KeptMaps> {
        &self.maps
    }

    /// The staging buffers.
    pub(crate) fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// The pool that runs the blocking steps of `_async` calls off the caller's thread.
    pub(crate) fn offload(&self) -> &Offload {
        &self.offload
    }

    /// The pool that compresses staging buffers' blocks off the writers' threads.
    pub(crate) fn codec(&self) -> &CompressPool {
        &self.codec
    }

    /// The reaper that closes fds off the hot path.
    pub(crate) fn reaper(&self) -> &Reaper {
        &self.reaper
    }

    /// Performs `op` on the calling thread, with the backends' fault points, and returns its
    /// result without completing it (the caller does, or uses the result itself). For work the
    /// caller would wait for anyway: a blocking `finish`'s last write, a small cleanup batch on
    /// the worker's own thread. Two thread hand-offs saved.
    pub(crate) fn run_inline(&self, op: &mut Op) -> io::Result<usize> {
        op.apply_fills();
        psync::perform(op, &self.fault)
    }

    /// From `at` on, queued ops fail with [`abandoned`] instead of starting, and a submit
    /// waiting for room in a full lane gives up.
    pub(crate) fn set_deadline(&self, at: Instant) {
        self.deadline.set(at);
        for lane in &self.lanes {
            lane.wake.wake();
        }
    }

    /// The backend that runs.
    pub(crate) fn kind(&self) -> Backend {
        self.kind
    }

    /// Picks a lane for a new writer (round-robin).
    pub(crate) fn pick_lane(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()
    }

    /// Ops the lanes' channels have room for now, summed over the lanes.
    pub(crate) fn lane_room(&self) -> usize {
        self.lanes
            .iter()
            .map(|l| l.tx.capacity().unwrap_or(usize::MAX) - l.tx.len())
            .sum()
    }

    /// Queues `op` on `lane` if its channel has room now, else gives it back (the caller waits
    /// for room where it may block: [`IoHandle::submit`], on the offload pool for an async
    /// writer). Never sleeps. If the I/O threads are gone (engine shut down), the op completes
    /// at once with an error, on this thread.
    // The op given back is moved, not boxed: a box would allocate on every submit.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_submit(&self, lane: usize, op: Op) -> Result<(), Op> {
        let lane = &self.lanes[lane % self.lanes.len()];
        let Some(_inside) = lane.gate.enter() else {
            // The lane's thread has left: nothing would ever take the op from its channel.
            op.complete(Err(shut_down()));
            return Ok(());
        };
        send_now(lane, op)
    }

    /// Queues `op` on `lane`, waiting for room in a full channel (back-pressure) unless a
    /// shutdown's deadline passes first. If the I/O threads are gone (engine shut down), the
    /// op completes at once with an error, on this thread.
    pub(crate) fn submit(&self, lane: usize, op: Op) {
        let lane = &self.lanes[lane % self.lanes.len()];
        let Some(_inside) = lane.gate.enter() else {
            return op.complete(Err(shut_down()));
        };
        let Err(op) = send_now(lane, op) else { return };
        if CURRENT_LANE.with(|c| c.get()) == lane.id {
            // The lane's own thread, from a completion: it drains this before sleeping.
            OVERFLOW.with(|o| o.borrow_mut().push_back(op));
            return;
        }
        let mut msg = Msg::Op(op);
        loop {
            lane.wake.wake();
            match lane.tx.send_timeout(msg, Duration::from_millis(5)) {
                Ok(()) => return lane.wake.wake(),
                Err(crossbeam_channel::SendTimeoutError::Timeout(m)) => {
                    if self.deadline.passed() {
                        if let Msg::Op(op) = m {
                            op.complete(Err(abandoned()));
                        }
                        return;
                    }
                    msg = m;
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(m)) => {
                    if let Msg::Op(op) = m {
                        op.complete(Err(shut_down()));
                    }
                    return;
                }
            }
        }
    }

    /// Stops the I/O threads and waits for them: they leave once every op is done, started
    /// ops by the kernel, queued ones failed if the deadline (see [`IoHandle::set_deadline`])
    /// passed first.
    pub(crate) fn shutdown(&self) {
        for lane in &self.lanes {
            let _ = lane.tx.send(Msg::Shutdown);
            lane.wake.wake();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            if t.join().is_err() {
                tracing::error!("spillring I/O thread panicked");
            }
        }
    }
}

/// Sends `op` into `lane`'s channel if it has room (the caller is inside the lane's gate);
/// gives it back when the channel is full.
#[allow(clippy::result_large_err)]
fn send_now(lane: &Lane, op: Op) -> Result<(), Op> {
    match lane.tx.try_send(Msg::Op(op)) {
        Ok(()) => {
            lane.wake.wake();
            Ok(())
        }
        Err(crossbeam_channel::TrySendError::Full(Msg::Op(op))) => Err(op),
        // Only an op was sent.
        Err(crossbeam_channel::TrySendError::Full(Msg::Shutdown)) => Ok(()),
        Err(crossbeam_channel::TrySendError::Disconnected(msg)) => {
            if let Msg::Op(op) = msg {
                op.complete(Err(shut_down()));
            }
            Ok(())
        }
    }
}
