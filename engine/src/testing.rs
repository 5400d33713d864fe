//! Hooks for benches and tests outside the crate. Not a stable API.

use std::sync::Arc;

use crate::error::Result;
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

/// Size in bytes of one name-only cleanup record.
pub const CLEANUP_RECORD_BYTES: usize = std::mem::size_of::<crate::store::queue::Record>();

/// What [`parse_segment`] found in a segment buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSegment {
    /// Where each record that parsed has its payload in the buffer, in order.
    pub records: Vec<std::ops::Range<usize>>,
    /// The damage that stopped the parse (offset in the segment, detail), `None` if it reached
    /// the written length.
    pub damage: Option<(u64, &'static str)>,
}

/// Parses segment `segment` of engine `engine` the way a reader does, with the crate's own
/// header and frame parsers: the header, then records (of the header's generation) up to
/// `end`, the segment's written length. `buf` is the file: shorter than `end` if it was truncated, longer if padded.
pub fn parse_segment(buf: &[u8], end: usize, segment: u32, engine: u64) -> ParsedSegment {
    let mut out = ParsedSegment {
        records: Vec::new(),
        damage: None,
    };
    // As the reader maps it: no further than the written length.
    let buf = &buf[..end.min(buf.len())];
    if buf.len() < crate::format::segment::HEADER_LEN {
        out.damage = Some((buf.len() as u64, "segment truncated inside its header"));
        return out;
    }
    match crate::format::segment::parse_header(buf) {
        Err(d) => out.damage = Some((0, d)),
        Ok(h) if h.segment != segment || h.engine != engine => {
            out.damage = Some((0, "header names another segment or engine"));
        }
        Ok(h) => {
            let mut off = crate::format::segment::HEADER_LEN;
            loop {
                match crate::format::segment::next_frame(buf, off, end, h.generation) {
                    Ok(Some(f)) => {
                        out.records.push(f.start..f.end);
                        off = f.end;
                    }
                    Ok(None) => break,
                    Err(d) => {
                        out.damage = Some((d.offset, d.detail));
                        break;
                    }
                }
            }
        }
    }
    out
}

/// A valid segment: the header of segment `segment` of engine `engine` (generation 0), then
/// `records`, framed as the writer frames them.
pub fn encode_segment(segment: u32, engine: u64, records: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::from(crate::format::segment::encode_header(segment, engine, 0));
    for r in records {
        v.extend_from_slice(&crate::format::segment::frame_header(r, 0));
        v.extend_from_slice(r);
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
    let c = engine.fd_cache();
    FdStats {
        max: c.max(),
        open: c.open_count(),
        evictions: c.evictions(),
    }
}
