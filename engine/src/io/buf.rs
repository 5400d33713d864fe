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

use bytes::Bytes;
use memmap2::MmapMut;
use parking_lot::{Condvar, Mutex};

use crate::config::DIRECT_ALIGN;
use crate::fault::{FaultPlan, Injected, fault_point};
use crate::format::block::{BLOCK_HEADER_LEN, BlockSeal, record_frame};
use crate::format::segment::FRAME_LEN;

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
    /// The block (format v3) open in this buffer: where its header is reserved and how many
    /// records it holds so far; sealed when the buffer is written.
    pub block: Option<OpenBlock>,
    /// What the I/O thread that writes the buffer does first ([`IoBuf::apply_fills`]): the
    /// copies of a large record's parts counted in `len` but not made yet, and a large
    /// record's block header to finish, so the producer's thread does neither.
    pub(super) fills: Fills,
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

    /// What a write of it takes: its length, padded to the direct-I/O alignment (within its
    /// capacity) if `pad`.
    pub(crate) fn write_len(&self, pad: bool) -> usize {
        if pad {
            self.len.next_multiple_of(DIRECT_ALIGN).min(self.capacity())
        } else {
            self.len
        }
    }

    /// Appends `src[src_at..src_at + len]` (the caller checked it fits) as a deferred copy,
    /// made by [`IoBuf::apply_fills`] before the buffer is written; copies it now when the
    /// buffer holds as many deferred copies as it can already. Nothing may read these bytes
    /// before.
    pub(crate) fn push_deferred(&mut self, src: &bytes::Bytes, src_at: usize, len: usize) {
        if self.fills.copy_later(src, src_at, self.len, len) {
            self.len += len;
        } else {
            self.push(&src[src_at..src_at + len]);
        }
    }

    /// Leaves the checksum of the block whose header is at `at` (pushed or about to be, all in
    /// this buffer) to the thread that writes the buffer: `seal` takes all of `src` there and
    /// the header is written over what was pushed. `Err(seal)` when the buffer has one such
    /// header already: the caller finishes it itself.
    pub(crate) fn defer_seal(
        &mut self,
        src: &bytes::Bytes,
        at: usize,
        seal: BlockSeal,
    ) -> Result<(), BlockSeal> {
        if at + BLOCK_HEADER_LEN > self.capacity() {
            return Err(seal);
        }
        self.fills.seal_later(src, at, seal)
    }

    /// The buffer holds deferred work ([`IoBuf::apply_fills`] copies or checksums bytes).
    pub(crate) fn has_fills(&self) -> bool {
        !self.fills.is_empty()
    }

    /// Makes the deferred copies and finishes the deferred block header (on the thread that
    /// writes the buffer).
    pub(crate) fn apply_fills(&mut self) {
        if let Some(m) = self.map.as_mut() {
            self.fills.apply(&mut m[..]);
        }
    }

    /// Ends the block's growing record, if it has one: its frame gets the length of what was
    /// pushed after it. Called before anything else goes into the block and when it is sealed.
    pub(crate) fn end_open_record(&mut self) {
        if let Some(at) = self.block.as_mut().and_then(|b| b.open_record.take()) {
            let len = self.len - at - FRAME_LEN;
            self.space()[at..at + FRAME_LEN].copy_from_slice(&record_frame(len));
        }
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
    /// Where the frame of a record still growing sits (`SpillWriter::append`: a byte stream
    /// cut into records); its length is written when it ends ([`IoBuf::end_open_record`]).
    pub open_record: Option<usize>,
    /// A chunk of a record larger than a buffer (`format::block::FLAG_CHUNK`).
    pub chunk: bool,
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
pub(crate) enum NoBuffer {
    /// The budget is full but a buffer is in flight: it comes back when its write completes
    /// ([`BufferPool::wait_returned`] / [`BufferPool::register_waker`]). `epoch` is the count
    /// of returns seen before the attempt.
    Wait { epoch: u64 },
    /// The budget is full and nothing is in flight: every buffer is held by an open writer.
    Exhausted { budget: usize, held: usize },
    /// Mapping failed.
    Io(io::Error),
}

/// Why [`BufferPool::get_blocking`], which waits for a buffer in flight, gave none.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The budget is full and nothing is in flight: every buffer is held by an open writer.
    Exhausted { budget: usize, held: usize },
    /// Mapping failed.
    Io(io::Error),
}

/// What [`BufferPool::try_take`] found. A value that lives for one call: boxing the buffer
/// would allocate on every take of a free buffer, the hot path's.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Taken {
    /// A free buffer.
    Free(IoBuf),
    /// Room in the budget for a buffer still to map.
    Map(Mapping),
}

/// A buffer to map, its bytes counted in the budget (given back if it is dropped unmapped),
/// with the free buffers unmapped to make room for it.
#[derive(Debug)]
pub(crate) struct Mapping {
    pool: Arc<BufferPool>,
    len: usize,
    full: bool,
    victims: Vec<MmapMut>,
    /// Its bytes are still counted here (not yet handed to a map).
    counted: bool,
}

impl Mapping {
    /// Unmaps the free buffers it took and maps the new one (faulting its pages in if
    /// `populate`). Blocking: on a thread that may (a blocking writer's, the offload pool).
    pub(crate) fn map(mut self, populate: bool) -> io::Result<IoBuf> {
        self.victims.clear();
        self.counted = false;
        self.pool.map_new(self.len, self.full, populate)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.counted {
            self.pool.mapped.fetch_sub(self.len, Ordering::Relaxed);
        }
    }
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
    /// The engine's fault plan: fault point `buffer::map` is every map of a fresh buffer.
    fault: Option<Arc<FaultPlan>>,
}

impl BufferPool {
    /// A pool of buffers of up to `size` bytes (a power-of-two multiple of 4 KiB or not: the
    /// largest is always `size`), mapping at most `budget` bytes.
    #[cfg(test)]
    pub(crate) fn new(size: usize, max_slots: usize, retain: usize, budget: usize) -> Arc<Self> {
        Self::with_faults(size, max_slots, retain, budget, None)
    }

    /// [`BufferPool::new`], its maps of fresh buffers going through fault point `buffer::map`
    /// of `fault`.
    pub(crate) fn with_faults(
        size: usize,
        max_slots: usize,
        retain: usize,
        budget: usize,
        fault: Option<Arc<FaultPlan>>,
    ) -> Arc<Self> {
        Arc::new(BufferPool {
            fault,
            size,
            max_slots,
            retain,
            budget: budget.max(size),
            // Room for every slot up front: a return never grows the list on a writer's path.
            free: Mutex::new(Free {
                slotted: Vec::with_capacity(max_slots),
                ..Free::default()
            }),
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

    /// The budget, bytes mapped now, the most ever mapped at once, and bytes of buffers out
    /// of the pool now.
    pub(crate) fn stats(&self) -> (usize, usize, usize, usize) {
        (
            self.budget,
            self.mapped.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
            self.out.load(Ordering::Relaxed),
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

    /// The free lists of unregistered buffers, one per size class, each with room for as many
    /// buffers of its size as can ever be free at once (the budget's worth, up to `retain`):
    /// a burst of returns never grows a list on an I/O thread.
    fn plain_lists(&self) -> Vec<Vec<MmapMut>> {
        (0..self.classes())
            .map(|k| Vec::with_capacity((self.budget / self.class_size(k)).min(self.retain)))
            .collect()
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
    pub(crate) fn try_get(self: &Arc<Self>, at_least: usize) -> Result<IoBuf, NoBuffer> {
        match self.try_take(at_least)? {
            Taken::Free(b) => Ok(b),
            Taken::Map(m) => m.map(false).map_err(NoBuffer::Io),
        }
    }

    /// As [`BufferPool::try_get`], but a buffer that must first be mapped comes as a
    /// [`Mapping`] (its bytes already counted in the budget) for the caller to map where it
    /// may block: an async writer maps it on the offload pool, never in its poll (an `mmap`
    /// or `munmap` takes the process's mmap lock for writing, which waits for every other
    /// thread's page fault and map; the first touch of fresh pages waits for the same lock).
    pub(crate) fn try_take(self: &Arc<Self>, at_least: usize) -> Result<Taken, NoBuffer> {
        self.take_locked(self.free.lock(), at_least)
    }

    /// As [`BufferPool::try_take`], for an async caller's poll: `None` if the free-list lock
    /// is held (a write's buffer coming back on an I/O thread), where `try_take` would wait
    /// for it, and park the thread if its holder was preempted. The caller wakes its task to
    /// look again.
    pub(crate) fn try_take_now(
        self: &Arc<Self>,
        at_least: usize,
    ) -> Option<Result<Taken, NoBuffer>> {
        let free = self.free.try_lock()?;
        Some(self.take_locked(free, at_least))
    }

    fn take_locked(
        self: &Arc<Self>,
        mut free: parking_lot::MutexGuard<'_, Free>,
        at_least: usize,
    ) -> Result<Taken, NoBuffer> {
        let epoch = free.returns;
        if free.plain.is_empty() {
            free.plain = self.plain_lists();
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
            return Ok(Taken::Free(self.wrap(map, Some(slot))));
        }
        if let Some(map) = free.plain[want].pop() {
            return Ok(Taken::Free(self.wrap(map, None)));
        }
        // Map one of the size asked or smaller (not below `floor`), making room by unmapping
        // free buffers.
        let mut victims = Vec::new();
        for k in (floor..=want).rev() {
            let len = self.class_size(k);
            if self.make_room(&mut free, len, &mut victims) {
                return Ok(Taken::Map(Mapping {
                    pool: self.clone(),
                    len,
                    full: k == top,
                    victims,
                    counted: true,
                }));
            }
        }
        // Free buffers taken out for room that did not come (no longer counted) are
        // unmapped after the lock.
        let r = self.any_free(&mut free, floor, epoch);
        drop(free);
        drop(victims);
        r
    }

    /// Any free buffer of at least class `floor`, else why there is none.
    fn any_free(
        self: &Arc<Self>,
        free: &mut Free,
        floor: usize,
        epoch: u64,
    ) -> Result<Taken, NoBuffer> {
        if let Some((map, slot)) = free.slotted.pop() {
            return Ok(Taken::Free(self.wrap(map, Some(slot))));
        }
        for k in floor..self.classes() {
            if let Some(map) = free.plain[k].pop() {
                return Ok(Taken::Free(self.wrap(map, None)));
            }
        }
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            Err(NoBuffer::Wait { epoch })
        } else {
            Err(NoBuffer::Exhausted {
                budget: self.budget,
                held: self.out.load(Ordering::Relaxed),
            })
        }
    }

    /// Counts `len` more bytes mapped if they fit the budget, taking free unregistered buffers
    /// (largest first) out of the pool into `victims` to make room (the caller unmaps them,
    /// outside the lock); `false` if they cannot fit.
    fn make_room(&self, free: &mut Free, len: usize, victims: &mut Vec<MmapMut>) -> bool {
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
            victims.push(victim);
        }
    }

    /// Maps a buffer of `len` bytes already counted in `mapped` (its pages faulted in now if
    /// `populate`).
    fn map_new(self: &Arc<Self>, len: usize, full: bool, populate: bool) -> io::Result<IoBuf> {
        let injected = match fault_point!(BufferMap, self.fault) {
            Injected::Fail(errno) => Err(io::Error::from_raw_os_error(errno)),
            _ => Ok(()),
        };
        let mut map = match injected.and_then(|()| MmapMut::map_anon(len)) {
            Ok(m) => m,
            Err(e) => {
                self.mapped.fetch_sub(len, Ordering::Relaxed);
                return Err(e);
            }
        };
        if populate {
            // One write per page, not `MAP_POPULATE`: a populate holds the process's mmap lock
            // (shared) until every page is in, and a thread that needs it exclusively (an
            // `mmap`, a malloc arena growing by `mprotect`) waits behind it, with whatever lock
            // it holds (a malloc arena's); each fault here takes only its VMA's lock.
            for b in map.iter_mut().step_by(MIN_BUFFER) {
                *std::hint::black_box(b) = 0;
            }
        }
        let slot = if full && self.next_slot.load(Ordering::Relaxed) < self.max_slots {
            let s = self.next_slot.fetch_add(1, Ordering::Relaxed);
            (s < self.max_slots).then_some(s as u16)
        } else {
            None
        };
        Ok(self.wrap(map, slot))
    }

    /// A buffer for a caller that can block: waits while buffers are in flight. A fresh one
    /// has its pages faulted in here if `populate` (an async writer's rotation takes its
    /// buffer on the offload pool: the writer's poll then never faults on it).
    pub(crate) fn get_blocking(
        self: &Arc<Self>,
        at_least: usize,
        populate: bool,
    ) -> Result<IoBuf, Refused> {
        loop {
            match self.try_take(at_least) {
                Err(NoBuffer::Wait { epoch }) => self.wait_returned(epoch),
                Ok(Taken::Free(b)) => return Ok(b),
                Ok(Taken::Map(m)) => return m.map(populate).map_err(Refused::Io),
                Err(NoBuffer::Exhausted { budget, held }) => {
                    return Err(Refused::Exhausted { budget, held });
                }
                Err(NoBuffer::Io(e)) => return Err(Refused::Io(e)),
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
    /// Never waits for the free-list lock: if it is held, the waker is woken at once (the
    /// caller looks again) and this returns `true`, as if parked.
    pub(crate) fn register_waker(&self, epoch: u64, waker: &Waker) -> bool {
        let Some(mut free) = self.free.try_lock() else {
            waker.wake_by_ref();
            return true;
        };
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
            fills: Fills::default(),
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
                        free.plain = self.plain_lists();
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

// ---- Fills ----
//
// What a staging buffer leaves to the thread that writes it (write-behind of the producer's
// work on a large record): copies of the record's parts into the buffer, and the checksum of
// the record's block with the header it completes. The writer counts these bytes as placed;
// nothing reads them before the buffer's writer applies them ([`Fills::apply`]), and a buffer
// dropped unwritten lets go of the records it referenced.

/// Deferred copies one buffer holds at most (the rest are copied at once): a buffer of large
/// records holds the tail of one and the head of the next.
pub(super) const FILLS: usize = 2;

/// A buffer's deferred work.
#[derive(Default)]
pub(crate) struct Fills {
    copies: [Option<DeferredCopy>; FILLS],
    /// At most one block header to finish: a buffer holds the header of one large record
    /// (one that does not fit a buffer) in the common case; a second is sealed at once.
    seal: Option<SealLater>,
}

/// A deferred copy of `src[src_at..src_at + len]` to the buffer's offset `at`.
struct DeferredCopy {
    src: Bytes,
    src_at: usize,
    /// Offset and length in the buffer (a buffer is smaller than 4 GiB: `io_buffer_size`).
    at: u32,
    len: u32,
}

/// A block header to finish: `seal` (its fields and the frame already in it) takes the
/// checksum of all of `src`, and the header goes to the buffer's offset `at`.
struct SealLater {
    src: Bytes,
    at: u32,
    seal: BlockSeal,
}

impl Fills {
    /// Takes a copy of `src[src_at..src_at + len]` to offset `at` for later; `false` when
    /// the slots are full or the offset is past `u32` (copy it now).
    pub(super) fn copy_later(&mut self, src: &Bytes, src_at: usize, at: usize, len: usize) -> bool {
        match self.copies.iter_mut().find(|f| f.is_none()) {
            Some(slot) if at + len <= u32::MAX as usize => {
                *slot = Some(DeferredCopy {
                    src: src.clone(),
                    src_at,
                    at: at as u32,
                    len: len as u32,
                });
                true
            }
            _ => false,
        }
    }

    /// Takes the finishing of a block header at `at` for later; `Err(seal)` when one is
    /// taken already or the offset is past `u32`.
    pub(super) fn seal_later(
        &mut self,
        src: &Bytes,
        at: usize,
        seal: BlockSeal,
    ) -> Result<(), BlockSeal> {
        if self.seal.is_some() || at > u32::MAX as usize {
            return Err(seal);
        }
        self.seal = Some(SealLater {
            src: src.clone(),
            at: at as u32,
            seal,
        });
        Ok(())
    }

    /// Nothing is deferred: [`Fills::apply`] would do nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.copies.iter().all(Option::is_none) && self.seal.is_none()
    }

    /// Makes the copies and writes the finished header into `space` (the whole buffer).
    pub(super) fn apply(&mut self, space: &mut [u8]) {
        for slot in &mut self.copies {
            if let Some(f) = slot.take() {
                let (at, len) = (f.at as usize, f.len as usize);
                space[at..at + len].copy_from_slice(&f.src[f.src_at..f.src_at + len]);
            }
        }
        if let Some(SealLater { src, at, seal }) = self.seal.take() {
            let at = at as usize;
            space[at..at + BLOCK_HEADER_LEN].copy_from_slice(&seal.finish_over(&src));
        }
    }

    /// Deferred copies held.
    #[cfg(test)]
    pub(super) fn copies(&self) -> usize {
        self.copies.iter().filter(|f| f.is_some()).count()
    }

    /// A block header waits to be finished.
    #[cfg(test)]
    pub(super) fn has_seal(&self) -> bool {
        self.seal.is_some()
    }
}

#[cfg(test)]
#[path = "buf_tests.rs"]
mod tests;
