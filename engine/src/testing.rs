//! Hooks for benches and tests outside the crate. Not a stable API.

use std::sync::Arc;

use bytes::Bytes;

use crate::error::Result;
use crate::format::cursor::{Expected, SegmentCursor};
use crate::io::DECODE_POOL;
use crate::store::ledger::{Ledger, Ticket};

/// A stand-alone ticket ledger, to measure reserve/release.
#[derive(Debug, Clone)]
pub struct LedgerProbe(Arc<Ledger>);

/// A reserved ticket; dropping it releases it.
#[derive(Debug)]
pub struct TicketProbe(#[allow(dead_code)] Ticket);

impl LedgerProbe {
    /// A ledger of `capacity` tickets and an optional byte quota.
    pub fn new(capacity: usize, max_bytes: Option<u64>) -> Self {
        LedgerProbe(Ledger::new(capacity, max_bytes))
    }

    /// Reserves one ticket holding `bytes` of quota.
    pub fn reserve(&self, bytes: u64) -> Result<TicketProbe> {
        self.0.reserve(bytes).map(TicketProbe)
    }

    /// Tickets held now.
    pub fn used(&self) -> usize {
        self.0.used()
    }
}

/// Size in bytes of one name-only cleanup record as the queue stores it (one that does not fit
/// takes twice this; see `store/records.rs`).
pub const CLEANUP_RECORD_BYTES: usize = crate::store::records::SLOT_BYTES;

/// What [`parse_segment`] found in a segment buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSegment {
    /// The records, in order, as the reader hands them out (decoded).
    pub records: Vec<Vec<u8>>,
    /// The damage that stopped the parse (offset in the segment, detail), `None` if it reached
    /// the written length.
    pub damage: Option<(u64, &'static str)>,
}

/// Parses segment `segment` of engine `engine` the way a reader does, with the segment codec
/// every reader walks with (`format/cursor.rs`): the header, then blocks (of the header's
/// generation) up to `end`, the segment's written length, each checked and decoded. `buf` is
/// the file: shorter than `end` if it was truncated, longer if padded.
pub fn parse_segment(buf: &[u8], end: usize, segment: u32, engine: u64) -> ParsedSegment {
    let mut records = Vec::new();
    let damage = parse_into(&mut records, buf, end, segment, engine).err();
    ParsedSegment { records, damage }
}

/// [`parse_segment`]'s walk: the records into `records`, the damage as the error.
fn parse_into(
    records: &mut Vec<Vec<u8>>,
    buf: &[u8],
    end: usize,
    segment: u32,
    engine: u64,
) -> std::result::Result<(), (u64, &'static str)> {
    // As the reader maps it: no further than the written length.
    let buf = Bytes::copy_from_slice(&buf[..end.min(buf.len())]);
    let want = Expected {
        segment: Some(segment),
        engine: Some(engine),
        ..Expected::default()
    };
    let mut c = SegmentCursor::open(&buf, end as u64, want, &DECODE_POOL)
        .map_err(|d| (d.offset, d.detail))?;
    while let Some(r) = c
        .next_in(&buf, None, None)
        .map_err(|d| (d.offset, d.detail))?
    {
        records.push(r.to_vec());
    }
    Ok(())
}

/// A valid segment: the header of segment `segment` of engine `engine` (generation 0), then
/// `records` in one raw block, framed as the writer frames them.
pub fn encode_segment(segment: u32, engine: u64, records: &[&[u8]]) -> Vec<u8> {
    encode_segment_blocks(segment, engine, 0, &[(records, 0)])
}

/// A valid segment of use `generation`: one block per entry of `blocks`, each its records and
/// its codec (0 raw, 1 lz4, 2 zstd level 1; stored raw if the codec does not shrink them).
pub fn encode_segment_blocks(
    segment: u32,
    engine: u64,
    generation: u32,
    blocks: &[(&[&[u8]], u8)],
) -> Vec<u8> {
    use crate::format::block::{self, Binding, Codec};
    let mut v = Vec::from(crate::format::segment::encode_header(
        segment, engine, generation, 0,
    ));
    let bind = Binding {
        segment,
        generation,
        engine,
    };
    for (records, codec) in blocks {
        let mut raw = Vec::new();
        for r in *records {
            raw.extend_from_slice(&block::record_frame(r.len()));
            raw.extend_from_slice(r);
        }
        let codec = match codec {
            1 => Codec::Lz4,
            2 => Codec::Zstd(1),
            _ => Codec::Raw,
        };
        let mut dst = vec![0u8; raw.len()];
        let raw_len = raw.len() as u64;
        let (codec, mut stored) = match block::compress(codec, &raw, &mut dst) {
            Some(n) => {
                dst.truncate(n);
                (codec, dst)
            }
            None => (Codec::Raw, raw),
        };
        let (off, n) = (v.len() as u64, records.len() as u32);
        let h = block::seal_in_place(None, bind, off, codec, raw_len, n, 0, false, &mut stored);
        v.extend_from_slice(&h);
        v.extend_from_slice(&stored);
    }
    v
}

/// The engine's bound on writers' segment fds (`max_open_files`), as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdStats {
    /// The bound.
    pub max: usize,
    /// Counted segment fds open now (cached by writers or held by writes in flight).
    pub open: usize,
    /// Idle fds closed by the bound (or after EMFILE/ENFILE from the OS) so far.
    pub evictions: u64,
}

/// The state of `engine`'s fd bound.
pub fn fd_stats(engine: &crate::Engine) -> FdStats {
    let c = engine.io().fds();
    FdStats {
        max: c.max(),
        open: c.open_count(),
        evictions: c.evictions(),
    }
}

/// The engine's staging buffer budget (`max_buffer_memory`), as it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferStats {
    /// The budget.
    pub budget: usize,
    /// Bytes of staging buffers mapped now (held by writers, in flight, or free in the pool).
    pub mapped: usize,
    /// The most ever mapped at once.
    pub peak: usize,
    /// Bytes of buffers out of the pool now: held by writers, queued in their codec stages
    /// (compressing or waiting to be written), or in flight.
    pub held: usize,
}

/// The state of `engine`'s staging buffer budget.
pub fn buffer_stats(engine: &crate::Engine) -> BufferStats {
    let (budget, mapped, peak, held) = engine.io().pool().stats();
    BufferStats {
        budget,
        mapped,
        peak,
        held,
    }
}

/// Segment maps kept with pooled files now, and their mapped bytes (within
/// `max_read_memory`; see `io/keptmap.rs`).
pub fn kept_maps(engine: &crate::Engine) -> (usize, u64) {
    engine.io().kept_maps().held()
}

/// Ops the I/O lanes' channels have room for now, summed over the lanes (0: a submit to any
/// of them finds it full).
pub fn lane_room(engine: &crate::Engine) -> usize {
    engine.io().lane_room()
}

/// Turns the cooperative yielding of async calls (`spill/budget.rs`) on or off for the whole
/// process: for the yielding bench to compare throughput with and without it. On by default.
pub fn set_cooperative_yield(on: bool) {
    crate::spill::budget::set_yielding(on);
}

/// Decode buffers the process-wide decode pool keeps now (compressed blocks' records give
/// theirs back when the last one is dropped).
pub fn decode_buffers_kept() -> usize {
    crate::io::DECODE_POOL.kept()
}

/// Bytes (capacity) the process-wide decode pool keeps now: at most 64 MiB, and none once
/// the last engine was dropped.
pub fn decode_bytes_kept() -> usize {
    crate::io::DECODE_POOL.kept_bytes()
}
