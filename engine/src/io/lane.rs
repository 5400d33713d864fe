//! Lanes: the bounded channel from submitters to one I/O thread, its wake-up, its close
//! handshake ([`LaneGate`]), and the shutdown deadline after which queued ops fail unstarted.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::sys::errno;

use super::*;

/// What a lane's channel carries. An op is moved in whole (about 200 bytes, its staging
/// buffer's deferred copies included): boxing it would allocate per write.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Msg {
    Op(Op),
    Shutdown,
}

/// Wakes an I/O thread that may be asleep.
pub(crate) trait Wake: Send + Sync {
    fn wake(&self);
}

pub(super) struct Lane {
    pub(super) id: usize,
    pub(super) tx: Sender<Msg>,
    pub(super) wake: Arc<dyn Wake>,
    pub(super) gate: Arc<LaneGate>,
}

static LANE_SEQ: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The lane this thread serves, if it is an I/O thread.
    pub(super) static CURRENT_LANE: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    /// Ops an I/O thread submitted to its own full lane (from a completion handler): it cannot
    /// wait for room in a channel only it drains.
    pub(super) static OVERFLOW: std::cell::RefCell<std::collections::VecDeque<Op>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// Marks the calling thread as the I/O thread of lane `id`.
pub(crate) fn enter_lane(id: usize) {
    CURRENT_LANE.with(|c| c.set(id));
}

/// Takes the ops this I/O thread queued to itself.
pub(crate) fn take_overflow(into: &mut impl Extend<Op>) {
    OVERFLOW.with(|o| into.extend(o.borrow_mut().drain(..)));
}

/// A bounded channel for one lane: its slots are allocated once, so queuing an op allocates
/// nothing.
pub(crate) fn lane_channel(capacity: usize) -> LaneChannel {
    let (tx, rx) = crossbeam_channel::bounded(capacity);
    LaneChannel {
        id: LANE_SEQ.fetch_add(1, Ordering::Relaxed),
        tx,
        rx: LaneRx {
            rx,
            gate: Arc::default(),
        },
    }
}

/// Both ends of a lane.
pub(crate) struct LaneChannel {
    pub(super) id: usize,
    pub(super) tx: Sender<Msg>,
    pub(super) rx: LaneRx,
}

/// The I/O thread's end of a lane: its receiver and the gate it closes when it leaves.
pub(crate) struct LaneRx {
    pub rx: Receiver<Msg>,
    pub(super) gate: Arc<LaneGate>,
}

impl LaneRx {
    /// Closes the lane as its thread leaves: every op still queued, or sent by a submitter
    /// that got in before the close, completes with an error (see [`LaneGate`]).
    pub(crate) fn close(&self) {
        self.gate.close(|| fail_remaining(&self.rx));
    }
}

pub(crate) fn shut_down() -> io::Error {
    io::Error::other("spillring engine is shut down")
}

/// What an op that was queued but not started when the shutdown budget ran out reports.
/// (`ECANCELED`: the op never ran, so its effect did not happen.)
pub(crate) fn abandoned() -> io::Error {
    io::Error::from_raw_os_error(errno::ECANCELED)
}

/// True for the error of an op that was never started (see [`abandoned`]).
pub(crate) fn is_abandoned(e: &io::Error) -> bool {
    e.raw_os_error() == Some(errno::ECANCELED)
}

/// The instant after which queued ops are failed instead of started (set by a shutdown), so
/// `shutdown(budget)` waits only for what is already in the kernel.
#[derive(Debug)]
pub(crate) struct Deadline {
    base: Instant,
    /// Nanoseconds after `base`; `u64::MAX` while no shutdown set it.
    at: AtomicU64,
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline {
            base: Instant::now(),
            at: AtomicU64::new(u64::MAX),
        }
    }
}

impl Deadline {
    /// Sets the deadline (the earliest one given wins).
    pub(crate) fn set(&self, at: Instant) {
        let ns = u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1);
        self.at.fetch_min(ns, Ordering::AcqRel);
    }

    /// True once a deadline was set and has passed. One atomic load while none is set.
    #[inline]
    pub(crate) fn passed(&self) -> bool {
        let at = self.at.load(Ordering::Acquire);
        at != u64::MAX && self.base.elapsed().as_nanos() >= u128::from(at)
    }
}

pub(super) struct NoWake;
impl Wake for NoWake {
    fn wake(&self) {}
}

/// Drains a lane after shutdown was requested: anything still queued completes with an error.
pub(crate) fn fail_remaining(rx: &Receiver<Msg>) {
    while let Ok(m) = rx.try_recv() {
        if let Msg::Op(op) = m {
            op.complete(Err(shut_down()));
        }
    }
}
