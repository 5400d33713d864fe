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
