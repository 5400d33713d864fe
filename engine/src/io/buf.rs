//! Page-aligned staging buffers and their pool (whose first full-size buffers the rings
//! register), under the engine-wide `max_buffer_memory` budget.
//!
//! **The budget.** Every buffer the pool has mapped counts against it, whether a writer holds
//! it, a write has it in flight, or it waits in the pool's free lists; a buffer is never mapped
//! past it. Buffers come in sizes from [`MIN_BUFFER`] (4 KiB) doubling up to `io_buffer_size`.
//! A writer asks for `io_buffer_size`; it gets that while the buffers out to writers use at
//! most half the budget, and smaller ones as the budget fills (halved until the request fits
//! in half of it, down to 4 KiB, then anything that fits the whole budget): many writers share
//! a small budget with small buffers instead of waiting for each other. Free buffers of other
//! sizes are unmapped to make room.
//!
//! **Why this cannot deadlock.** When not even a 4 KiB buffer fits, [`BufferPool::try_get`]
//! says whether a wait can end: only a buffer *in flight* (a submitted write) is certain to
//! come back by itself. So a writer waits (blocking, or parking its waker: an async writer
//! waits asynchronously) only while some buffer is in flight; when the whole budget is held by
//! staging buffers of open writers (one thread writing round-robin to more writers than the
//! budget has 4 KiB buffers for), nothing would ever come back, and the writer gets
//! [`SpillError::BufferBudgetExhausted`](crate::SpillError::BufferBudgetExhausted) instead,
//! which names the fix.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;

use memmap2::MmapMut;
use parking_lot::{Condvar, Mutex};

/// The smallest staging buffer (one direct-I/O block).
pub(crate) const MIN_BUFFER: usize = 4096;

/// A page-aligned staging buffer. Dropping it returns it to its pool.
pub(crate) struct IoBuf {
    map: Option<MmapMut>,
    /// Bytes filled.
    pub len: usize,
    /// Index among the buffers registered with the rings, if it has one.
    pub slot: Option<u16>,
    /// Counted in the pool's bytes in flight (a submitted write holds it).
    in_flight: bool,
    /// The block (format v2) open in this buffer: where its header is reserved and how many
    /// records it holds so far; sealed when the buffer is written.
    pub block: Option<OpenBlock>,
    pool: Arc<BufferPool>,
}

impl IoBuf {
    pub(crate) fn capacity(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.map.as_ref().map_or(std::ptr::null(), |m| m.as_ptr())
    }

    /// The whole buffer, for filling.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        match self.map.as_mut() {
            Some(m) => &mut m[..],
            None => &mut [],
        }
    }

    /// The first `n` bytes (filled or not).
    pub(crate) fn filled_to(&self, n: usize) -> &[u8] {
        match self.map.as_ref() {
            Some(m) => &m[..n.min(m.len())],
            None => &[],
        }
    }

    /// The filled part.
    pub(crate) fn filled(&self) -> &[u8] {
        match self.map.as_ref() {
            Some(m) => &m[..self.len],
            None => &[],
        }
    }

    /// Appends `data`; the caller checked it fits.
    #[inline]
    pub(crate) fn push(&mut self, data: &[u8]) {
        let at = self.len;
        self.space()[at..at + data.len()].copy_from_slice(data);
        self.len += data.len();
    }

    pub(crate) fn remaining(&self) -> usize {
        self.capacity() - self.len
    }

    /// Marks the buffer as held by a submitted write: it comes back to the pool by itself, so
    /// a writer short of budget may wait for it.
    pub(crate) fn mark_in_flight(&mut self) {
        if !self.in_flight {
            self.in_flight = true;
            self.pool
                .in_flight
                .fetch_add(self.capacity(), Ordering::Relaxed);
        }
    }
}

/// A block open in a staging buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenBlock {
    /// Offset of the block's header in the buffer.
    pub at: usize,
    /// Records placed in it.
    pub records: u32,
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            self.pool.put(map, self.slot, self.in_flight);
        }
    }
}

/// Why [`BufferPool::try_get`] gave no buffer.
#[derive(Debug)]
pub(crate) enum Short {
    /// The budget is full but a buffer is in flight: it comes back when its write completes
    /// ([`BufferPool::wait_returned`] / [`BufferPool::register_waker`]). `epoch` is the count
    /// of returns seen before the attempt.
    Wait { epoch: u64 },
    /// The budget is full and nothing is in flight: every buffer is held by an open writer.
    Exhausted { budget: usize, held: usize },
    /// Mapping failed.
    Io(io::Error),
}

/// Free buffers and the waiters for a returned one.
#[derive(Debug, Default)]
struct Free {
    /// Registered full-size buffers: kept for the engine's life.
    slotted: Vec<(MmapMut, u16)>,
    /// Unregistered buffers by size class (index `k`: `MIN_BUFFER << k`).
    plain: Vec<Vec<MmapMut>>,
    /// Buffers returned so far (the wait's epoch).
    returns: u64,
    wakers: Vec<Waker>,
}

/// A pool of page-aligned staging buffers under a byte budget. The first `max_slots`
/// full-size buffers it makes get a registration slot and are kept for the engine's life (the
/// rings register them as fixed buffers); other free buffers are kept up to `retain` per size
/// and unmapped beyond that or when the budget needs the room.
#[derive(Debug)]
pub(crate) struct BufferPool {
    size: usize,
    max_slots: usize,
    retain: usize,
    budget: usize,
    free: Mutex<Free>,
    returned: Condvar,
    next_slot: AtomicUsize,
    /// Bytes of every live map (held, in flight or free): never above `budget`.
    mapped: AtomicUsize,
    /// Bytes of buffers out of the free lists.
    out: AtomicUsize,
    /// Bytes of buffers held by submitted writes.
    in_flight: AtomicUsize,
    /// Highest `mapped` seen.
    peak: AtomicUsize,
}

impl BufferPool {
    /// A pool of buffers of up to `size` bytes (a power-of-two multiple of 4 KiB or not: the
    /// largest is always `size`), mapping at most `budget` bytes.
    pub(crate) fn new(size: usize, max_slots: usize, retain: usize, budget: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            size,
            max_slots,
            retain,
            budget: budget.max(size),
            free: Mutex::new(Free::default()),
            returned: Condvar::new(),
            next_slot: AtomicUsize::new(0),
            mapped: AtomicUsize::new(0),
            out: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// Bytes in the largest buffer (`io_buffer_size`).
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.size
    }

    pub(crate) fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// The budget, bytes mapped now and the most ever mapped at once.
    pub(crate) fn stats(&self) -> (usize, usize, usize) {
        (
            self.budget,
            self.mapped.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }

    /// The size class of a buffer of `len` bytes (the full size has the last class, even when
    /// it is not a power-of-two multiple of 4 KiB).
    fn class(&self, len: usize) -> usize {
        if len >= self.size {
            return self.classes() - 1;
        }
        (len / MIN_BUFFER).max(1).ilog2() as usize
    }

    /// Number of size classes: 4 KiB doubling below `size`, then `size`.
    fn classes(&self) -> usize {
        let below = (self.size.saturating_sub(1) / MIN_BUFFER).max(1).ilog2() as usize + 1;
        if self.size <= MIN_BUFFER {
            1
        } else {
            below + 1
        }
    }

    /// The size of class `k`.
    fn class_size(&self, k: usize) -> usize {
        if k + 1 >= self.classes() {
            self.size
        } else {
            MIN_BUFFER << k
        }
    }

    /// A buffer, empty, of the full size if the budget allows (see the module docs), never
    /// smaller than `at_least` if that is possible at all. Maps a new one when none is free.
    pub(crate) fn try_get(self: &Arc<Self>, at_least: usize) -> Result<IoBuf, Short> {
        let mut free = self.free.lock();
        let epoch = free.returns;
        if free.plain.is_empty() {
            free.plain = (0..self.classes()).map(|_| Vec::new()).collect();
        }
        let floor = self.class(at_least.clamp(MIN_BUFFER, self.size).next_power_of_two());
        let floor = if at_least > self.class_size(floor) {
            floor + 1
        } else {
            floor
        }
        .min(self.classes() - 1);
        let top = self.classes() - 1;
        // The size asked: the full one while buffers out use at most half the budget.
        let out = self.out.load(Ordering::Relaxed);
        let mut want = top;
        while want > floor && out + self.class_size(want) > self.budget / 2 {
            want -= 1;
        }
        if want == top
            && let Some((map, slot)) = free.slotted.pop()
        {
            return Ok(self.wrap(map, Some(slot)));
        }
        if let Some(map) = free.plain[want].pop() {
            return Ok(self.wrap(map, None));
        }
        // Map one of the size asked or smaller (not below `floor`), making room by unmapping
        // free buffers.
        for k in (floor..=want).rev() {
            let len = self.class_size(k);
            if self.make_room(&mut free, len) {
                return self.map_new(len, k == top).map_err(Short::Io);
            }
        }
        // Any free buffer big enough, of any size.
        if let Some((map, slot)) = free.slotted.pop() {
            return Ok(self.wrap(map, Some(slot)));
        }
        for k in floor..self.classes() {
            if let Some(map) = free.plain[k].pop() {
                return Ok(self.wrap(map, None));
            }
        }
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            Err(Short::Wait { epoch })
        } else {
            Err(Short::Exhausted {
                budget: self.budget,
                held: self.out.load(Ordering::Relaxed),
            })
        }
    }

    /// Counts `len` more bytes mapped if they fit the budget, unmapping free unregistered
    /// buffers (largest first) to make room; `false` if they cannot fit.
    fn make_room(&self, free: &mut Free, len: usize) -> bool {
        loop {
            let m = self.mapped.load(Ordering::Relaxed);
            if m + len <= self.budget {
                // Under the free-list lock: every increase of `mapped` is made here, so the
                // check holds (a concurrent decrease only leaves more room).
                self.mapped.fetch_add(len, Ordering::Relaxed);
                self.peak.fetch_max(m + len, Ordering::Relaxed);
                return true;
            }
            let Some(victim) = free.plain.iter_mut().rev().find_map(|v| v.pop()) else {
                return false;
            };
            self.mapped.fetch_sub(victim.len(), Ordering::Relaxed);
            drop(victim);
        }
    }

    /// Maps a buffer of `len` bytes already counted in `mapped`.
    fn map_new(self: &Arc<Self>, len: usize, full: bool) -> io::Result<IoBuf> {
        let map = match MmapMut::map_anon(len) {
            Ok(m) => m,
            Err(e) => {
                self.mapped.fetch_sub(len, Ordering::Relaxed);
                return Err(e);
            }
        };
        let slot = if full && self.next_slot.load(Ordering::Relaxed) < self.max_slots {
            let s = self.next_slot.fetch_add(1, Ordering::Relaxed);
            (s < self.max_slots).then_some(s as u16)
        } else {
            None
        };
        Ok(self.wrap(map, slot))
    }

    /// A buffer for a caller that can block: waits while buffers are in flight.
    pub(crate) fn get_blocking(self: &Arc<Self>, at_least: usize) -> Result<IoBuf, Short> {
        loop {
            match self.try_get(at_least) {
                Err(Short::Wait { epoch }) => self.wait_returned(epoch),
                r => return r,
            }
        }
    }

    /// Blocks until a buffer came back after `epoch` (returns at once if one did).
    pub(crate) fn wait_returned(&self, epoch: u64) {
        let mut free = self.free.lock();
        while free.returns == epoch && self.in_flight.load(Ordering::Relaxed) > 0 {
            self.returned.wait(&mut free);
        }
    }

    /// Parks `waker` until a buffer comes back after `epoch`; `false` if one already did (try
    /// again at once).
    pub(crate) fn register_waker(&self, epoch: u64, waker: &Waker) -> bool {
        let mut free = self.free.lock();
        if free.returns != epoch {
            return false;
        }
        if !free.wakers.iter().any(|w| w.will_wake(waker)) {
            free.wakers.push(waker.clone());
        }
        true
    }

    fn wrap(self: &Arc<Self>, map: MmapMut, slot: Option<u16>) -> IoBuf {
        self.out.fetch_add(map.len(), Ordering::Relaxed);
        IoBuf {
            map: Some(map),
            len: 0,
            slot,
            in_flight: false,
            pool: self.clone(),
            block: None,
        }
    }

    /// Takes a buffer back. Its bytes leave `in_flight` under the free-list lock, with the
    /// buffer back in a list: a writer that saw nothing in flight there also sees the buffer.
    fn put(&self, map: MmapMut, slot: Option<u16>, in_flight: bool) {
        let len = map.len();
        let wakers = {
            let mut free = self.free.lock();
            self.out.fetch_sub(len, Ordering::Relaxed);
            if in_flight {
                self.in_flight.fetch_sub(len, Ordering::Relaxed);
            }
            match slot {
                Some(s) => free.slotted.push((map, s)),
                None => {
                    if free.plain.is_empty() {
                        free.plain = (0..self.classes()).map(|_| Vec::new()).collect();
                    }
                    let k = self.class(len);
                    if free.plain[k].len() < self.retain {
                        free.plain[k].push(map);
                    } else {
                        self.mapped.fetch_sub(len, Ordering::Relaxed);
                        drop(map);
                    }
                }
            }
            free.returns += 1;
            std::mem::take(&mut free.wakers)
        };
        self.returned.notify_all();
        for w in wakers {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_4k_to_the_full_size() {
        let p = BufferPool::new(1 << 20, 0, 4, 64 << 20);
        assert_eq!(p.classes(), 9);
        assert_eq!(p.class_size(0), 4096);
        assert_eq!(p.class_size(8), 1 << 20);
        assert_eq!(p.class(4096), 0);
        assert_eq!(p.class(1 << 20), 8);
        let odd = BufferPool::new(12 << 10, 0, 4, 1 << 20);
        assert_eq!(odd.class_size(odd.classes() - 1), 12 << 10);
        let one = BufferPool::new(4096, 0, 4, 1 << 20);
        assert_eq!(one.classes(), 1);
    }

    #[test]
    fn buffers_shrink_as_the_budget_fills_and_never_pass_it() {
        let p = BufferPool::new(1 << 20, 0, 4, 4 << 20);
        let mut held = Vec::new();
        loop {
            match p.try_get(0) {
                Ok(b) => held.push(b),
                Err(Short::Exhausted { budget, held: h }) => {
                    assert_eq!(budget, 4 << 20);
                    assert_eq!(h, 4 << 20);
                    break;
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(held[0].capacity(), 1 << 20);
        assert_eq!(held.last().map(IoBuf::capacity), Some(4096));
        let (budget, mapped, peak) = p.stats();
        assert_eq!((mapped, peak), (budget, budget));
        // A buffer in flight turns "exhausted" into "wait", and its return ends the wait.
        let mut b = held.pop().unwrap();
        b.mark_in_flight();
        let Err(Short::Wait { epoch }) = p.try_get(0) else {
            panic!("expected a wait")
        };
        drop(b);
        p.wait_returned(epoch);
        assert!(p.try_get(0).is_ok());
    }
}

/// Buffers that compressed blocks are decoded into, reused: a reader takes one per compressed
/// block and hands out `Bytes` into it; the last `Bytes` dropped gives it back. Process-wide
/// (readers without an engine use it too), keeping at most [`DECODE_RETAIN`] buffers.
pub(crate) static DECODE_POOL: DecodePool = DecodePool {
    free: parking_lot::const_mutex(Vec::new()),
};

/// Buffers the decode pool keeps for reuse.
pub(crate) const DECODE_RETAIN: usize = 16;

/// See [`DECODE_POOL`].
#[derive(Debug)]
pub(crate) struct DecodePool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl DecodePool {
    /// A zero-filled buffer of `len` bytes (a reused one when there is one large enough).
    pub(crate) fn take(&'static self, len: usize) -> Decoded {
        let mut v = {
            let mut f = self.free.lock();
            match f.iter().position(|b| b.capacity() >= len) {
                Some(i) => f.swap_remove(i),
                None => f.pop().unwrap_or_default(),
            }
        };
        v.clear();
        v.resize(len, 0);
        Decoded { v, pool: self }
    }

    /// Buffers kept now.
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().len()
    }
}

/// A decode buffer; back to its pool on drop. Wrap it in `Bytes::from_owner`.
#[derive(Debug)]
pub(crate) struct Decoded {
    v: Vec<u8>,
    pool: &'static DecodePool,
}

impl Decoded {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.v
    }
}

impl AsRef<[u8]> for Decoded {
    fn as_ref(&self) -> &[u8] {
        &self.v
    }
}

impl Drop for Decoded {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        let mut f = self.pool.free.lock();
        if f.len() < DECODE_RETAIN {
            f.push(v);
        }
    }
}
