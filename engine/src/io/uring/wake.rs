//! The sleep/wake handshake between a ring thread and the threads that send it ops.
//!
//! When the ring thread has nothing to do it sleeps in `io_uring_enter`, with a poll armed on
//! an eventfd. To cost a busy ring's senders no syscall, a sender writes the eventfd only when
//! the thread said it is going to sleep:
//!
//! - the ring thread announces its sleep ([`SleepFlag::announce_sleep`]), then re-checks its
//!   channel and backlog, and sleeps only if both are empty; awake again, it clears the flag
//!   ([`SleepFlag::awake`]);
//! - a sender first sends, then takes the sleeper ([`SleepFlag::take_sleeper`]: a swap of the
//!   flag to false) and writes the eventfd only if the flag was set.
//!
//! The flag and the channel are a store-load pair on both sides (`SeqCst`): either the ring's
//! re-check sees the op, or the sender sees the flag and wakes it. A wake-up is never lost.
//!
//! Model-checked with loom (`loom_sleep_wake_*` below, see `scripts/loom.sh`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use super::Wake;
use crate::sync::{AtomicBool, Ordering, seq_cst_store_load};
use crate::sys::event;

/// The ring thread's "I am going to sleep" flag. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct SleepFlag {
    sleeping: AtomicBool,
}

impl SleepFlag {
    /// The ring thread is going to sleep. It must then re-check its channel and backlog, and
    /// sleep only if they are empty: an op sent before this is seen by that re-check, and the
    /// sender of an op sent after it sees the flag and wakes the thread.
    pub(crate) fn announce_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        seq_cst_store_load();
    }

    /// The ring thread is awake (or decided not to sleep): senders need not wake it.
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// For a sender, after its send: true if the thread may be asleep and this caller must
    /// wake it (one caller per announced sleep gets true).
    ///
    /// The load first spares a busy ring's senders the locked instruction. The exchange writes
    /// only when it takes the sleeper (a swap would also write `false` over `false`: the same
    /// effect, but loom, whose modification order of concurrent stores is partial, then reports
    /// a wake-up lost that the hardware cannot lose).
    pub(crate) fn take_sleeper(&self) -> bool {
        seq_cst_store_load();
        self.sleeping.load(Ordering::SeqCst)
            && self
                .sleeping
                .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
    }
}

/// Wakes a ring thread blocked in `io_uring_enter` by writing its eventfd.
pub(crate) struct EventWake {
    /// The eventfd the ring thread polls while it sleeps.
    pub(super) efd: OwnedFd,
    pub(super) sleeping: SleepFlag,
}

impl EventWake {
    /// A non-blocking eventfd and a clear flag.
    pub(super) fn new() -> io::Result<Self> {
        Ok(EventWake {
            efd: event::eventfd_nonblocking()?,
            sleeping: SleepFlag::default(),
        })
    }
}

impl Wake for EventWake {
    fn wake(&self) {
        if self.sleeping.take_sleeper() {
            // A full counter (EAGAIN) means a wake is already pending, which is all we need.
            let _ = event::eventfd_signal(self.efd.as_fd());
        }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{AtomicUsize, Condvar, Mutex};
    use loom::thread;
    use std::sync::Arc;

    /// The eventfd: a counter that a write bumps and a sleeper drains; sleeping on it is
    /// waiting for it to be non-zero (the ring's poll on it completes).
    #[derive(Default)]
    struct EventFd {
        count: Mutex<u64>,
        cv: Condvar,
    }

    impl EventFd {
        fn write(&self) {
            *self.count.lock() += 1;
            self.cv.notify_all();
        }

        /// `io_uring_enter(want = 1)` with only the eventfd poll armed, then the reap that
        /// drains the eventfd.
        fn sleep(&self) {
            let mut c = self.count.lock();
            while *c == 0 {
                self.cv.wait(&mut c);
            }
            *c = 0;
        }
    }

    /// What a sender's `wake` does ([`EventWake::wake`] with the eventfd above).
    fn wake(flag: &SleepFlag, efd: &EventFd) {
        if flag.take_sleeper() {
            efd.write();
        }
    }

    /// Two senders each send one op and wake the ring; the ring thread runs its loop (take
    /// what the channel holds; announce the sleep; re-check; sleep; awake) until it has both.
    /// A lost wake-up leaves the ring asleep forever with an op in its channel: loom reports
    /// it as a deadlock.
    #[test]
    fn loom_sleep_wake_loses_no_wake_up() {
        const OPS: usize = 2;
        loom::model(|| {
            let flag = Arc::new(SleepFlag::default());
            let efd = Arc::new(EventFd::default());
            // The channel: its length, sent with a SeqCst RMW and checked with a SeqCst load,
            // as crossbeam's bounded channel does (the tail's CAS, `is_empty`).
            let queued = Arc::new(AtomicUsize::new(0));
            let senders: Vec<_> = (0..OPS)
                .map(|_| {
                    let (flag, efd, queued) = (flag.clone(), efd.clone(), queued.clone());
                    thread::spawn(move || {
                        queued.fetch_add(1, Ordering::SeqCst);
                        wake(&flag, &efd);
                    })
                })
                .collect();
            // The ring thread (`Ring::run`).
            let mut got = 0;
            loop {
                got += queued.swap(0, Ordering::SeqCst);
                if got == OPS {
                    break;
                }
                flag.announce_sleep();
                let waiting = queued.load(Ordering::SeqCst) != 0;
                if !waiting {
                    efd.sleep();
                }
                flag.awake();
            }
            for s in senders {
                s.join().unwrap();
            }
        });
    }
}
