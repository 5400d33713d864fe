//! Cooperative yielding, on any runtime: a loop of `_async` calls that complete at once (a
//! writer whose records fit its staging buffers, a reader of a segment already mapped) would
//! hold its runtime thread for as long as it runs: a `current_thread` runtime's timers and
//! other tasks wait. Each writer and reader keeps a [`Budget`] of work; an async call that
//! finds it spent wakes its task and returns `Pending` before it does anything, as tokio's own
//! resources do with its coop budget (which the engine cannot see: it runs on any runtime).
//!
//! The budget is a time slice, read from the clock only every [`CHECK`] units of work (bytes
//! plus [`CALL`] per call), so a call of a few bytes pays no clock read. A call that returned
//! `Pending` by itself (it waited for a write in flight, a step, a buffer) yielded: the slice
//! starts again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Off only for the yielding bench's A/B (`testing::set_cooperative_yield`): on by default.
static YIELDING: AtomicBool = AtomicBool::new(true);

/// Turns cooperative yielding on or off for the whole process (for a bench to compare).
pub(crate) fn set_yielding(on: bool) {
    YIELDING.store(on, Ordering::Relaxed);
}

/// The work an async call may do before it yields. A runtime polls its timers and I/O
/// between task polls only now and then (tokio's `current_thread` scheduler every 61 polls),
/// so a slice this short keeps a timer's lateness within a couple of milliseconds.
pub(crate) const SLICE: Duration = Duration::from_micros(25);

/// Units of work between two reads of the clock (bytes, plus [`CALL`] per call).
pub(crate) const CHECK: u32 = 32 << 10;

/// What one call costs beyond its bytes.
pub(crate) const CALL: u32 = 256;

/// A writer's or reader's budget of work (see the module docs).
#[derive(Debug)]
pub(crate) struct Budget {
    /// Units left before the clock is read.
    units: u32,
    /// When the current slice started.
    since: Instant,
}

impl Budget {
    pub(crate) fn new() -> Self {
        Budget {
            units: CHECK,
            since: Instant::now(),
        }
    }

    /// Before an async call does anything: `Pending`, with the task woken, when its slice is
    /// used up (the next poll starts a new one).
    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.units > 0 {
            return Poll::Ready(());
        }
        self.units = CHECK;
        let now = Instant::now();
        if now.duration_since(self.since) < SLICE || !YIELDING.load(Ordering::Relaxed) {
            return Poll::Ready(());
        }
        self.since = now;
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Counts a call that moved `bytes`.
    pub(crate) fn spend(&mut self, bytes: usize) {
        let cost = CALL.saturating_add(u32::try_from(bytes).unwrap_or(u32::MAX));
        self.units = self.units.saturating_sub(cost);
    }

    /// The call returned `Pending` by itself: its task yielded, and the slice starts again.
    pub(crate) fn yielded(&mut self) {
        self.units = CHECK;
        self.since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn a_spent_budget_yields_once_its_slice_is_over_and_a_yield_restarts_it() {
        let mut cx = Context::from_waker(Waker::noop());
        let mut b = Budget::new();
        assert!(b.poll_ready(&mut cx).is_ready());
        // Units spent, but the slice is not over: the clock says go on.
        b.spend(CHECK as usize);
        b.since = Instant::now() + Duration::from_secs(1);
        assert!(b.poll_ready(&mut cx).is_ready());
        // Spent and over: Pending, once.
        b.spend(CHECK as usize);
        b.since = Instant::now() - SLICE * 2;
        assert!(b.poll_ready(&mut cx).is_pending());
        assert!(b.poll_ready(&mut cx).is_ready());
        // A call that waited by itself restarts the slice.
        b.spend(CHECK as usize);
        b.since = Instant::now() - SLICE * 2;
        b.yielded();
        assert!(b.poll_ready(&mut cx).is_ready());
    }
}
