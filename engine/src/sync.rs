//! The synchronisation primitives of the engine's concurrent protocols, behind one shim so the
//! same code runs under the `loom` model checker (`RUSTFLAGS="--cfg loom"`, see
//! `scripts/loom.sh`).
//!
//! In a normal build these are the std atomics and parking_lot's `Mutex` and `Condvar`. Under
//! `cfg(loom)` they are loom's, with parking_lot's API (a `lock` that cannot fail,
//! `Condvar::wait(&mut guard)`), so the modelled code reads the same in both builds.
//!
//! No `Arc` here: the modelled types hold none, and the models share them through std's
//! (a loom `Arc` dropped while a failed model unwinds aborts the test binary, hiding the
//! failure).
//!
//! Only the protocols loom models import from here (the lane gate, the sleep/wake handshake,
//! the ledger's counters, a directory's file count, the writer's abort list, a state's grants).
//! Everything else keeps std and parking_lot: under `cfg(loom)` the crate still builds whole,
//! but only the code a `loom::model` runs may be used, and that code must only use these.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::thread::yield_now;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::thread::yield_now;
#[cfg(loom)]
pub(crate) use loom_lock::{Condvar, Mutex, MutexGuard};

/// Marks a store-load ("Dekker") pair of `SeqCst` accesses: a `SeqCst` store (or RMW) before
/// it, a `SeqCst` load of another location after it, on both sides of a handshake. Either side
/// sees the other's store, since all `SeqCst` accesses are in one total order.
///
/// In a normal build this is nothing: the `SeqCst` accesses already give that order. Loom
/// models `SeqCst` accesses as `AcqRel` only (its documented limitation), which would report
/// this correct pattern as a race, so under `cfg(loom)` it is a `fence(SeqCst)`, which loom
/// models exactly. Valid only between `SeqCst` accesses: it must not hide a weaker ordering.
#[inline(always)]
pub(crate) fn seq_cst_store_load() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// loom's `Mutex` and `Condvar` with parking_lot's API.
#[cfg(loom)]
mod loom_lock {
    use std::ops::{Deref, DerefMut};

    /// A loom mutex whose `lock` returns the guard (loom's poisoning is not modelled).
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// Holds the lock; `None` only inside [`Condvar::wait`].
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn new(t: T) -> Self {
            Mutex(loom::sync::Mutex::new(t))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Mutex::new(T::default())
        }
    }

    impl<T> std::fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Mutex(loom)")
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            match &self.0 {
                Some(g) => g,
                None => unreachable!("a guard is only empty inside Condvar::wait"),
            }
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            match &mut self.0 {
                Some(g) => g,
                None => unreachable!("a guard is only empty inside Condvar::wait"),
            }
        }
    }

    /// A loom condition variable with parking_lot's `wait(&mut guard)`.
    #[derive(Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            if let Some(g) = guard.0.take() {
                guard.0 = Some(self.0.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    impl std::fmt::Debug for Condvar {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Condvar(loom)")
        }
    }
}
