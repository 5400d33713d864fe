//! Placing records: into the open block of the staging buffer, or as a block of their own
//! (a vectored write of block header + frame + payload, or copied through staging buffers in
//! direct mode), and the rotation plan. Sealing blocks is in `seal.rs`, the codec policy in
//! `codec.rs`, writing buffers and waiting for writes in flight in `flush.rs`.

use std::task::Poll;

use bytes::Bytes;

use super::seal::{large_encrypted, large_prefix, large_prefix_unsealed, open_block, seg_binding};
use super::{SpillWriter, Wait, blocking};
use crate::config::{Compression, DIRECT_ALIGN};
use crate::error::{Result, SpillError};
use crate::format::block::{self, BLOCK_HEADER_LEN, BlockSeal, Codec, LARGE_PREFIX_LEN};
use crate::format::segment::{self, FRAME_LEN, HEADER_LEN};
use crate::io::{Op, OpKind, WriteData};
use crate::metrics::Counters;

/// The least part of a record that a staging buffer copies on its I/O thread rather than the
/// caller's (`IoBuf::push_deferred`); smaller parts are copied at once.
const DEFER_MIN: usize = 64 << 10;

/// A record being placed (kept across `Pending` so async writes resume where they stopped).
pub(super) struct Placing {
    rec: Bytes,
    /// Block header + frame of a record that is a block of its own, once its offset is known.
    prefix: Option<[u8; LARGE_PREFIX_LEN]>,
    /// The block's header still to finish over the record (its checksum), when the prefix was
    /// made with it blank: see [`SpillWriter::place_seal`].
    seal: Option<BlockSeal>,
    /// Zero bytes after a large record (direct mode: its block ends on 4 KiB).
    pad: usize,
    /// Bytes of prefix + payload placed.
    done: usize,
    /// Rotation decided and the target segment open.
    planned: bool,
    /// A block of its own (too large for a staging buffer, or vectored).
    large: bool,
    vectored: bool,
}

impl Placing {
    pub(super) fn new(rec: Bytes, vectored: bool) -> Self {
        Placing {
            vectored,
            rec,
            prefix: None,
            seal: None,
            pad: 0,
            done: 0,
            planned: false,
            large: vectored,
        }
    }
}
impl SpillWriter {
    /// Places the current record; `Pending` only for async waits, with progress kept.
    pub(super) fn step(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if let Wait::Async(cx) = wait {
            ready_ok!(self.resume(cx));
        }
        let Some(mut p) = self.placing.take() else {
            return Poll::Ready(Ok(()));
        };
        let r = self.place(&mut p, wait);
        if r.is_pending() {
            self.placing = Some(p);
        }
        r
    }

    /// True when a record of `len` bytes fits an empty full-size staging buffer's block.
    fn fits_block(&self, len: usize) -> bool {
        HEADER_LEN + BLOCK_HEADER_LEN + FRAME_LEN + len <= self.core.io.pool().buffer_capacity()
    }

    pub(super) fn place(&mut self, p: &mut Placing, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let len = p.rec.len();
        if !p.planned {
            // With a codec, a record that fits a block goes into one (to be compressed) rather
            // than out as a vectored raw write.
            // So does every such record when encrypting (a vectored write is the caller's
            // plaintext).
            if p.vectored
                && (!matches!(self.codec.mode, Compression::None) || self.core.key.is_some())
                && self.fits_block(len)
            {
                p.vectored = false;
            }
            p.large = p.vectored || !self.fits_block(len);
            let need = if p.large {
                LARGE_PREFIX_LEN + len + DIRECT_ALIGN
            } else {
                BLOCK_HEADER_LEN + FRAME_LEN + len
            };
            ready_ok!(self.plan(need as u64, wait));
            p.planned = true;
        }
        if !p.large {
            let rec = p.rec.clone();
            if ready_ok!(self.place_in_block(&rec, wait)) {
                self.count_record(len);
                return Poll::Ready(Ok(()));
            }
            // The buffer budget gave only a buffer too small for it: a block of its own, copied
            // through small buffers.
            p.large = true;
        }
        // A block of its own: the open block (if any) is sealed first.
        if p.prefix.is_none() {
            ready_ok!(self.seal_open_block(wait));
            let Some(seg) = self.seg.as_ref() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let offset = seg.logical;
            // No padding: the block may end mid-buffer, and the next one starts there.
            p.pad = 0;
            let bind = seg_binding(self.core.id, seg.segment, seg.generation);
            if self.core.key.is_some() {
                // Encrypted: the record's ciphertext (an owned copy, the one allocation of an
                // encrypted large record) replaces it; its length is the same.
                let (prefix, ct) = large_encrypted(&self.core, bind, offset, &p.rec);
                p.prefix = Some(prefix);
                p.rec = ct;
            } else if !p.vectored && len >= DEFER_MIN {
                // Copied through staging buffers, its parts by the I/O thread: so is its
                // checksum taken.
                let (prefix, seal) = large_prefix_unsealed(bind, offset, len, p.pad);
                p.prefix = Some(prefix);
                p.seal = Some(seal);
            } else {
                p.prefix = Some(large_prefix(bind, offset, &p.rec, p.pad));
            }
        }
        if p.seal.is_some() {
            ready_ok!(self.place_seal(p, wait));
        }
        let Some(prefix) = p.prefix else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let need = (LARGE_PREFIX_LEN + len + p.pad) as u64;
        if p.vectored && p.done == 0 {
            ready_ok!(self.flush_staging(wait, false));
            ready_ok!(self.poll_slot(wait));
            if let Some(seg) = self.seg.as_ref() {
                let end = seg.logical + need;
                ready_ok!(self.poll_allocated(end, false, wait));
            }
            let file = ready_ok!(self.poll_file(wait));
            let Some(seg) = self.seg.as_mut() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let offset = seg.logical;
            seg.logical += need;
            seg.staged_at = seg.logical;
            let op = Op {
                kind: OpKind::Write {
                    file,
                    offset,
                    data: WriteData::Framed {
                        frame: prefix,
                        payload: p.rec.clone(),
                    },
                },
                sink: self.shared.tracker.clone(),
                token: seg.entry_index as u64,
            };
            // Placed: a `Pending` submit (a full lane) resumes after it.
            p.done = LARGE_PREFIX_LEN + len;
            if matches!(wait, Wait::Block) {
                // A blocking `finish` may take it back while it is still queued.
                ready_ok!(self.submit_claimable(op));
            } else {
                ready_ok!(self.submit(op, wait));
            }
        } else if !p.vectored {
            let total = LARGE_PREFIX_LEN + len;
            while p.done < total {
                let rec = p.rec.clone();
                ready_ok!(self.copy_some(&prefix, &rec, Some(&rec), &mut p.done, wait));
            }
            if p.pad > 0 {
                let Some(buf) = self.staging.as_mut() else {
                    return Poll::Ready(Err(SpillError::WriterFailed));
                };
                let at = buf.len;
                buf.space()[at..at + p.pad].fill(0);
                buf.len += p.pad;
                p.pad = 0;
            }
            if let Some(s) = self.seg.as_mut() {
                s.logical += need;
            }
        }
        let block_len = (LARGE_PREFIX_LEN + len) as u64;
        self.count_block(Codec::Raw, block_len, block_len, 0);
        self.count_record(len);
        Poll::Ready(Ok(()))
    }

    /// Write-behind of a large record's checksum: the block header goes into the staging
    /// buffer blank, and the I/O thread that writes that buffer takes the checksum over the
    /// record and writes the header (`IoBuf::defer_seal`), as it copies the record's parts.
    /// Taken here instead when the prefix would not fit the buffer's room (its header split
    /// over two buffers) or the buffer has a deferred header already. Nothing is placed
    /// before: a `Pending` (waiting for a buffer) keeps the seal for the next poll.
    fn place_seal(&mut self, p: &mut Placing, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        ready_ok!(self.staging_with_room(wait));
        let (Some(seal), Some(prefix)) = (p.seal.take(), p.prefix.as_mut()) else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let seal = match self.staging.as_mut() {
            Some(buf) if buf.remaining() >= LARGE_PREFIX_LEN => {
                let at = buf.len;
                match buf.defer_seal(&p.rec, at, seal) {
                    Ok(()) => return Poll::Ready(Ok(())),
                    Err(seal) => seal,
                }
            }
            _ => seal,
        };
        prefix[..BLOCK_HEADER_LEN].copy_from_slice(&seal.finish_over(&p.rec));
        Poll::Ready(Ok(()))
    }

    /// A staging buffer with room for at least one byte: the full one written first, a new one
    /// taken when there is none.
    pub(super) fn staging_with_room(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if self.staging.as_ref().is_some_and(|b| b.remaining() == 0) {
            ready_ok!(self.flush_staging(wait, false));
        }
        if self.staging.is_none() {
            ready_ok!(self.poll_buffer(0, wait));
        }
        Poll::Ready(Ok(()))
    }

    pub(super) fn place_slice(&mut self, rec: &[u8]) -> Result<()> {
        if !self.fits_block(rec.len()) {
            // A block of its own, copied through staging buffers like an owned record.
            self.placing = Some(Placing::new(Bytes::copy_from_slice(rec), false));
            return blocking(self.step(&mut Wait::Block));
        }
        let w = &mut Wait::Block;
        let need = segment::framed_len(rec.len()) + (LARGE_PREFIX_LEN + DIRECT_ALIGN) as u64;
        blocking(self.plan(need, w))?;
        if !blocking(self.place_in_block(rec, w))? {
            // A block of its own continuing into the next buffer, copied from the slice (no
            // owned copy of the record).
            blocking(self.place_large_slice(rec, w))?;
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
        let Some(seg) = self.seg.as_ref() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let bind = seg_binding(self.core.id, seg.segment, seg.generation);
        let (prefix, ct) = if self.core.key.is_some() {
            let (p, ct) = large_encrypted(&self.core, bind, seg.logical, rec);
            (p, Some(ct))
        } else {
            (large_prefix(bind, seg.logical, rec, 0), None)
        };
        let rec = ct.as_deref().unwrap_or(rec);
        let total = LARGE_PREFIX_LEN + rec.len();
        let mut done = 0;
        while done < total {
            ready_ok!(self.copy_some(&prefix, rec, None, &mut done, wait));
        }
        if let Some(s) = self.seg.as_mut() {
            s.logical += total as u64;
        }
        self.count_block(Codec::Raw, total as u64, total as u64, 0);
        Poll::Ready(Ok(()))
    }

    /// Puts a record that fits a staging buffer into the open block (opening one, or writing
    /// the buffer first when it lacks the room). Copies nothing until the room is there, so a
    /// `Pending` leaves no partial record. `false`: the buffer budget gives only buffers too
    /// small for it (nothing placed).
    fn place_in_block(&mut self, rec: &[u8], wait: &mut Wait<'_, '_>) -> Poll<Result<bool>> {
        let want = FRAME_LEN + rec.len();
        loop {
            if self.staging.is_none() {
                ready_ok!(self.poll_buffer(0, wait));
            }
            let Some(buf) = self.staging.as_mut() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let open = buf.block.is_some();
            let need = want + if open { 0 } else { BLOCK_HEADER_LEN };
            if buf.remaining() >= need {
                if !open {
                    open_block(buf);
                }
                buf.push(&block::record_frame(rec.len()));
                buf.push(rec);
                if let Some(b) = buf.block.as_mut() {
                    b.records += 1;
                }
                if let Some(s) = self.seg.as_mut() {
                    s.logical += need as u64;
                }
                return Poll::Ready(Ok(true));
            }
            if buf.len == 0 {
                // A fresh buffer smaller than the record (the budget is short).
                return Poll::Ready(Ok(false));
            }
            if !open {
                // What the buffer holds (a segment header, the tail of a large record) is
                // kept, and the record becomes a raw block of its own continuing into the next
                // buffer (direct mode: no unaligned write of the partial buffer).
                return Poll::Ready(Ok(false));
            }
            if matches!(self.codec.mode, Compression::None)
                && self.core.key.is_none()
                && buf.remaining() > 0
            {
                // Raw blocks are sealed where they stand, and the record becomes a block of
                // its own that continues into the next buffer: no tail of the buffer is lost
                // (nor padded in direct mode). Not when encrypting: a block of its own would
                // be encrypted through an owned copy of the record (an allocation per
                // buffer); the buffer is written instead, like a compressed block's.
                self.close_raw_block_in_place();
                return Poll::Ready(Ok(false));
            }
            ready_ok!(self.flush_staging(wait, false));
        }
    }

    pub(super) fn count_record(&mut self, len: usize) {
        self.records += 1;
        Counters::add(&self.core.counters.records_written, 1);
        self.count_bytes(len);
    }

    /// Counts payload bytes accepted (a stream record's grow as they are appended).
    pub(super) fn count_bytes(&mut self, len: usize) {
        self.bytes_written += len as u64;
        Counters::add(&self.core.counters.bytes_written, len as u64);
    }

    /// Makes sure a segment with room for `need` more bytes is open: seals the current one if
    /// the record would pass the segment size (unless it is the segment's first record).
    pub(super) fn plan(&mut self, need: u64, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if let Some(seg) = &self.seg
            && seg.logical + need > self.segment_size
            && seg.logical > HEADER_LEN as u64
        {
            ready_ok!(self.poll_seal(wait));
        }
        let Some(seg) = &mut self.seg else {
            return self.poll_rotated(need, wait);
        };
        if !seg.file.is_cached() {
            // Evicted while idle: reopened before any byte of the record is placed, so a
            // refusal (`TooManyOpenFiles`) leaves the writer usable.
            ready_ok!(self.poll_reopened(wait));
        }
        let Some(seg) = &mut self.seg else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        if seg.logical + need > seg.reserved {
            // Only an empty segment gets here (a dropped `RecordSlot` opened it): the record
            // goes in whole, so its ticket must cover it.
            let mut bytes = seg.logical + need;
            if self.direct {
                bytes = bytes.next_multiple_of(DIRECT_ALIGN as u64);
            }
            let mut f = self.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                if let Err(err) = e.grow_to(bytes) {
                    return Poll::Ready(Err(err));
                }
                seg.reserved = bytes;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Copies as much of prefix + payload (from `*done`) as fits in the staging buffer, flushing
    /// it first when it is full.
    fn copy_some(
        &mut self,
        frame: &[u8],
        payload: &[u8],
        owned: Option<&Bytes>,
        done: &mut usize,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        ready_ok!(self.staging_with_room(wait));
        let Some(buf) = self.staging.as_mut() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let flen = frame.len();
        if *done < flen {
            let n = (flen - *done).min(buf.remaining());
            buf.push(&frame[*done..*done + n]);
            *done += n;
        }
        if *done >= flen {
            let at = *done - flen;
            let n = (payload.len() - at).min(buf.remaining());
            match owned {
                // The I/O thread that writes the buffer copies it (write-behind of the copy:
                // the producer's thread goes on computing meanwhile). Nothing reads a large
                // record's bytes from the buffer before: its block checksum was taken from
                // the record.
                Some(rec) if n >= DEFER_MIN => buf.push_deferred(rec, at, n),
                _ => buf.push(&payload[at..at + n]),
            }
            *done += n;
        }
        Poll::Ready(Ok(()))
    }
}
