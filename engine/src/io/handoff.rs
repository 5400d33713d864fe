//! A queue from any thread to a fixed set of engine threads whose push never takes a lock
//! (the offload pool's jobs, the reaper's drops).
//!
//! Why not a crossbeam channel: its `send` wakes a sleeping receiver under the channel's
//! waker mutex, which receivers take too as they go to sleep and wake up. On a busy machine a
//! receiver preempted while holding it makes the sender sleep in `futex` until that receiver
//! runs again. Seen in the `async_poll` bench (`perf record -e sched:sched_switch`): a tokio
//! worker asleep in `SyncWaker::notify` under `Offload::run` (a rotation or an allocation
//! step handed to the pool) and under `Reaper::reap` (a reader dropping a segment's map).
//!
//! Here items go into a crossbeam channel that no thread ever sleeps in: consumers take
//! with `try_recv` and, when it is empty, announce themselves idle in their own flag and park;
//! a push (`try_send` into the preallocated array: no lock, no allocation) swaps one idle
//! flag and unparks that thread (`Thread::unpark`: an atomic swap and at most a `FUTEX_WAKE`,
//! which never sleeps). A consumer re-checks the queue after announcing (both sides fence), so
//! no push is missed. With no receiver registered in the channel's waker, its `send` never
//! takes the waker mutex.
//!
//! A bounded queue gives back-pressure: a push into a full one waits in the channel's `send`
//! (the only sleeping in it), until a deadline if one is given. An unbounded one spills past
//! its array into a second, unbounded channel. When every consumer has left (or the owner
//! closed it), a push hands its item back; an item that raced the last consumer's exit is
//! drained by whichever of the two sees the other.

use std::time::Instant;

#[cfg(not(loom))]
use crossbeam_channel::{Receiver, Sender, TrySendError, bounded, unbounded};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
use std::thread::{current, park};

// The loom build (scripts/loom.sh) runs this same protocol over loom's atomics, threads and a
// stand-in for the channel: see `handoff_loom.rs`.
#[cfg(loom)]
use super::handoff_loom::chan::{Receiver, Sender, TrySendError, bounded, unbounded};
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
#[cfg(loom)]
use loom::thread::park;

/// Looks at the queue before a consumer parks: `SPIN_STEPS` with doubling spins, then yields.
/// None under loom: the model checks the announce / re-check / park handshake, which the
/// snooze only delays.
const SNOOZE_STEPS: u32 = if cfg!(loom) { 0 } else { 11 };
const SPIN_STEPS: u32 = 7;

/// Slots of an unbounded queue's array (past them, items go to its overflow channel).
const UNBOUNDED_ARRAY: usize = 1024;

/// One consumer thread's idle flag.
#[derive(Debug, Default)]
struct Idle {
    thread: ThreadCell,
    sleeping: AtomicBool,
}

/// The consumer's thread handle, set once by the consumer itself.
#[cfg(not(loom))]
#[derive(Debug, Default)]
struct ThreadCell(std::sync::OnceLock<std::thread::Thread>);

#[cfg(not(loom))]
impl ThreadCell {
    fn set_current(&self) {
        self.0.get_or_init(current);
    }

    fn unpark(&self) {
        if let Some(t) = self.0.get() {
            t.unpark();
        }
    }
}

#[cfg(loom)]
use super::handoff_loom::ThreadCell;

/// A multi-producer queue drained by a fixed set of consumer threads (see the module docs).
#[derive(Debug)]
pub(crate) struct Handoff<T> {
    tx: Sender<T>,
    rx: Receiver<T>,
    /// Unbounded queues only: where items go while the array is full.
    overflow: Option<(Sender<T>, Receiver<T>)>,
    idle: Box<[Idle]>,
    /// Consumers that have not left.
    live: AtomicUsize,
    closed: AtomicBool,
}

impl<T> Handoff<T> {
    /// A queue for `consumers` threads (consumer `i` calls [`Handoff::recv`] with `i`), with
    /// at most `cap` items queued (`None`: unbounded).
    pub(crate) fn new(consumers: usize, cap: Option<usize>) -> Self {
        let (tx, rx) = bounded(cap.unwrap_or(UNBOUNDED_ARRAY).max(1));
        Handoff {
            tx,
            rx,
            overflow: cap.is_none().then(unbounded),
            idle: (0..consumers).map(|_| Idle::default()).collect(),
            live: AtomicUsize::new(consumers),
            closed: AtomicBool::new(consumers == 0),
        }
    }

    /// Queues `item` and wakes an idle consumer. In a full bounded queue, waits for room until
    /// `deadline` (forever with `None`); gives `item` back if the time ran out or the queue is
    /// closed.
    pub(crate) fn push(&self, item: T, deadline: Option<Instant>) -> Result<(), T> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(item);
        }
        match self.tx.try_send(item) {
            Ok(()) => {}
            Err(TrySendError::Full(item)) => match (&self.overflow, deadline) {
                (Some((o, _)), _) => o.send(item).map_err(|e| e.into_inner())?,
                (None, None) => self.tx.send(item).map_err(|e| e.into_inner())?,
                (None, Some(d)) => self.tx.send_deadline(item, d).map_err(|e| e.into_inner())?,
            },
            Err(TrySendError::Disconnected(item)) => return Err(item),
        }
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            // Closed meanwhile: a consumer still draining takes the item, else the last one
            // gone may have missed it, so this drops what is queued here.
            if self.live.load(Ordering::SeqCst) == 0 {
                while let Some(v) = self.steal() {
                    drop(v);
                }
            }
            return Ok(());
        }
        for idle in self.idle.iter() {
            if idle.sleeping.load(Ordering::SeqCst) && idle.sleeping.swap(false, Ordering::SeqCst) {
                idle.thread.unpark();
                break;
            }
        }
        Ok(())
    }

    pub(super) fn steal(&self) -> Option<T> {
        if let Ok(v) = self.rx.try_recv() {
            return Some(v);
        }
        self.overflow.as_ref().and_then(|(_, r)| r.try_recv().ok())
    }

    /// A consumer leaves for good. The last one closes the queue and drops what is left.
    pub(crate) fn leave(&self) {
        if self.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.close();
            fence(Ordering::SeqCst);
            while let Some(v) = self.steal() {
                drop(v);
            }
        }
    }

    /// Closes the queue: pushes give their item back from now on, and consumers return `None`
    /// from [`Handoff::recv`] once they drained what is queued.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Wakes every idle consumer (after [`Handoff::close`], so they see it: see
    /// [`Handoff::recv`]).
    pub(crate) fn wake_all(&self) {
        for idle in self.idle.iter() {
            idle.sleeping.store(false, Ordering::SeqCst);
            idle.thread.unpark();
        }
    }

    /// The next item, for consumer `me` (parks while the queue is empty); `None` once the
    /// queue is closed and empty. A push that saw this consumer's idle flag unparks it; a
    /// token left by an earlier unpark only makes the loop look once more.
    pub(crate) fn recv(&self, me: usize) -> Option<T> {
        let idle = &self.idle[me];
        idle.thread.set_current();
        loop {
            // Look again for a while before announcing idle (spin, then yield, as crossbeam's
            // blocking `recv` does): items often come in bursts (a spill cycle hands the
            // reaper a close and an unmap microseconds apart), and a consumer still looking
            // needs no wake. Every wake is a `FUTEX_WAKE` and an IPI on the pusher's thread:
            // 19% of the caller's samples in a 4 KiB spill cycle when consumers parked at once.
            for step in 0..SNOOZE_STEPS {
                if let Some(v) = self.steal() {
                    return Some(v);
                }
                if step < SPIN_STEPS {
                    for _ in 0..1u32 << step {
                        std::hint::spin_loop();
                    }
                } else {
                    std::thread::yield_now();
                }
            }
            if let Some(v) = self.steal() {
                return Some(v);
            }
            if self.closed.load(Ordering::SeqCst) {
                return None;
            }
            idle.sleeping.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if let Some(v) = self.steal() {
                idle.sleeping.store(false, Ordering::SeqCst);
                return Some(v);
            }
            if self.closed.load(Ordering::SeqCst) {
                idle.sleeping.store(false, Ordering::SeqCst);
                return None;
            }
            park();
            idle.sleeping.store(false, Ordering::SeqCst);
        }
    }
}

/// Starts a thread named `name-i` for each consumer `i` of `q`, handing each item it takes to
/// `each` (a panic there does not take the thread along) until `q` is closed and drained; the
/// threads that could not start leave `q` at once. An error when none could (`q` closed).
pub(crate) fn spawn_consumers<T: Send + 'static>(
    q: &std::sync::Arc<Handoff<T>>,
    name: &str,
    each: impl Fn(T) + Send + Clone + 'static,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let n = q.idle.len();
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (q2, each) = (q.clone(), each.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-{i}"))
            .spawn(move || {
                while let Some(item) = q2.recv(i) {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| each(item)));
                }
                q2.leave();
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) if i == 0 => {
                q.close();
                return Err(e);
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting a {name} thread failed");
                (i..n).for_each(|_| q.leave());
                break;
            }
        }
    }
    Ok(threads)
}

/// Closes `q` (a push gives its item back from now on; each consumer drains what is queued,
/// then leaves) and joins the threads that end by `deadline`: the others are left to end on
/// their own.
pub(crate) fn stop_consumers<T>(
    q: &Handoff<T>,
    threads: Vec<std::thread::JoinHandle<()>>,
    deadline: Instant,
) {
    q.close();
    q.wake_all();
    for t in threads {
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

// Left out of loom builds, like the other unit tests of std-thread code.
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn every_item_reaches_a_consumer_and_none_is_lost() {
        let q = Arc::new(Handoff::<u64>::new(3, None));
        let sum = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|i| {
                let (q, sum) = (q.clone(), sum.clone());
                std::thread::spawn(move || {
                    while let Some(v) = q.recv(i) {
                        sum.fetch_add(v as usize, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..4)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for v in 1..=10_000u64 {
                        q.push(v, None).unwrap();
                        if v % 1000 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let want = 4 * 10_000 * 10_001 / 2;
        let t0 = Instant::now();
        while sum.load(Ordering::SeqCst) < want && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sum.load(Ordering::SeqCst), want);
        q.close();
        q.wake_all();
        for t in threads {
            t.join().unwrap();
        }
        assert!(
            q.push(1, None).is_err(),
            "a closed queue gives the item back"
        );
    }

    #[test]
    fn a_full_bounded_queue_waits_for_room_until_its_deadline() {
        let q = Arc::new(Handoff::<u32>::new(1, Some(2)));
        q.push(1, None).unwrap();
        q.push(2, None).unwrap();
        let t0 = Instant::now();
        let d = Instant::now() + Duration::from_millis(50);
        assert_eq!(q.push(3, Some(d)), Err(3), "full until the deadline");
        assert!(t0.elapsed() >= Duration::from_millis(50));
        let q2 = q.clone();
        let consumer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            q2.recv(0)
        });
        q.push(3, None).unwrap();
        assert_eq!(consumer.join().unwrap(), Some(1));
        q.leave();
        assert_eq!(q.push(4, None), Err(4), "every consumer left");
    }
}
