//! Lanes: the bounded channel from submitters to one I/O thread, its wake-up, its close
//! handshake ([`LaneGate`]), and the shutdown deadline after which queued ops fail unstarted.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use crate::sys::errno;

use super::*;

pub(crate) use gate::LaneGate;

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

// The close handshake of a lane, in a module of its own: it uses the loom-checked atomics of
// `crate::sync`, where the lane's statics use `std`'s.
mod gate {
    //! The close handshake of a lane: once an I/O thread decides to leave, no op may be left in its
    //! channel, since nothing would ever complete it (its sink, its buffers and the `Arc`s it holds
    //! would live until the process ends).
    //!
    //! A submitter announces itself (`enter`) before it checks `closed`, and leaves (`Entered`'s
    //! drop) after its send. The closing thread sets `closed`, then drains the channel until no
    //! submitter is inside, then drains once more. Either a submitter sees `closed` and completes
    //! its op itself, or the closer sees it inside and drains its op after it leaves. Both sides use
    //! `SeqCst`, so the two announcements cannot both be missed (the store-load pattern).
    //!
    //! Model-checked with loom (`loom_lane_gate_*` below, see `scripts/loom.sh`).

    use crate::sync::{AtomicBool, AtomicUsize, Ordering, seq_cst_store_load, yield_now};

    /// See the module docs.
    #[derive(Debug, Default)]
    pub(crate) struct LaneGate {
        closed: AtomicBool,
        inside: AtomicUsize,
    }

    /// A submitter inside the gate; leaves on drop.
    pub(crate) struct Entered<'a>(&'a LaneGate);

    impl Drop for Entered<'_> {
        fn drop(&mut self) {
            self.0.inside.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl LaneGate {
        /// Enters to send one op; `None` once the lane is closed (the caller completes the op).
        pub(crate) fn enter(&self) -> Option<Entered<'_>> {
            self.inside.fetch_add(1, Ordering::SeqCst);
            let e = Entered(self);
            seq_cst_store_load();
            if self.closed.load(Ordering::SeqCst) {
                return None; // `e` drops here and leaves
            }
            Some(e)
        }

        /// Closes the lane: after this returns, every op a submitter sent was handed to `drain`,
        /// and every later submitter is refused. `drain` must empty the channel without waiting.
        pub(crate) fn close(&self, mut drain: impl FnMut()) {
            self.closed.store(true, Ordering::SeqCst);
            seq_cst_store_load();
            loop {
                drain();
                if self.inside.load(Ordering::SeqCst) == 0 {
                    break;
                }
                // A submitter is between its check and its send (or waiting for room, which the
                // drain above makes).
                yield_now();
            }
            drain();
        }
    }

    #[cfg(all(test, not(loom)))]
    mod tests {
        use super::*;
        use std::sync::Arc;

        /// Submitters racing a close: every op sent before the close is drained, every later one is
        /// refused, none is left in the channel.
        #[test]
        fn no_op_is_left_in_a_closed_lane() {
            for round in 0..200 {
                let (tx, rx) = crossbeam_channel::bounded::<u32>(4);
                let gate = Arc::new(LaneGate::default());
                let refused = Arc::new(AtomicUsize::new(0));
                let senders: Vec<_> = (0..3)
                    .map(|_| {
                        let (tx, gate, refused) = (tx.clone(), gate.clone(), refused.clone());
                        std::thread::spawn(move || {
                            let mut sent = 0usize;
                            for i in 0..50 {
                                match gate.enter() {
                                    Some(_inside) => {
                                        tx.send(i).unwrap();
                                        sent += 1;
                                    }
                                    None => {
                                        refused.fetch_add(1, Ordering::SeqCst);
                                    }
                                }
                            }
                            sent
                        })
                    })
                    .collect();
                let mut drained = 0usize;
                // Take a few normally, then close while the senders run.
                for _ in 0..(round % 7) {
                    if rx.recv().is_ok() {
                        drained += 1;
                    }
                }
                gate.close(|| {
                    while rx.try_recv().is_ok() {
                        drained += 1;
                    }
                });
                let sent: usize = senders.into_iter().map(|h| h.join().unwrap()).sum();
                assert!(
                    rx.try_recv().is_err(),
                    "round {round}: an op was left in the channel"
                );
                assert_eq!(drained, sent, "round {round}");
                assert_eq!(sent + refused.load(Ordering::SeqCst), 150, "round {round}");
            }
        }
    }

    #[cfg(all(test, loom))]
    mod loom_tests {
        use super::*;
        use crate::sync::Mutex;
        use loom::thread;
        use std::sync::Arc;

        /// What a submitter did with its op.
        #[derive(Debug, PartialEq, Eq)]
        enum Submitted {
            Sent,
            Refused,
        }

        /// Two submitters race the I/O thread's close: an op either is refused (its submitter
        /// completes it) or goes into the channel and is drained by the close. After the close
        /// returns nothing is left in the channel, and every op is accounted exactly once.
        #[test]
        fn loom_lane_gate_leaves_no_op_in_the_channel() {
            loom::model(|| {
                let gate = Arc::new(LaneGate::default());
                // The channel: a mutex-guarded queue stands in for the crossbeam channel.
                let chan = Arc::new(Mutex::new(Vec::<u32>::new()));
                let submitters: Vec<_> = (0..2u32)
                    .map(|i| {
                        let (gate, chan) = (gate.clone(), chan.clone());
                        thread::spawn(move || match gate.enter() {
                            Some(_inside) => {
                                chan.lock().push(i);
                                Submitted::Sent
                            }
                            None => Submitted::Refused,
                        })
                    })
                    .collect();
                let mut drained = Vec::new();
                gate.close(|| drained.append(&mut chan.lock()));
                // Right after the close (submitters may still run): a later submitter is refused.
                assert!(gate.enter().is_none(), "a closed gate let a submitter in");
                let results: Vec<_> = submitters.into_iter().map(|h| h.join().unwrap()).collect();
                assert!(chan.lock().is_empty(), "an op was left in a closed lane");
                let sent = results.iter().filter(|r| **r == Submitted::Sent).count();
                assert_eq!(drained.len(), sent, "every op sent was drained once");
            });
        }
    }
}
