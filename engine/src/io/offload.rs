//! The offload pool: a few engine threads that run the blocking steps of `_async` calls (a
//! segment's create, `fallocate`, pooled reuse and trims; a reader's open, map and first
//! touch of a cold map), so an async caller's thread never makes those syscalls. The caller
//! gets an [`Offloaded`] handle it polls; the job's thread wakes it when the result is in.
//!
//! A blocking pool rather than io_uring `OPENAT`/`FALLOCATE` ops: a rotation is a chain of
//! dependent steps with policy between them (pooled reuse, ledger trims, the next root after a
//! device error, the abort check under the file-list lock), the psync backend has no async
//! ops, and a pool runs the very code the blocking calls run, so both backends and every
//! invariant of that code hold unchanged. Its threads start on first use: an engine never
//! called async never has them.

use std::io;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

/// Threads of the pool. A rotation in direct mode allocates a whole segment (tens of ms on a
/// busy disk): a few in parallel keep many async writers moving.
const OFFLOAD_THREADS: usize = 4;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool. Its threads leave when it is dropped (the channel disconnects).
#[derive(Debug)]
pub(crate) struct Offload {
    /// Set once, by the first job (its threads start then); a lock only for that start.
    tx: OnceLock<Sender<Job>>,
    starting: Mutex<()>,
}

impl Offload {
    pub(crate) fn new() -> Self {
        Offload {
            tx: OnceLock::new(),
            starting: Mutex::new(()),
        }
    }

    /// Runs `f` on a pool thread; the handle yields its result. If no pool thread can be
    /// started, `f` runs here, on the caller's thread (logged once per failure).
    pub(crate) fn run<T, F>(&self, f: F) -> Offloaded<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = Arc::new(Mutex::new(Slot {
            value: None,
            waker: None,
        }));
        let s2 = slot.clone();
        let job: Job = Box::new(move || {
            let v = f();
            let waker = {
                let mut s = s2.lock();
                s.value = Some(v);
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        });
        match self.sender() {
            Ok(tx) => {
                if let Err(e) = tx.send(job) {
                    (e.into_inner())();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting an offload thread failed; running inline");
                job();
            }
        }
        Offloaded { slot }
    }

    fn sender(&self) -> io::Result<&Sender<Job>> {
        if let Some(t) = self.tx.get() {
            return Ok(t);
        }
        let _one = self.starting.lock();
        if let Some(t) = self.tx.get() {
            return Ok(t);
        }
        let (t, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..OFFLOAD_THREADS {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("spillring-offload-{i}"))
                .spawn(move || offload_loop(&rx));
            if let Err(e) = spawned {
                if i == 0 {
                    return Err(e);
                }
                break;
            }
        }
        Ok(self.tx.get_or_init(|| t))
    }
}

fn offload_loop(rx: &Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        // A panicking job (a panicking waker) must not take the pool thread with it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// The result of a job on the offload pool, to poll. Dropping it does not stop the job: the
/// job runs to its end and its result is dropped (on the pool thread).
pub(crate) struct Offloaded<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

impl<T> Offloaded<T> {
    /// The result once the job ended; else parks `cx`'s waker and returns `Pending`.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.slot.lock();
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}
