//! The loom build of the handoff queue (`handoff.rs`): its protocol (a push, then the fence
//! and the swap of an idle flag; a consumer's announce, fence, re-check and park; the last
//! consumer's drain against a push that raced it) runs over loom's atomics and threads, with
//! this stand-in for the crossbeam channel, which loom cannot see into: a queue behind a loom
//! mutex that takes and gives items at once, as the channel's `try_send` and `try_recv` do.
//! The models are at the end (`scripts/loom.sh` runs them).

use crate::sync::Mutex;

/// The consumer's thread handle (`OnceLock` in the normal build; loom has none).
#[derive(Default)]
pub(super) struct ThreadCell(Mutex<Option<loom::thread::Thread>>);

impl ThreadCell {
    pub(super) fn set_current(&self) {
        let mut t = self.0.lock();
        if t.is_none() {
            *t = Some(loom::thread::current());
        }
    }

    pub(super) fn unpark(&self) {
        if let Some(t) = self.0.lock().as_ref() {
            t.unpark();
        }
    }
}

impl std::fmt::Debug for ThreadCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ThreadCell(loom)")
    }
}

/// The channel's API as `handoff.rs` uses it.
pub(super) mod chan {
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::time::Instant;

    use crate::sync::{Mutex, yield_now};

    struct Inner<T> {
        q: Mutex<VecDeque<T>>,
        cap: usize,
    }

    pub(crate) struct Sender<T>(Arc<Inner<T>>);
    pub(crate) struct Receiver<T>(Arc<Inner<T>>);

    pub(crate) enum TrySendError<T> {
        Full(T),
        // Never made: the queue holds both ends, as it does of the channel.
        #[allow(dead_code)]
        Disconnected(T),
    }

    pub(crate) struct SendError<T>(T);

    impl<T> SendError<T> {
        pub(crate) fn into_inner(self) -> T {
            self.0
        }
    }

    pub(crate) fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
        let i = Arc::new(Inner {
            q: Mutex::new(VecDeque::new()),
            cap,
        });
        (Sender(i.clone()), Receiver(i))
    }

    pub(crate) fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
        bounded(usize::MAX)
    }

    impl<T> Sender<T> {
        pub(crate) fn try_send(&self, v: T) -> Result<(), TrySendError<T>> {
            let mut q = self.0.q.lock();
            if q.len() >= self.0.cap {
                return Err(TrySendError::Full(v));
            }
            q.push_back(v);
            Ok(())
        }

        /// Waits for room (a consumer's take), yielding to the model's other threads.
        pub(crate) fn send(&self, mut v: T) -> Result<(), SendError<T>> {
            loop {
                match self.try_send(v) {
                    Ok(()) => return Ok(()),
                    Err(TrySendError::Full(back) | TrySendError::Disconnected(back)) => v = back,
                }
                yield_now();
            }
        }

        /// As `send` (the models give no deadline).
        pub(crate) fn send_deadline(&self, v: T, _: Instant) -> Result<(), SendError<T>> {
            self.send(v)
        }
    }

    impl<T> Receiver<T> {
        pub(crate) fn try_recv(&self) -> Result<T, ()> {
            self.0.q.lock().pop_front().ok_or(())
        }
    }

    impl<T> std::fmt::Debug for Sender<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Sender(loom)")
        }
    }

    impl<T> std::fmt::Debug for Receiver<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Receiver(loom)")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::handoff::Handoff;

    /// No lost wake-up: a push that races a consumer's way to `park` (its announce, fence and
    /// re-check against the push's fence and swap of the idle flag) either is seen by the
    /// re-check or unparks it. A consumer parked for good would be a deadlock, which loom
    /// reports.
    #[test]
    fn loom_handoff_push_wakes_a_parked_consumer() {
        loom::model(|| {
            let q = Arc::new(Handoff::<u32>::new(1, Some(2)));
            let c = {
                let q = q.clone();
                loom::thread::spawn(move || q.recv(0))
            };
            q.push(7, None).expect("the queue is open");
            assert_eq!(c.join().unwrap(), Some(7));
        });
    }

    /// The last consumer's exit races a push: the item is taken by the consumer, given back
    /// to the pusher, or dropped by whichever of the two sees the other last. None stays in
    /// the queue once both are done.
    #[test]
    fn loom_handoff_no_item_is_stranded_by_the_last_consumers_exit() {
        loom::model(|| {
            let q = Arc::new(Handoff::<u32>::new(1, Some(2)));
            let c = {
                let q = q.clone();
                loom::thread::spawn(move || {
                    let got = q.recv(0);
                    q.leave();
                    got
                })
            };
            let p = {
                let q = q.clone();
                loom::thread::spawn(move || q.push(5, None))
            };
            q.close();
            q.wake_all();
            let got = c.join().unwrap();
            let pushed = p.join().unwrap();
            assert!(q.steal().is_none(), "an item stranded in the queue");
            match pushed {
                Ok(()) => assert!(got == Some(5) || got.is_none()),
                Err(v) => {
                    assert_eq!(v, 5);
                    assert_eq!(got, None);
                }
            }
        });
    }
}
