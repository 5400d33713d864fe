//! PendingRecord a record: planned (the segment with room for it open, `plan`), then into the open
//! block of the staging buffer, or as a block of its own: a vectored write of its prefix
//! (block header + frame) and the caller's `Bytes` (buffered mode), or copied through staging
//! buffers (direct mode, or encrypted), its large parts and its checksum left to the I/O
//! thread that writes them. The building is the block builder's (`block.rs`), the writing the
//! segment sink's (`sink.rs`).

use std::task::Poll;

use bytes::Bytes;

use super::block::{
    DEFER_MIN, Fit, count_block, large_encrypted, large_prefix, large_prefix_unsealed, quota_fill,
};
use super::stage::Until;
use super::{SpillWriter, Wait, drive};
use crate::config::{Compression, DIRECT_ALIGN};
use crate::error::Result;
use crate::format::block::{self, BLOCK_HEADER_LEN, BlockSeal, Codec, LARGE_PREFIX_LEN};
use crate::format::segment::{self, FRAME_LEN, HEADER_LEN};
use crate::io::{Op, OpKind, WriteData};
use crate::metrics::Counters;

/// The least room a chunk is opened in (less: the buffer is written first).
const CHUNK_MIN: usize = 4096;
/// Bytes of a large record tried with the codec before it is cut into chunks.
const CHUNK_SAMPLE: usize = 64 << 10;

/// A record being placed, kept by the call placing it across `Pending` (an async write resumes
/// where it stopped).
pub(super) struct PendingRecord {
    rec: Bytes,
    stage: Stage,
}

/// Where a record's placement is.
enum Stage {
    /// Not planned yet. `vectored`: asked to go out from the caller's `Bytes` (buffered mode, a
    /// record of `large_record_threshold` or more).
    New { vectored: bool },
    /// Planned, into the open block of a staging buffer.
    InBlock,
    /// A block of its own, its offset not known yet (the open block is written first).
    Own { vectored: bool },
    /// Its prefix made with the block header blank: the checksum over the record is left to
    /// the I/O thread that writes the buffer, or taken here (`place_seal`); then copied.
    Seal {
        prefix: [u8; LARGE_PREFIX_LEN],
        seal: BlockSeal,
    },
    /// Copied through staging buffers: `done` bytes of prefix + record placed.
    Copy {
        prefix: [u8; LARGE_PREFIX_LEN],
        done: usize,
    },
    /// A vectored write of prefix + record, from the caller's `Bytes`.
    Vectored { prefix: [u8; LARGE_PREFIX_LEN] },
    /// A block of its own, placed (its bytes staged, or its write submitted): counted next.
    Placed,
    /// Compressed in chunks, each a block of its own, compressed and sealed as a buffer's
    /// block is (the codec stage, `stage.rs`): `done` bytes of frame + record placed.
    Chunks { done: usize },
}

impl PendingRecord {
    pub(super) fn new(rec: Bytes, vectored: bool) -> Self {
        PendingRecord {
            rec,
            stage: Stage::New { vectored },
        }
    }
}

impl SpillWriter {
    /// True when a record of `len` bytes fits an empty full-size staging buffer's block.
    fn fits_block(&self, len: usize) -> bool {
        HEADER_LEN + BLOCK_HEADER_LEN + FRAME_LEN + len <= self.ctx.core.io.pool().buffer_capacity()
    }

    /// Places `p`; `Pending` only for async waits, with its progress in `p`.
    pub(super) fn place(
        &mut self,
        p: &mut PendingRecord,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        let len = p.rec.len();
        loop {
            let next = match &mut p.stage {
                Stage::New { vectored } => {
                    // With a codec, a record that fits a block goes into one (to be
                    // compressed) rather than out as a vectored raw write; so does every such
                    // record when encrypting (a vectored write is the caller's plaintext).
                    let vectored = *vectored
                        && !((!matches!(self.blocks.codec.mode, Compression::None)
                            || self.ctx.core.key.is_some())
                            && self.fits_block(len));
                    let own = vectored || !self.fits_block(len);
                    let chunked = !self.fits_block(len) && self.chunks_pay(&p.rec);
                    let need = if chunked {
                        // Each chunk may be a raw block, padded in direct mode, with a header.
                        let cap = self.ctx.core.io.pool().buffer_capacity() - HEADER_LEN;
                        let chunks = (FRAME_LEN + len).div_ceil(cap - BLOCK_HEADER_LEN) + 1;
                        FRAME_LEN + len + chunks * (BLOCK_HEADER_LEN + DIRECT_ALIGN)
                    } else if own {
                        LARGE_PREFIX_LEN + len + DIRECT_ALIGN
                    } else {
                        BLOCK_HEADER_LEN + FRAME_LEN + len
                    };
                    ready_ok!(self.plan(need as u64, wait));
                    if chunked {
                        Stage::Chunks { done: 0 }
                    } else if own {
                        Stage::Own { vectored }
                    } else {
                        Stage::InBlock
                    }
                }
                Stage::InBlock => {
                    let rec = p.rec.clone();
                    if ready_ok!(self.place_in_block(&rec, wait)) {
                        self.count_record(len);
                        return Poll::Ready(Ok(()));
                    }
                    // The buffer budget gave only a buffer too small for it, or its block was
                    // sealed where it stands: a block of its own, through staging buffers.
                    Stage::Own { vectored: false }
                }
                Stage::Own { vectored } => {
                    let vectored = *vectored;
                    ready_ok!(self.seal_open_block(wait));
                    // Its prefix binds its offset: exact once the codec stage is written.
                    ready_ok!(self.poll_written(false, wait));
                    let Some(at) = self.seg.as_ref().map(|s| s.at()) else {
                        // No segment open (it cannot be, once planned): plan again.
                        p.stage = Stage::New { vectored };
                        continue;
                    };
                    // No padding: the block may end mid-buffer, and the next one starts there.
                    let offset = self.offset();
                    if self.ctx.core.key.is_some() {
                        // Encrypted: the record's ciphertext (an owned copy, the one
                        // allocation of an encrypted large record) replaces it; its length is
                        // the same.
                        let (prefix, ct) = large_encrypted(&self.ctx.core, at.bind, offset, &p.rec);
                        p.rec = ct;
                        if vectored {
                            Stage::Vectored { prefix }
                        } else {
                            Stage::Copy { prefix, done: 0 }
                        }
                    } else if !vectored && len >= DEFER_MIN {
                        // Copied through staging buffers, its parts by the I/O thread: so is its
                        // checksum taken.
                        let (prefix, seal) = large_prefix_unsealed(at.bind, offset, len);
                        Stage::Seal { prefix, seal }
                    } else {
                        let prefix = large_prefix(at.bind, offset, &p.rec);
                        if vectored {
                            Stage::Vectored { prefix }
                        } else {
                            Stage::Copy { prefix, done: 0 }
                        }
                    }
                }
                Stage::Seal { prefix, seal } => {
                    let mut prefix = *prefix;
                    let seal = seal.clone();
                    ready_ok!(self.place_seal(&p.rec, &mut prefix, seal, wait));
                    Stage::Copy { prefix, done: 0 }
                }
                Stage::Copy { prefix, done } => {
                    let (prefix, total) = (*prefix, LARGE_PREFIX_LEN + len);
                    while *done < total {
                        ready_ok!(self.staging_with_room(wait));
                        self.blocks
                            .push_large_part(&prefix, &p.rec, Some(&p.rec), done);
                    }
                    Stage::Placed
                }
                Stage::Vectored { prefix } => {
                    let prefix = *prefix;
                    ready_ok!(self.flush_staging(wait, false));
                    ready_ok!(self.poll_written(false, wait));
                    ready_ok!(self.poll_slot(wait));
                    let need = (LARGE_PREFIX_LEN + len) as u64;
                    let end = self.offset() + need;
                    ready_ok!(self.poll_allocated(end, false, wait));
                    let file = ready_ok!(self.poll_file(wait));
                    let Some(seg) = self.seg.as_mut() else {
                        p.stage = Stage::New { vectored: true };
                        continue;
                    };
                    let offset = seg.written + self.blocks.staged() as u64;
                    seg.written = offset + need;
                    seg.root_use
                        .progress(seg.written, self.blocks.codec.device_wait_ns);
                    let op = Op {
                        kind: OpKind::Write {
                            file,
                            offset,
                            data: WriteData::Framed {
                                frame: prefix,
                                payload: p.rec.clone(),
                            },
                        },
                        sink: self.ctx.shared.tracker.clone(),
                        token: seg.entry_index as u64,
                    };
                    // Placed: a `Pending` submit (a full lane) resumes after it.
                    p.stage = Stage::Placed;
                    if matches!(wait, Wait::Block) {
                        // A blocking `finish` may take it back while it is still queued.
                        ready_ok!(self.submit_claimable(op));
                    } else {
                        ready_ok!(self.submit(op, wait));
                    }
                    Stage::Placed
                }
                Stage::Chunks { done } => {
                    loop {
                        // A chunk is sealed (compressed, checked, encrypted) and written as
                        // its buffer is; so is the block open before the record.
                        if self.blocks.block_open() {
                            ready_ok!(self.flush_staging(wait, false));
                            continue;
                        }
                        if *done == FRAME_LEN + len {
                            break;
                        }
                        ready_ok!(self.staging_with_room(wait));
                        if self.blocks.room() < BLOCK_HEADER_LEN + CHUNK_MIN
                            && self.blocks.staged() > 0
                        {
                            ready_ok!(self.flush_staging(wait, false));
                            continue;
                        }
                        self.blocks.push_chunk(&p.rec, done);
                    }
                    self.count_record(len);
                    return Poll::Ready(Ok(()));
                }
                Stage::Placed => {
                    let block_len = (LARGE_PREFIX_LEN + len) as u64;
                    count_block(&self.ctx.core, Codec::Raw, block_len, block_len, 0);
                    self.count_record(len);
                    return Poll::Ready(Ok(()));
                }
            };
            p.stage = next;
        }
    }

    /// True when a record larger than a buffer is to be compressed in chunks: the codec (fixed,
    /// or `Auto`'s pick for its first block's worth, quota pressure included) compresses and a
    /// sample of it shrinks. Otherwise it is a raw block of its own, read without a copy.
    fn chunks_pay(&mut self, rec: &[u8]) -> bool {
        if matches!(self.blocks.codec.mode, Compression::None) {
            return false;
        }
        let cap = self.ctx.core.io.pool().buffer_capacity();
        let core = &self.ctx.core;
        let (codec, _) = self
            .blocks
            .codec
            .pick(&rec[..rec.len().min(cap)], || quota_fill(core));
        if codec == Codec::Raw {
            return false;
        }
        let shrinks = block::shrinks(codec, &rec[..rec.len().min(CHUNK_SAMPLE)]);
        if !shrinks {
            self.blocks.codec.shrank_nothing();
        }
        shrinks
    }

    /// Write-behind of a large record's checksum: the block header goes into the staging
    /// buffer blank, and the I/O thread that writes that buffer takes the checksum over the
    /// record and writes the header (`IoBuf::defer_seal`), as it copies the record's parts.
    /// Taken here instead when the prefix would not fit the buffer's room (its header split
    /// over two buffers) or the buffer has a deferred header already. Nothing is placed
    /// before: a `Pending` (waiting for a buffer) leaves the seal to the next poll.
    fn place_seal(
        &mut self,
        rec: &Bytes,
        prefix: &mut [u8; LARGE_PREFIX_LEN],
        seal: BlockSeal,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        ready_ok!(self.staging_with_room(wait));
        let seal = match self.blocks.staging.as_mut() {
            Some(buf) if buf.remaining() >= LARGE_PREFIX_LEN => {
                let at = buf.len;
                match buf.defer_seal(rec, at, seal) {
                    Ok(()) => return Poll::Ready(Ok(())),
                    Err(seal) => seal,
                }
            }
            _ => seal,
        };
        prefix[..BLOCK_HEADER_LEN].copy_from_slice(&seal.finish_over(rec));
        Poll::Ready(Ok(()))
    }

    pub(super) fn place_slice(&mut self, rec: &[u8]) -> Result<()> {
        if !self.fits_block(rec.len()) {
            // A block of its own, copied through staging buffers like an owned record.
            let mut p = PendingRecord::new(Bytes::copy_from_slice(rec), false);
            return drive(|w| self.place(&mut p, w));
        }
        let need = segment::framed_len(rec.len()) + (LARGE_PREFIX_LEN + DIRECT_ALIGN) as u64;
        drive(|w| self.plan(need, w))?;
        if !drive(|w| self.place_in_block(rec, w))? {
            // A block of its own continuing into the next buffer, copied from the slice (no
            // owned copy of the record).
            drive(|w| self.place_large_slice(rec, w))?;
        }
        self.count_record(rec.len());
        Ok(())
    }

    /// A record that is a raw block of its own, copied from a slice through the staging
    /// buffers (blocking: the writer waits only for buffers and in-flight budget).
    pub(super) fn place_large_slice(
        &mut self,
        rec: &[u8],
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        ready_ok!(self.seal_open_block(wait));
        ready_ok!(self.poll_written(false, wait));
        let Some(at) = self.seg.as_ref().map(|s| s.at()) else {
            // No segment open: the caller plans first.
            return Poll::Ready(Ok(()));
        };
        let offset = self.offset();
        let (prefix, ct) = if self.ctx.core.key.is_some() {
            let (p, ct) = large_encrypted(&self.ctx.core, at.bind, offset, rec);
            (p, Some(ct))
        } else {
            (large_prefix(at.bind, offset, rec), None)
        };
        let rec = ct.as_deref().unwrap_or(rec);
        let total = LARGE_PREFIX_LEN + rec.len();
        let mut done = 0;
        while done < total {
            ready_ok!(self.staging_with_room(wait));
            self.blocks.push_large_part(&prefix, rec, None, &mut done);
        }
        count_block(&self.ctx.core, Codec::Raw, total as u64, total as u64, 0);
        Poll::Ready(Ok(()))
    }

    /// Puts a record that fits a staging buffer into the open block (opening one, or writing
    /// the buffer first when it lacks the room). Copies nothing until the room is there, so a
    /// `Pending` leaves no partial record. `false`: it is to be a block of its own (nothing
    /// placed; see [`Fit::Own`]).
    fn place_in_block(&mut self, rec: &[u8], wait: &mut Wait<'_, '_>) -> Poll<Result<bool>> {
        loop {
            let Some(at) = self.seg.as_ref().map(|s| s.at()) else {
                return Poll::Ready(Ok(false));
            };
            match self.blocks.push_record(&self.ctx.core, at, rec) {
                Fit::Placed => return Poll::Ready(Ok(true)),
                Fit::Own => return Poll::Ready(Ok(false)),
                Fit::NoBuffer => ready_ok!(self.poll_buffer(wait)),
                Fit::Full => ready_ok!(self.flush_staging(wait, false)),
            }
        }
    }

    pub(super) fn count_record(&mut self, len: usize) {
        self.counts.records += 1;
        Counters::add(&self.ctx.core.counters.records_written, 1);
        self.count_bytes(len);
    }

    /// Counts payload bytes accepted (a stream record's grow as they are appended).
    pub(super) fn count_bytes(&mut self, len: usize) {
        self.counts.bytes += len as u64;
        Counters::add(&self.ctx.core.counters.bytes_written, len as u64);
    }

    /// Makes sure a segment with room for `need` more bytes is open: seals the current one if
    /// the record would pass the segment size (unless it is the segment's first record).
    pub(super) fn plan(&mut self, need: u64, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let full = |w: &Self| {
            let offset = w.offset();
            w.seg.is_some() && offset + need > w.ctx.segment_size && offset > HEADER_LEN as u64
        };
        if full(self) && self.stage.queued() > 0 {
            // The offset is an upper bound while buffers are queued in the codec stage: the
            // record may fit once they are compressed and written (segments stay full).
            ready_ok!(self.poll_until(Until::Fits(need), wait));
        }
        if full(self) {
            ready_ok!(self.seal_with(wait, false));
        }
        let Some(seg) = &self.seg else {
            return self.poll_rotated(need, wait);
        };
        if !seg.file.is_cached() {
            // Evicted while idle: reopened before any byte of the record is placed, so a
            // refusal (`TooManyOpenFiles`) leaves the writer usable.
            ready_ok!(self.poll_reopened(wait));
        }
        let offset = self.offset();
        if let Some(seg) = &mut self.seg
            && offset + need > seg.reserved
        {
            // Only an empty segment gets here (a dropped `RecordSlot` opened it): the record
            // goes in whole, so its ticket must cover it.
            let mut bytes = offset + need;
            if self.ctx.direct {
                bytes = bytes.next_multiple_of(DIRECT_ALIGN as u64);
            }
            let mut f = self.ctx.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                if let Err(err) = e.grow_to(bytes) {
                    return Poll::Ready(Err(err));
                }
                seg.reserved = bytes;
            }
        }
        self.rotate_ahead();
        Poll::Ready(Ok(()))
    }
}
