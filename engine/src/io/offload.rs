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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use super::handoff::{Handoff, spawn_consumers};

/// Threads of the pool. A rotation in direct mode allocates a whole segment (tens of ms on a
/// busy disk): a few in parallel keep many async writers moving.
const OFFLOAD_THREADS: usize = 4;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool. Its threads leave when it is dropped (the queue closes).
///
/// Jobs go through a [`Handoff`], whose push takes no lock: a crossbeam channel's send could
/// sleep in the caller's poll on the channel's waker mutex (see `handoff.rs`).
pub(crate) struct Offload {
    /// Set once, by the first job (its threads start then); a lock only for that start.
    tx: OnceLock<Arc<Handoff<Job>>>,
    starting: Mutex<()>,
    /// Jobs handed to the pool and not yet ended ([`Offload::busy`]).
    pending: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Offload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offload")
            .field("started", &self.tx.get().is_some())
            .finish()
    }
}

impl Drop for Offload {
    fn drop(&mut self) {
        if let Some(q) = self.tx.get() {
            q.close();
            q.wake_all();
        }
    }
}

impl Offload {
    pub(crate) fn new() -> Self {
        Offload {
            tx: OnceLock::new(),
            starting: Mutex::new(()),
            pending: Arc::default(),
        }
    }

    /// Jobs started and not yet ended. A job that ends after its caller gave up (a rotation
    /// whose file the writer no longer takes) does its own cleanup first, so `Engine::settle`
    /// waits for this to reach zero before it looks at queued deletes.
    pub(crate) fn busy(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
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
        let pending = self.pending.clone();
        pending.fetch_add(1, Ordering::SeqCst);
        let job: Job = Box::new(move || {
            // Counted down when the job ends, even by a panic, after everything else of it is
            // dropped (locals drop in reverse order: `s2` moved into a local goes first).
            let _done = Done(pending);
            let s2 = s2;
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
                if let Err(job) = tx.push(job, None) {
                    job();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "starting an offload thread failed; running inline");
                job();
            }
        }
        Offloaded { slot }
    }

    fn sender(&self) -> io::Result<&Arc<Handoff<Job>>> {
        if let Some(t) = self.tx.get() {
            return Ok(t);
        }
        let _one = self.starting.lock();
        if let Some(t) = self.tx.get() {
            return Ok(t);
        }
        let q = Arc::new(Handoff::<Job>::new(OFFLOAD_THREADS, None));
        // The threads leave when the queue closes (the pool dropped): never joined.
        spawn_consumers(&q, "spillring-offload", |job: Job| job())?;
        Ok(self.tx.get_or_init(|| q))
    }
}

/// Counts a job down on drop.
struct Done(Arc<AtomicUsize>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
    /// Waits for the result on this thread (a blocking caller: it parks until the job's thread
    /// wakes it).
    pub(crate) fn wait(&mut self) -> T {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(v) = self.poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    }

    /// The result once the job ended; else parks `cx`'s waker and returns `Pending`. Never
    /// waits for the slot's lock: if the job's thread holds it (storing the result), the
    /// task is woken at once to look again, so a pool thread preempted there cannot put the
    /// caller's thread to sleep.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<T> {
        let Some(mut s) = self.slot.try_lock() else {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        };
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
