//! Cooperative yielding, on any runtime: a loop of `_async` calls that complete at once (a
//! writer whose records fit its staging buffers, a reader of a segment already mapped) would
//! hold its runtime thread for as long as it runs: a `current_thread` runtime's timers and
//! other tasks wait. Each writer and reader keeps a [`Budget`] of work; an async call that
//! finds it spent returns `Pending` before it does anything (its wake handed to the runtime:
//! [`yield_now`]), as tokio's own resources do with its coop budget (which the engine cannot
//! see: it runs on any runtime).
//!
//! The budget is a time slice, read from the clock only every [`CHECK`] units of work (bytes
//! plus [`CALL`] per call), so a call of a few bytes pays no clock read. A call that returned
//! `Pending` by itself (it waited for a write in flight, a step, a buffer) yielded: the slice
//! starts again.
//!
//! The yield is [`yield_now`]: on a tokio runtime, tokio's own (`tokio::task::yield_now`),
//! whose wake the runtime defers until it has polled its timers and I/O driver. A task that
//! woke itself at once stayed ready, and a `current_thread` runtime with a ready task polls
//! its driver only every 61 task polls (`event_interval`): 60 slices of the loop ran between
//! two timer checks, 2-3 ms on a quiet machine and 6-8 ms when the runtime thread lost its CPU
//! once among them (the yielding bench, issue 24 point 3). Elsewhere it wakes the task at once.

#[cfg(not(loom))]
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Off only for the yielding bench's A/B (`testing::set_cooperative_yield`): on by default.
static YIELDING: AtomicBool = AtomicBool::new(true);

/// Turns cooperative yielding on or off for the whole process (for a bench to compare).
pub(crate) fn set_yielding(on: bool) {
    YIELDING.store(on, Ordering::Relaxed);
}

/// The work an async call may do before it yields. On tokio the runtime polls its timers and
/// I/O at each such yield ([`yield_now`]); a runtime that polls them only now and then between
/// task polls (as tokio's `current_thread` scheduler does every 61 polls while tasks are
/// ready) still gets to them within a couple of milliseconds.
pub(crate) const SLICE: Duration = Duration::from_micros(25);

/// Units of work between two reads of the clock (bytes, plus [`CALL`] per call).
pub(crate) const CHECK: u32 = 32 << 10;

/// What one call costs beyond its bytes.
pub(crate) const CALL: u32 = 256;

/// Returns `Pending` with the task's wake handed to the runtime: on a tokio runtime deferred
/// until its driver (timers, I/O) has been polled (`tokio::task::yield_now`'s first poll),
/// anywhere else the task woken at once.
fn yield_now(cx: &mut Context<'_>) -> Poll<()> {
    #[cfg(not(loom))]
    {
        std::pin::pin!(tokio::task::yield_now()).poll(cx)
    }
    #[cfg(loom)]
    {
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

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

    /// Before an async call does anything: `Pending` ([`yield_now`]) when its slice is
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
        yield_now(cx)
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

    /// A waker that counts its wakes.
    #[cfg(not(loom))]
    struct Count(std::sync::atomic::AtomicUsize);

    #[cfg(not(loom))]
    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[cfg(not(loom))]
    #[test]
    fn on_a_tokio_runtime_a_yield_is_woken_only_after_the_runtime_polled_its_driver() {
        let count = std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let spent = || {
            let mut b = Budget::new();
            b.spend(CHECK as usize);
            b.since = Instant::now() - SLICE * 2;
            b
        };
        let woken = || count.0.load(Ordering::SeqCst);
        // No runtime on this thread: woken at once.
        assert!(
            spent()
                .poll_ready(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(woken(), 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(
                spent()
                    .poll_ready(&mut Context::from_waker(&waker))
                    .is_pending()
            );
            // Not yet: a task woken here would be polled again before the driver.
            assert_eq!(woken(), 1);
            // The runtime parks (polls its driver), then wakes the deferred tasks.
            tokio::task::yield_now().await;
            assert_eq!(woken(), 2);
        });
    }

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
