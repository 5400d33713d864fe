//! The cleanup queue's storage: name-only records packed into eight bytes each, held in
//! fixed chunks of 1 KiB, so the queue grows one chunk at a time and never doubles.
//!
//! A slot is a `u64`: the segment number in the low 32 bits, then the quota pages in 24 bits
//! and the directory index in the top 8. A record whose directory index is 255 or more, or
//! whose ticket holds 2^24 pages (64 GiB) or more, does not fit: it is stored wide, in two
//! slots (the first marked by directory field 255, the second holding the directory index and
//! the pages whole), never truncated. When a record was queued is kept per chunk: the oldest
//! time of any record put into the chunk, which is what the oldest-age metric needs; a record
//! read back carries its chunk's time (never younger than its own).

use std::collections::VecDeque;

use super::queue::Record;

/// Slots per chunk: 128 × 8 bytes = 1 KiB (the most a queue holds beyond its records, with
/// one spare chunk, is two chunks and the 16-byte header of each chunk).
pub(crate) const CHUNK_SLOTS: usize = 128;
/// Bytes a record takes in the queue (one slot), unless it is stored wide (two).
pub(crate) const SLOT_BYTES: usize = std::mem::size_of::<u64>();
const PAGE_BITS: u32 = 24;
/// The directory field that marks a wide record (no compact record has it).
const WIDE: u64 = 0xff;

/// One record as one slot, or as two when a field does not fit. The fields are put together
/// with `+` (their bits never overlap, so it is `|`; an overflow would panic in tests, where a
/// `|` would not show a wrong shift).
fn encode(r: &Record) -> (u64, Option<u64>) {
    let seg = u64::from(r.seg);
    if u64::from(r.dir) < WIDE && u64::from(r.pages) < 1 << PAGE_BITS {
        let packed = (u64::from(r.dir) << PAGE_BITS) + u64::from(r.pages);
        (seg + (packed << 32), None)
    } else {
        let first = seg + (WIDE << (32 + PAGE_BITS));
        (first, Some((u64::from(r.dir) << 32) + u64::from(r.pages)))
    }
}

/// The slots a record starting with `first` takes (1 or 2).
fn width(first: u64) -> usize {
    if first >> (32 + PAGE_BITS) == WIDE {
        2
    } else {
        1
    }
}

/// The record at the start of `slots` (which holds `width(slots[0])` slots), queued at `since`.
fn decode(slots: &[u64], since: u32) -> Record {
    let first = slots[0];
    let seg = first as u32;
    let (dir, pages) = if width(first) == 2 {
        ((slots[1] >> 32) as u32, slots[1] as u32)
    } else {
        let packed = first >> 32;
        (
            (packed >> PAGE_BITS) as u32,
            (packed & ((1 << PAGE_BITS) - 1)) as u32,
        )
    };
    Record {
        dir,
        seg,
        pages,
        since,
    }
}

#[derive(Debug)]
struct Chunk {
    /// The oldest `since` of any record put into this chunk.
    since: u32,
    /// Slots taken from the front.
    head: u16,
    /// Slots filled.
    end: u16,
    slots: Box<[u64; CHUNK_SLOTS]>,
}

impl Chunk {
    fn slots(&self) -> &[u64] {
        &self.slots[usize::from(self.head)..usize::from(self.end)]
    }
}

/// Records in order, oldest first, in chunks (see the module's doc).
#[derive(Debug, Default)]
pub(crate) struct RecordChunks {
    chunks: VecDeque<Chunk>,
    /// One emptied chunk kept for the next push, so a queue that fills and drains around a
    /// chunk boundary does not allocate each time.
    spare: Option<Box<[u64; CHUNK_SLOTS]>>,
    len: usize,
}

impl RecordChunks {
    /// An empty queue whose chunk list has room for `records` compact records, so it never
    /// reallocates below that (the ledger's capacity bounds the file records).
    pub(crate) fn with_room_for(records: usize) -> Self {
        RecordChunks {
            chunks: VecDeque::with_capacity(records.div_ceil(CHUNK_SLOTS) + 1),
            ..Self::default()
        }
    }

    /// Records queued.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Chunks the chunk list has room for without reallocating (for tests).
    #[cfg(test)]
    fn list_capacity(&self) -> usize {
        self.chunks.capacity()
    }

    /// Chunks allocated, the spare included (for tests of the memory bound).
    #[cfg(test)]
    fn chunks_held(&self) -> usize {
        self.chunks.len() + usize::from(self.spare.is_some())
    }

    /// Appends a record.
    pub(crate) fn push_back(&mut self, r: Record) {
        let (first, second) = encode(&r);
        let need = 1 + usize::from(second.is_some());
        let room = self
            .chunks
            .back()
            .is_some_and(|c| usize::from(c.end) + need <= CHUNK_SLOTS);
        if !room {
            let slots = self
                .spare
                .take()
                .unwrap_or_else(|| Box::new([0; CHUNK_SLOTS]));
            self.chunks.push_back(Chunk {
                since: r.since,
                head: 0,
                end: 0,
                slots,
            });
        }
        let Some(c) = self.chunks.back_mut() else {
            unreachable!("a chunk was just pushed")
        };
        let at = usize::from(c.end);
        c.slots[at] = first;
        if let Some(s) = second {
            c.slots[at + 1] = s;
        }
        c.end += need as u16;
        c.since = c.since.min(r.since);
        self.len += 1;
    }

    /// Takes the oldest record.
    pub(crate) fn pop_front(&mut self) -> Option<Record> {
        let c = self.chunks.front_mut()?;
        let slots = c.slots();
        let w = width(slots[0]);
        let r = decode(slots, c.since);
        c.head += w as u16;
        if c.head == c.end
            && let Some(done) = self.chunks.pop_front()
        {
            self.spare = Some(done.slots);
        }
        self.len -= 1;
        Some(r)
    }

    /// The records in order, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Record> + '_ {
        self.chunks.iter().flat_map(|c| {
            let mut slots = c.slots();
            std::iter::from_fn(move || {
                let first = *slots.first()?;
                let r = decode(slots, c.since);
                slots = &slots[width(first)..];
                Some(r)
            })
        })
    }

    /// The oldest `since` of any record queued (per chunk: one look per 128 records).
    pub(crate) fn oldest_since(&self) -> Option<u32> {
        self.chunks.iter().map(|c| c.since).min()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn rec(dir: u32, seg: u32, pages: u32, since: u32) -> Record {
        Record {
            dir,
            seg,
            pages,
            since,
        }
    }

    #[test]
    fn a_record_that_fits_takes_one_slot_and_comes_back_whole() {
        for r in [
            rec(0, 0, 0, 7),
            rec(254, u32::MAX, (1 << 24) - 1, 7),
            rec(3, 12345, 16, 7),
        ] {
            let (first, second) = encode(&r);
            assert_eq!(second, None, "{r:?} fits one slot");
            assert_eq!(width(first), 1);
            assert_eq!(decode(&[first], 7), r);
        }
    }

    #[test]
    fn a_record_that_does_not_fit_takes_two_slots_and_is_never_truncated() {
        for r in [
            rec(255, 1, 1, 0),
            rec(u32::MAX, 2, 2, 0),
            rec(1, 3, 1 << 24, 0),
            rec(u32::MAX, u32::MAX, u32::MAX, 0),
        ] {
            let (first, second) = encode(&r);
            let second = second.unwrap_or_else(|| panic!("{r:?} must be wide"));
            assert_eq!(width(first), 2);
            assert_eq!(decode(&[first, second], 0), r);
        }
    }

    #[test]
    fn records_come_out_in_order_across_chunks_with_their_chunks_time() {
        let mut q = RecordChunks::with_room_for(2000);
        assert!(q.is_empty() && q.pop_front().is_none() && q.oldest_since().is_none());
        let all: Vec<Record> = (0..1500u32)
            // Every seventh is wide; the pages vary.
            .map(|i| rec(if i % 7 == 0 { 300 + i } else { i % 5 }, i, i * 3, 10))
            .collect();
        for r in &all {
            q.push_back(*r);
        }
        assert_eq!(q.len(), 1500);
        assert_eq!(q.iter().collect::<Vec<_>>(), all);
        assert_eq!(q.oldest_since(), Some(10));
        for (i, r) in all.iter().enumerate() {
            assert_eq!(q.pop_front().as_ref(), Some(r), "record {i}");
            assert_eq!(q.len(), all.len() - i - 1);
        }
        assert!(q.is_empty() && q.pop_front().is_none());
        assert_eq!(q.chunks_held(), 1, "only the spare is kept");
    }

    #[test]
    fn the_chunk_list_is_reserved_up_front_and_never_reallocates_within_it() {
        let mut q = RecordChunks::with_room_for(1000);
        let cap = q.list_capacity();
        assert!(cap > 1000usize.div_ceil(CHUNK_SLOTS), "{cap}");
        for i in 0..1000 {
            q.push_back(rec(1, i, 1, 0));
        }
        assert_eq!(
            q.list_capacity(),
            cap,
            "no reallocation within the reservation"
        );
    }

    #[test]
    fn growth_is_one_chunk_at_a_time_and_a_wide_record_never_straddles_two() {
        let mut q = RecordChunks::default();
        for i in 0..CHUNK_SLOTS as u32 {
            q.push_back(rec(1, i, 1, 0));
        }
        assert_eq!(
            q.chunks_held(),
            1,
            "128 compact records fill one 1 KiB chunk"
        );
        q.push_back(rec(1, CHUNK_SLOTS as u32, 1, 0));
        assert_eq!(q.chunks_held(), 2);
        // Fill the second chunk up to one free slot, then a wide record opens a third.
        for i in 0..(CHUNK_SLOTS as u32 - 2) {
            q.push_back(rec(1, 1000 + i, 1, 0));
        }
        assert_eq!(q.chunks_held(), 2);
        let wide = rec(999, 77, 1 << 30, 0);
        q.push_back(wide);
        assert_eq!(q.chunks_held(), 3);
        assert_eq!(q.iter().last(), Some(wide));
        assert_eq!(q.len(), 2 * CHUNK_SLOTS);
    }

    #[test]
    fn a_chunk_keeps_its_oldest_time_and_an_emptied_chunk_is_reused() {
        let mut q = RecordChunks::default();
        q.push_back(rec(1, 1, 1, 50));
        // Put back an older record (a failed batch's): the chunk's time is the older one.
        q.push_back(rec(1, 2, 1, 20));
        q.push_back(rec(1, 3, 1, 90));
        assert_eq!(q.oldest_since(), Some(20));
        assert!(q.iter().all(|r| r.since == 20));
        while q.pop_front().is_some() {}
        assert_eq!(q.oldest_since(), None, "no chunk left");
        assert_eq!(q.chunks_held(), 1, "the emptied chunk is the spare");
        q.push_back(rec(1, 4, 1, 95));
        assert_eq!(q.chunks_held(), 1, "the spare serves the next push");
        assert_eq!(
            q.pop_front(),
            Some(rec(1, 4, 1, 95)),
            "a reused chunk takes the new time"
        );
    }
}
