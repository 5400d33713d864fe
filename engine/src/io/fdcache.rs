//! The fd cache: an engine-wide bound (`max_open_files`) on the segment fds the engine holds:
//! writers' fds, and the fds sealed segments keep from their writers (`SegmentEntry::file`:
//! their readers and the segment pool's next writer use them instead of an open by name).
//!
//! Every segment fd a writer opens is counted by a [`FdPermit`], taken before the open and
//! held by the fd's [`FileHandle`] until it drops (the count is the number of counted
//! handles alive, in a writer's [`CachedFile`] or in ops in flight). A writer keeps its fd in
//! a [`CachedFile`]: a slot the cache may empty when the fd is idle (no op holds it), and that
//! the writer fills again by reopening its segment by name when it next submits a write.
//!
//! - **Hot path**: [`CachedFile::get`] takes the slot's own (uncontended) lock, clones the
//!   handle and marks it referenced: no syscall, no engine-wide lock.
//! - **At the bound**: [`FdCache::permit`] evicts an idle fd (the clock algorithm, an
//!   approximation of least recently used: a referenced slot gets a second chance) and closes
//!   it on the calling thread; when every counted fd is busy it waits for one (ops complete on
//!   the I/O threads, so the wait ends).
//! - **EMFILE/ENFILE from the OS**: [`FdCache::open_with`] evicts an idle fd and retries; with
//!   nothing of ours left to evict it returns the error (typed by the caller).
//!
//! An fd is idle when its slot holds the only reference: ops clone the handle only under the
//! slot's lock, so a count of one seen under that lock stays one until the lock is released.
//! Lock order: the clock, then a slot.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::{FileHandle, Reaper};

/// How long a waiter for an fd sleeps before it looks again for one that became idle (an op
/// completing makes an fd idle without a wake-up; a dropped handle wakes waiters at once).
const IDLE_POLL: Duration = Duration::from_millis(1);

/// Longest [`FdCache::open_with`] waits for a busy fd of ours to become idle after the OS
/// refused a descriptor, before it gives the error back.
const OS_LIMIT_WAIT: Duration = Duration::from_secs(2);

/// The engine's bound on segment fds held by writers. See the module docs.
pub(crate) struct FdCache {
    max: usize,
    /// Permits taken and not yet given back (fds open, or about to be opened).
    open: AtomicUsize,
    /// Counted fds open (cached, held by ops in flight, or queued on the reaper to close).
    live: AtomicUsize,
    clock: Mutex<Clock>,
    /// Waiters for a permit; woken when a counted handle drops.
    idle: Mutex<()>,
    freed: Condvar,
    evictions: AtomicU64,
    /// Slots of dropped `CachedFile`s kept for the next `install` (at most [`SPARE_SLOTS`]):
    /// a writer's segment takes no allocation for its slot in steady state.
    spare: Mutex<Vec<Arc<Slot>>>,
    /// Emptied fd handles of dropped `CachedFile`s (at most [`SPARE_SLOTS`]), reused by the
    /// next `fill` (`FileHandle::into_spare`, `FileHandle::from_spare`).
    spare_handles: Mutex<Vec<Arc<FileHandle>>>,
}

/// Slots [`FdCache`] keeps for reuse.
const SPARE_SLOTS: usize = 64;

impl std::fmt::Debug for FdCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdCache")
            .field("max", &self.max)
            .field("open", &self.open.load(Ordering::Relaxed))
            .finish()
    }
}

/// The slots holding an fd, in clock order.
#[derive(Default)]
struct Clock {
    slots: Vec<Arc<Slot>>,
    hand: usize,
}

/// Where a writer's fd lives while it is cached.
struct Slot {
    fd: Mutex<Option<Arc<FileHandle>>>,
    /// `fd.is_some()`, readable without the lock (changed only under it).
    cached: AtomicBool,
    /// Used since the clock hand last passed (a second chance).
    referenced: AtomicBool,
    /// Position in `Clock::slots` (changed only under the clock's lock), `NOT_IN_CLOCK` when
    /// the slot holds no fd.
    index: AtomicUsize,
}

const NOT_IN_CLOCK: usize = usize::MAX;

/// One counted fd, taken before the open. Dropping it (with its handle) gives it back.
#[derive(Debug)]
pub(crate) struct FdPermit {
    cache: Arc<FdCache>,
    /// Its fd is open (the permit is held by a handle, until the fd is closed).
    live: bool,
}

impl FdPermit {
    /// Its fd is open now.
    pub(crate) fn set_live(&mut self) {
        if !self.live {
            self.live = true;
            self.cache.live.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for FdPermit {
    fn drop(&mut self) {
        if self.live {
            self.cache.live.fetch_sub(1, Ordering::AcqRel);
        }
        self.cache.open.fetch_sub(1, Ordering::AcqRel);
        let _g = self.cache.idle.lock();
        self.cache.freed.notify_one();
    }
}

impl FdCache {
    /// A cache that lets at most `max` counted fds be open at once (at least 1).
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(FdCache {
            max: max.max(1),
            open: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            clock: Mutex::new(Clock::default()),
            idle: Mutex::new(()),
            freed: Condvar::new(),
            evictions: AtomicU64::new(0),
            spare: Mutex::new(Vec::with_capacity(SPARE_SLOTS)),
            spare_handles: Mutex::new(Vec::with_capacity(SPARE_SLOTS)),
        })
    }

    /// Counted fds open now (permits held).
    pub(crate) fn open_count(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Idle fds closed by the cache so far.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A permit for one more fd: at once below the bound; at the bound, after evicting an
    /// idle fd, or after waiting until one is idle or dropped.
    pub(crate) fn permit(self: &Arc<Self>) -> FdPermit {
        loop {
            if let Some(p) = self.try_permit() {
                return p;
            }
            if self.evict_one(false) {
                continue;
            }
            let mut g = self.idle.lock();
            if self.open.load(Ordering::Acquire) >= self.max {
                let _ = self.freed.wait_for(&mut g, IDLE_POLL);
            }
        }
    }

    fn try_permit(self: &Arc<Self>) -> Option<FdPermit> {
        let mut n = self.open.load(Ordering::Acquire);
        while n < self.max {
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(FdPermit {
                        cache: self.clone(),
                        live: false,
                    });
                }
                Err(now) => n = now,
            }
        }
        None
    }

    /// Runs `open` (which opens one fd); when the OS has no descriptor left (EMFILE or
    /// ENFILE), evicts an idle fd of ours and tries again, waiting a while for a busy one to
    /// become idle or a closing one to close. Gives the OS error back at once when no fd of
    /// ours is open, or after [`OS_LIMIT_WAIT`].
    pub(crate) fn open_with<T>(&self, mut open: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let mut waited = Duration::ZERO;
        loop {
            match open() {
                Err(e) if is_out_of_fds(&e) => {
                    if self.evict_one(true) {
                        continue;
                    }
                    if waited >= OS_LIMIT_WAIT || self.live.load(Ordering::Acquire) == 0 {
                        return Err(e);
                    }
                    std::thread::sleep(IDLE_POLL);
                    waited += IDLE_POLL;
                }
                r => return r,
            }
        }
    }

    /// Closes one idle fd (clock order; `force` ignores second chances). False when every
    /// cached fd is busy or none is cached.
    fn evict_one(&self, force: bool) -> bool {
        let victim = {
            let mut c = self.clock.lock();
            let n = c.slots.len();
            let mut found = None;
            // Two turns: the first clears the referenced marks it passes.
            for _ in 0..2 * n {
                if c.slots.is_empty() {
                    break;
                }
                let i = c.hand % c.slots.len();
                c.hand = i + 1;
                let slot = c.slots[i].clone();
                if !force && slot.referenced.swap(false, Ordering::Relaxed) {
                    continue;
                }
                let mut fd = slot.fd.lock();
                if fd.as_ref().is_some_and(|h| Arc::strong_count(h) == 1) {
                    found = fd.take();
                    slot.cached.store(false, Ordering::Release);
                    drop(fd);
                    c.remove(&slot);
                    break;
                }
            }
            found
        };
        let Some(h) = victim else { return false };
        self.evictions.fetch_add(1, Ordering::Relaxed);
        // Closed here, not on the reaper: the caller is about to reuse the descriptor (an
        // evicted segment is normally live, so its close frees nothing and is quick).
        match Arc::try_unwrap(h) {
            Ok(h) => h.close_now(),
            Err(h) => drop(h),
        }
        true
    }

    /// Starts caching `fd` (opened under `permit`) for a writer.
    pub(crate) fn install(
        self: &Arc<Self>,
        fd: OwnedFd,
        permit: FdPermit,
        reaper: Reaper,
    ) -> CachedFile {
        let spare = self.spare.lock().pop();
        let slot = match spare {
            // A spare slot is empty and out of the clock (see `CachedFile`'s drop).
            Some(slot) => {
                slot.referenced.store(true, Ordering::Relaxed);
                slot
            }
            None => Arc::new(Slot {
                fd: Mutex::new(None),
                cached: AtomicBool::new(false),
                referenced: AtomicBool::new(true),
                index: AtomicUsize::new(NOT_IN_CLOCK),
            }),
        };
        let file = CachedFile {
            slot,
            cache: self.clone(),
        };
        file.fill(fd, permit, reaper);
        file
    }
}

impl Clock {
    fn push(&mut self, slot: &Arc<Slot>) {
        slot.index.store(self.slots.len(), Ordering::Relaxed);
        self.slots.push(slot.clone());
    }

    fn remove(&mut self, slot: &Arc<Slot>) {
        let i = slot.index.swap(NOT_IN_CLOCK, Ordering::Relaxed);
        if i >= self.slots.len() || !Arc::ptr_eq(&self.slots[i], slot) {
            return;
        }
        self.slots.swap_remove(i);
        if let Some(moved) = self.slots.get(i) {
            moved.index.store(i, Ordering::Relaxed);
        }
        // A burst of open fds (thousands of released segments whose unlinks are pending)
        // grows the list; it is given back as they close, not kept at its high-water mark.
        let cap = self.slots.capacity();
        if cap > SPARE_SLOTS && self.slots.len() < cap / 4 {
            self.slots.shrink_to(cap / 2);
        }
    }
}

fn is_out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// A segment fd (a writer's, or kept with its sealed segment), which the cache may close while
/// it is idle.
pub(crate) struct CachedFile {
    slot: Arc<Slot>,
    cache: Arc<FdCache>,
}

impl std::fmt::Debug for CachedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedFile")
            .field("cached", &self.slot.fd.lock().is_some())
            .finish()
    }
}

impl CachedFile {
    /// The fd, if the cache did not close it: for an op (which holds it until it completes,
    /// so it is not evicted meanwhile).
    pub(crate) fn get(&self) -> Option<Arc<FileHandle>> {
        let h = self.slot.fd.lock().clone();
        if h.is_some() && !self.slot.referenced.load(Ordering::Relaxed) {
            self.slot.referenced.store(true, Ordering::Relaxed);
        }
        h
    }

    /// True while the cache holds the fd (a write will not need to reopen it); no lock.
    pub(crate) fn is_cached(&self) -> bool {
        self.slot.cached.load(Ordering::Acquire)
    }

    /// Fills the slot again with a reopened `fd` (taken under `permit`) and returns it.
    pub(crate) fn fill(&self, fd: OwnedFd, permit: FdPermit, reaper: Reaper) -> Arc<FileHandle> {
        let spare = self.cache.spare_handles.lock().pop();
        let h = match spare {
            Some(spare) => FileHandle::from_spare(spare, fd, reaper, permit),
            None => FileHandle::counted(fd, reaper, permit),
        };
        let mut c = self.cache.clock.lock();
        let mut slot = self.slot.fd.lock();
        let old = slot.replace(h.clone());
        self.slot.cached.store(true, Ordering::Release);
        if self.slot.index.load(Ordering::Relaxed) == NOT_IN_CLOCK {
            c.push(&self.slot);
        }
        self.slot.referenced.store(true, Ordering::Relaxed);
        drop((slot, c));
        drop(old);
        h
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        let h = {
            let mut c = self.cache.clock.lock();
            c.remove(&self.slot);
            self.slot.cached.store(false, Ordering::Release);
            self.slot.fd.lock().take()
        };
        // Ops in flight keep their own references; the fd closes (on the reaper) with the last.
        // If none does, it closes now (on the reaper) and the emptied handle is kept.
        if let Some(emptied) = h.and_then(FileHandle::into_spare) {
            let mut spare = self.cache.spare_handles.lock();
            if spare.len() < SPARE_SLOTS {
                spare.push(emptied);
            }
        }
        // Out of the clock, nobody else can get a reference to the slot: if this is the only
        // one, the (empty) slot can serve the next install.
        if Arc::strong_count(&self.slot) == 1 && Arc::weak_count(&self.slot) == 0 {
            let mut spare = self.cache.spare.lock();
            if spare.len() < SPARE_SLOTS {
                spare.push(self.slot.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devnull() -> OwnedFd {
        std::fs::File::open("/dev/null")
            .expect("open /dev/null")
            .into()
    }

    fn cached(cache: &Arc<FdCache>) -> CachedFile {
        let p = cache.permit();
        cache.install(devnull(), p, Reaper::inline())
    }

    #[test]
    fn the_bound_evicts_idle_fds_in_clock_order() {
        let cache = FdCache::new(2);
        let a = cached(&cache);
        let b = cached(&cache);
        assert_eq!(cache.open_count(), 2);
        // Both referenced: the first turn clears the marks, the second evicts `a`.
        let c = cached(&cache);
        assert_eq!(cache.open_count(), 2);
        assert_eq!(cache.evictions(), 1);
        assert!(a.get().is_none(), "the oldest idle fd goes first");
        assert!(b.get().is_some());
        // `b` was just used (referenced) and `c` is new (referenced): a permit evicts one of
        // them, never more than one.
        let p = cache.permit();
        assert_eq!(cache.evictions(), 2);
        drop(p);
        assert_eq!(cache.open_count(), 1);
        drop((a, b, c));
        assert_eq!(cache.open_count(), 0);
        assert!(cache.clock.lock().slots.is_empty());
    }

    /// A burst of cached fds grows the clock list; closing them gives its capacity back.
    #[test]
    fn the_clock_list_shrinks_after_a_burst() {
        // 600 fds: under a soft RLIMIT_NOFILE of 1,024 with the test harness's own.
        let cache = FdCache::new(600);
        let files: Vec<_> = (0..600).map(|_| cached(&cache)).collect();
        assert!(cache.clock.lock().slots.capacity() >= 600);
        drop(files);
        let cap = cache.clock.lock().slots.capacity();
        assert!(
            cap <= 2 * SPARE_SLOTS,
            "capacity {cap} kept after the burst"
        );
    }

    #[test]
    fn a_busy_fd_is_never_evicted_and_a_waiter_gets_the_next_freed_one() {
        let cache = FdCache::new(1);
        let a = cached(&cache);
        let busy = a.get().expect("cached");
        let waiter = {
            let cache = cache.clone();
            std::thread::spawn(move || {
                let p = cache.permit();
                drop(p);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "the only fd is busy: the permit waits"
        );
        assert!(a.get().is_some(), "a busy fd stays cached");
        drop(busy);
        waiter.join().expect("waiter");
        assert!(
            a.get().is_none(),
            "once idle, it was evicted for the waiter"
        );
        assert_eq!(cache.open_count(), 0);
    }

    /// Issue 10: a writer's segment fd takes no allocation in steady state. A dropped file's
    /// slot and emptied handle serve the next install; its fd is closed (permit given back);
    /// a handle an op still holds is not reused, and its fd stays open until the op drops it.
    #[test]
    fn a_dropped_files_slot_and_handle_serve_the_next_install() {
        let cache = FdCache::new(4);
        let a = cached(&cache);
        let (slot, handle) = (Arc::as_ptr(&a.slot), Arc::as_ptr(&a.get().unwrap()));
        drop(a);
        assert_eq!(cache.open_count(), 0, "the fd was closed");
        let b = cached(&cache);
        assert_eq!(Arc::as_ptr(&b.slot), slot, "the slot is reused");
        let held = b.get().unwrap();
        assert_eq!(Arc::as_ptr(&held), handle, "the handle is reused");
        assert!(held.raw() >= 0);
        assert_eq!(cache.open_count(), 1);
        // An op holds the handle: dropping the file keeps the fd open for the op.
        drop(b);
        assert_eq!(cache.open_count(), 1, "the op's fd stays open");
        let c = cached(&cache);
        assert_ne!(
            Arc::as_ptr(&c.get().unwrap()),
            handle,
            "a held handle is not reused"
        );
        assert_eq!(cache.open_count(), 2);
        drop(held);
        assert_eq!(
            cache.open_count(),
            1,
            "the op's fd closes with its last user"
        );
        drop(c);
        assert_eq!(cache.open_count(), 0);
    }

    #[test]
    fn a_reused_slot_is_counted_once() {
        let cache = FdCache::new(4);
        let a = cached(&cache);
        assert!(a.is_cached());
        assert!(cache.evict_one(true));
        assert!(!a.is_cached());
        assert!(a.get().is_none());
        assert_eq!(cache.open_count(), 0);
        let p = cache.permit();
        let h = a.fill(devnull(), p, Reaper::inline());
        assert_eq!(cache.open_count(), 1);
        assert!(Arc::ptr_eq(&h, &a.get().expect("reused")));
        assert!(a.is_cached());
        drop(h);
        assert_eq!(cache.clock.lock().slots.len(), 1);
        drop(a);
        assert_eq!(cache.open_count(), 0);
    }

    #[test]
    fn out_of_fds_from_the_os_evicts_then_gives_the_error_back() {
        let cache = FdCache::new(8);
        let a = cached(&cache);
        let mut calls = 0;
        let r: io::Result<()> = cache.open_with(|| {
            calls += 1;
            if calls == 1 {
                Err(io::Error::from_raw_os_error(libc::EMFILE))
            } else {
                Ok(())
            }
        });
        assert!(r.is_ok());
        assert_eq!(calls, 2, "retried once after evicting");
        assert!(a.get().is_none());
        // Nothing left to evict: the error comes back.
        let r: io::Result<()> = cache.open_with(|| Err(io::Error::from_raw_os_error(libc::ENFILE)));
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENFILE));
    }
}
