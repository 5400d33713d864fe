//! Sealing blocks: a block's header in place, compression per the codec policy, encryption;
//! the prefix of a record that is a block of its own.

use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;

use super::codec::{AUTO_SAMPLE, trial};
use super::{SpillWriter, Wait};
use crate::config::{Compression, DIRECT_ALIGN};
use crate::core::Core;
use crate::error::Result;
use crate::format::block::{self, BLOCK_HEADER_LEN, Binding, BlockSeal, Codec, LARGE_PREFIX_LEN};
use crate::format::segment::FRAME_LEN;
use crate::io::{IoBuf, OpenBlock};
use crate::metrics::Counters;

impl SpillWriter {
    /// Opens a block in the staging buffer for an in-place record slot (`slot.rs`), counting
    /// its header in the segment's length. The caller made sure the room is there.
    pub(super) fn ensure_block(&mut self) {
        if let Some(buf) = self.staging.as_mut()
            && buf.block.is_none()
        {
            open_block(buf);
            if let Some(s) = self.seg.as_mut() {
                s.logical += BLOCK_HEADER_LEN as u64;
            }
        }
    }

    /// Seals the raw block open in the staging buffer without writing the buffer: its header
    /// goes in place, and the buffer goes on filling after it.
    pub(super) fn close_raw_block_in_place(&mut self) {
        let (Some(buf), Some(seg)) = (self.staging.as_mut(), self.seg.as_ref()) else {
            return;
        };
        buf.end_open_record();
        let Some(ob) = buf.block.take() else {
            return;
        };
        let body = ob.at + BLOCK_HEADER_LEN;
        let raw_len = buf.len - body;
        let end = buf.len;
        let header = seal_in_place(
            &self.core,
            seg_binding(self.core.id, seg.segment, seg.generation),
            seg.staged_at + ob.at as u64,
            Codec::Raw,
            raw_len as u64,
            ob.records,
            0,
            &mut buf.space()[body..end],
        );
        buf.space()[ob.at..body].copy_from_slice(&header);
        let n = (BLOCK_HEADER_LEN + raw_len) as u64;
        self.count_block(Codec::Raw, n, n, 0);
    }

    /// Writes the staging buffer if a block is open in it (sealing the block).
    pub(super) fn seal_open_block(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if self.staging.as_ref().is_some_and(|b| b.block.is_some()) {
            ready_ok!(self.flush_staging(wait, false));
        }
        Poll::Ready(Ok(()))
    }

    /// Counts a sealed block: its codec, logical (header + raw) and physical (header + stored)
    /// bytes, and the nanoseconds spent compressing it.
    pub(super) fn count_block(&mut self, codec: Codec, logical: u64, physical: u64, nanos: u64) {
        let c = &self.core.counters;
        Counters::add(&c.logical_bytes_written, logical);
        Counters::add(&c.physical_bytes_written, physical);
        Counters::add(&c.compress_nanos, nanos);
        Counters::add(
            match codec {
                Codec::Raw => &c.blocks_raw,
                Codec::Lz4 => &c.blocks_lz4,
                Codec::Zstd(_) => &c.blocks_zstd,
            },
            1,
        );
    }

    /// Seals the block open in `buf` (which is about to be written at file offset
    /// `staged_at`): compresses its records in place per the codec policy when that shrinks
    /// them, writes its header, pads it to `DIRECT_ALIGN` when `pad`.
    /// Returns the buffer to write and its length; keeps the segment's logical length.
    pub(super) fn seal_block(&mut self, mut buf: IoBuf, pad: bool) -> IoBuf {
        buf.end_open_record();
        let Some(ob) = buf.block.take() else {
            return buf;
        };
        let Some(seg) = self.seg.as_ref() else {
            return buf;
        };
        let bind = seg_binding(self.core.id, seg.segment, seg.generation);
        let offset = seg.staged_at + ob.at as u64;
        let body = ob.at + BLOCK_HEADER_LEN;
        let raw_len = buf.len - body;
        let t0 = Instant::now();
        let mut nanos = 0u64;
        let mut codec = self.pick_codec(&buf.filled()[body..], &mut nanos);
        if codec != Codec::Raw {
            // In place: the bytes before the block (and any deferred copy among them, which
            // the I/O thread makes) stay where they are. No second buffer, so no map and no
            // pool lock here, in an async writer's poll.
            let end = buf.len;
            match block::compress_in_place(codec, &mut buf.space()[body..end]) {
                Some(n) => buf.len = body + n,
                None => {
                    if matches!(self.codec.mode, Compression::Auto) {
                        self.codec.auto.failed();
                    }
                    codec = Codec::Raw;
                }
            }
            nanos = t0.elapsed().as_nanos() as u64;
        }
        let mut w = buf;
        let stored_len = w.len - body;
        let padn = if pad {
            w.len.next_multiple_of(DIRECT_ALIGN).min(w.capacity()) - w.len
        } else {
            0
        };
        let end = w.len;
        let header = seal_in_place(
            &self.core,
            bind,
            offset,
            codec,
            raw_len as u64,
            ob.records,
            padn as u32,
            &mut w.space()[body..end],
        );
        w.space()[ob.at..body].copy_from_slice(&header);
        let at = w.len;
        w.space()[at..at + padn].fill(0);
        w.len += padn;
        if let Some(seg) = self.seg.as_mut() {
            seg.logical = seg.logical - (raw_len - stored_len) as u64 + padn as u64;
        }
        self.codec.observe(w.len);
        self.count_block(
            codec,
            (BLOCK_HEADER_LEN + raw_len) as u64,
            (BLOCK_HEADER_LEN + stored_len) as u64,
            nanos,
        );
        w
    }

    /// `Auto`'s space pressure: how full the tighter of its bounds is (`codec.rs`), the quota
    /// (bytes held over `max_spill_bytes`) or the open segment's root.
    fn space_pressure(&self) -> f64 {
        let ledger = &self.core.store.ledger;
        let quota = ledger
            .max_bytes()
            .map_or(0.0, |max| ledger.bytes_used() as f64 / max as f64);
        quota.max(self.codec.root_fill)
    }

    /// The codec for a block of `raw` bytes: fixed, or `Auto`'s choice (a trial on a sample,
    /// timed into `nanos`).
    fn pick_codec(&mut self, raw: &[u8], nanos: &mut u64) -> Codec {
        match self.codec.mode {
            Compression::None => Codec::Raw,
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd { level } => Codec::Zstd(level),
            Compression::Auto => {
                let level = self.codec.auto.set_space(self.space_pressure());
                if let Some(c) = self.codec.auto.next_block() {
                    return c;
                }
                let t0 = Instant::now();
                let sample = &raw[..raw.len().min(AUTO_SAMPLE)];
                let mut scratch = std::mem::take(&mut self.codec.scratch);
                scratch.resize(sample.len(), 0);
                let lz4 = trial(Codec::Lz4, sample, &mut scratch);
                let zstd = if lz4.is_some() {
                    trial(Codec::Zstd(1), sample, &mut scratch)
                } else {
                    None
                };
                let zstd3 = if level >= 2 && zstd.is_some() {
                    trial(Codec::Zstd(3), sample, &mut scratch)
                } else {
                    None
                };
                self.codec.scratch = scratch;
                let c = if level >= 1 {
                    self.codec
                        .auto
                        .choose_for_space(sample.len(), lz4, zstd, zstd3)
                } else {
                    self.codec
                        .auto
                        .choose(sample.len(), lz4, zstd, self.codec.cost())
                };
                *nanos += t0.elapsed().as_nanos() as u64;
                c
            }
        }
    }
}

/// The binding of blocks of use `generation` of segment `segment` of engine `engine`.
pub(super) fn seg_binding(engine: u64, segment: u32, generation: u32) -> Binding {
    Binding {
        segment,
        generation,
        engine,
    }
}

/// Reserves a block header at the buffer's end and opens a block there.
pub(super) fn open_block(buf: &mut IoBuf) {
    let at = buf.len;
    buf.push(&[0u8; BLOCK_HEADER_LEN]);
    buf.block = Some(OpenBlock {
        at,
        records: 0,
        open_record: None,
    });
}

/// Block header + frame of a record that is a raw block of its own at `offset`.
pub(super) fn large_prefix(
    bind: Binding,
    offset: u64,
    rec: &[u8],
    pad: usize,
) -> [u8; LARGE_PREFIX_LEN] {
    let (mut p, seal) = large_prefix_unsealed(bind, offset, rec.len(), pad);
    p[..BLOCK_HEADER_LEN].copy_from_slice(&seal.finish_over(rec));
    p
}

/// [`large_prefix`] of a record of `len` bytes with its block header left blank, and the seal
/// that gives the header once it has taken the record's bytes (the frame is in it already).
pub(super) fn large_prefix_unsealed(
    bind: Binding,
    offset: u64,
    len: usize,
    pad: usize,
) -> ([u8; LARGE_PREFIX_LEN], BlockSeal) {
    let frame = block::record_frame(len);
    let stored = (FRAME_LEN + len) as u64;
    let mut seal = BlockSeal::new(bind, offset, Codec::Raw, stored, stored, 1, pad as u32);
    seal.update(&frame);
    let mut p = [0u8; LARGE_PREFIX_LEN];
    p[BLOCK_HEADER_LEN..].copy_from_slice(&frame);
    (p, seal)
}

/// Seals a block (see [`block::seal_in_place`]) with the engine's key if it has one, counting
/// the nanoseconds spent encrypting.
#[allow(clippy::too_many_arguments)]
fn seal_in_place(
    core: &Core,
    bind: Binding,
    offset: u64,
    codec: Codec,
    raw: u64,
    records: u32,
    pad: u32,
    stored: &mut [u8],
) -> [u8; BLOCK_HEADER_LEN] {
    let t = core.key.is_some().then(Instant::now);
    let h = block::seal_in_place(
        core.key.as_ref(),
        bind,
        offset,
        codec,
        raw,
        records,
        pad,
        stored,
    );
    if let Some(t) = t {
        Counters::add(&core.counters.encrypt_nanos, t.elapsed().as_nanos() as u64);
    }
    h
}

/// Block header + the first `FRAME_LEN` ciphertext bytes, and the rest of the ciphertext, of a
/// record that is an encrypted raw block of its own at `offset` (no padding).
pub(super) fn large_encrypted(
    core: &Core,
    bind: Binding,
    offset: u64,
    rec: &[u8],
) -> ([u8; LARGE_PREFIX_LEN], Bytes) {
    let mut ct = Vec::with_capacity(FRAME_LEN + rec.len());
    ct.extend_from_slice(&block::record_frame(rec.len()));
    ct.extend_from_slice(rec);
    let raw = ct.len() as u64;
    let h = seal_in_place(core, bind, offset, Codec::Raw, raw, 1, 0, &mut ct);
    let mut p = [0u8; LARGE_PREFIX_LEN];
    p[..BLOCK_HEADER_LEN].copy_from_slice(&h);
    p[BLOCK_HEADER_LEN..].copy_from_slice(&ct[..FRAME_LEN]);
    (p, Bytes::from(ct).slice(FRAME_LEN..))
}
