//! The block builder: format v2 blocks in the staging buffer, with no I/O. Records are framed
//! into the buffer's open block (`push_record`, the byte stream's growing record, in-place
//! slots); a block is closed (`close`: its codec picked per the codec policy) and sealed where
//! it stands (`seal_closed`: its records compressed already, off the producer's thread, by the
//! codec stage, `stage.rs`; its header and CRC written, encrypted with the engine's key,
//! padded to 4 KiB in direct mode); a record too large for a block of the buffer is a block of
//! its own, whose prefix (block header + frame) is made here. What the buffer leaves to the
//! I/O thread that writes it (deferred copies, a deferred checksum) is `io/buf.rs`'s `Fills`.
//! Getting a buffer and writing one is the segment sink's (`sink.rs`).

use std::time::Instant;

use bytes::Bytes;

use super::codec::CodecState;
use crate::config::Compression;
use crate::format::block::{self, BLOCK_HEADER_LEN, Binding, BlockSeal, Codec, LARGE_PREFIX_LEN};
use crate::format::segment::FRAME_LEN;
use crate::io::{IoBuf, OpenBlock};
use crate::metrics::Counters;
use crate::shared::EngineShared;

/// The least part of a record that a staging buffer copies on its I/O thread rather than the
/// caller's (`IoBuf::push_deferred`); smaller parts are copied at once.
pub(super) const DEFER_MIN: usize = 64 << 10;

/// The block builder: the staging buffer (with its open block) and the codec.
pub(super) struct Blocks {
    /// The staging buffer, if the writer holds one.
    pub(super) staging: Option<IoBuf>,
    /// The block codec and `Auto`'s state.
    pub(super) codec: CodecState,
}

/// Where the staging buffer goes: its segment's binding (in every block's checksum) and the
/// file offset of the buffer's first byte.
#[derive(Debug, Clone, Copy)]
pub(super) struct At {
    pub(super) bind: Binding,
    pub(super) written: u64,
}

/// What [`Blocks::push_record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fit {
    /// The record is in the open block.
    Placed,
    /// The writer holds no staging buffer: take one, then try again.
    NoBuffer,
    /// The open block lacks the room: write the buffer, then try again in the next.
    Full,
    /// The record is to be a block of its own, continuing into the next buffer: the buffer is
    /// smaller than it, or holds no open block (a segment header, a large record's tail), or
    /// its raw block was sealed where it stands. Nothing was placed.
    Own,
}

impl Blocks {
    pub(super) fn new(mode: Compression, queue_depth: usize) -> Self {
        Blocks {
            staging: None,
            codec: CodecState::new(mode, queue_depth),
        }
    }

    /// Bytes in the staging buffer (0 with none).
    pub(super) fn staged(&self) -> usize {
        self.staging.as_ref().map_or(0, |b| b.len)
    }

    /// True when the staging buffer holds an open block.
    pub(super) fn block_open(&self) -> bool {
        self.staging.as_ref().is_some_and(|b| b.block.is_some())
    }

    /// Room left in the staging buffer (0 with none).
    pub(super) fn room(&self) -> usize {
        self.staging.as_ref().map_or(0, IoBuf::remaining)
    }

    /// Ends the byte stream's open record (`stream.rs`), if the open block has one.
    pub(super) fn end_stream_record(&mut self) {
        if let Some(b) = self.staging.as_mut() {
            b.end_open_record();
        }
    }

    /// Opens a block in the staging buffer if none is open (the caller made sure of the room
    /// for its header).
    pub(super) fn open_block(&mut self) {
        if let Some(buf) = self.staging.as_mut()
            && buf.block.is_none()
        {
            open_block(buf);
        }
    }

    /// Puts a record that fits a staging buffer into the open block (opening one): copies
    /// nothing unless the room is there. A raw block (no codec, no key) that lacks the room is
    /// sealed where it stands and the record becomes a block of its own continuing into the
    /// next buffer: no tail of the buffer is lost (nor padded in direct mode). Not when
    /// encrypting: a block of its own would be encrypted through an owned copy of the record
    /// (an allocation per buffer); the buffer is written instead, like a compressed block's.
    pub(super) fn push_record(&mut self, core: &EngineShared, at: At, rec: &[u8]) -> Fit {
        let raw = matches!(self.codec.mode, Compression::None) && core.key.is_none();
        let Some(buf) = self.staging.as_mut() else {
            return Fit::NoBuffer;
        };
        let open = buf.block.is_some();
        let need = FRAME_LEN + rec.len() + if open { 0 } else { BLOCK_HEADER_LEN };
        if buf.remaining() >= need {
            if !open {
                open_block(buf);
            }
            buf.push(&block::record_frame(rec.len()));
            buf.push(rec);
            if let Some(b) = buf.block.as_mut() {
                b.records += 1;
            }
            return Fit::Placed;
        }
        if buf.len == 0 || !open {
            return Fit::Own;
        }
        if raw && buf.remaining() > 0 {
            self.seal(core, at, false);
            return Fit::Own;
        }
        Fit::Full
    }

    /// Opens a record of the byte stream in the open block (the caller made sure of the room
    /// for its frame): its frame is written when it ends (`IoBuf::end_open_record`).
    pub(super) fn open_stream_record(&mut self) {
        if let Some(buf) = self.staging.as_mut() {
            let at = buf.len;
            buf.push(&[0u8; FRAME_LEN]);
            if let Some(b) = buf.block.as_mut() {
                b.records += 1;
                b.open_record = Some(at);
            }
        }
    }

    /// True when the open block has a record the byte stream is filling.
    pub(super) fn stream_record_open(&self) -> bool {
        self.staging
            .as_ref()
            .and_then(|b| b.block.as_ref())
            .is_some_and(|b| b.open_record.is_some())
    }

    /// Appends what fits of `data` (at most `seg_room` bytes) to the stream's open record,
    /// ending the record when the buffer or the segment is full: how many bytes went in.
    pub(super) fn push_stream(&mut self, data: &[u8], seg_room: usize) -> usize {
        let Some(buf) = self.staging.as_mut() else {
            return 0;
        };
        let n = data.len().min(buf.remaining()).min(seg_room);
        buf.push(&data[..n]);
        if buf.remaining() == 0 || n == seg_room {
            // The next bytes open a record in the next buffer (or, after a rotation, segment).
            buf.end_open_record();
        }
        n
    }

    /// Frames an in-place record slot of `len` bytes whose frame is at `at` in the open block
    /// (`slot.rs`): the bytes the caller wrote there are the record. False with no buffer.
    pub(super) fn commit_slot(&mut self, at: usize, len: usize) -> bool {
        let Some(buf) = self.staging.as_mut() else {
            return false;
        };
        buf.space()[at..at + FRAME_LEN].copy_from_slice(&block::record_frame(len));
        buf.len = at + FRAME_LEN + len;
        if let Some(b) = buf.block.as_mut() {
            b.records += 1;
        }
        true
    }

    /// Copies as much of a block of its own (its prefix, then `payload`) from `*done` on as the
    /// staging buffer has room for. Parts of `owned` of [`DEFER_MIN`] or more are left to the
    /// I/O thread that writes the buffer (write-behind of the copy: the producer's thread goes
    /// on meanwhile; nothing reads a large record's bytes from the buffer before, its checksum
    /// taken from the record).
    pub(super) fn push_large_part(
        &mut self,
        prefix: &[u8],
        payload: &[u8],
        owned: Option<&Bytes>,
        done: &mut usize,
    ) {
        let Some(buf) = self.staging.as_mut() else {
            return;
        };
        let flen = prefix.len();
        if *done < flen {
            let n = (flen - *done).min(buf.remaining());
            buf.push(&prefix[*done..*done + n]);
            *done += n;
        }
        if *done >= flen {
            let at = *done - flen;
            let n = (payload.len() - at).min(buf.remaining());
            match owned {
                Some(rec) if n >= DEFER_MIN => buf.push_deferred(rec, at, n),
                _ => buf.push(&payload[at..at + n]),
            }
            *done += n;
        }
    }

    /// Opens a chunk block (`format::block::FLAG_CHUNK`) in the staging buffer and fills its
    /// room with the next bytes of frame + `rec` from `*done` on (the caller made sure of
    /// room for its header and more). Sealed as any block.
    pub(super) fn push_chunk(&mut self, rec: &[u8], done: &mut usize) {
        let Some(buf) = self.staging.as_mut() else {
            return;
        };
        open_block(buf);
        if let Some(b) = buf.block.as_mut() {
            b.chunk = true;
            b.records = u32::from(*done == 0);
        }
        if *done == 0 {
            buf.push(&block::record_frame(rec.len()));
            *done = FRAME_LEN;
        }
        let at = *done - FRAME_LEN;
        let n = buf.remaining().min(rec.len() - at);
        buf.push(&rec[at..at + n]);
        *done += n;
    }

    /// Closes the block open in the staging buffer: its open record ended, its codec picked
    /// (fixed, or `Auto`'s: a trial on a sample, on this thread). The block stays where it
    /// stands, its header blank, until [`seal_closed`]. `None` with no open block.
    pub(super) fn close(&mut self, core: &EngineShared) -> Option<Closed> {
        let Blocks { staging, codec } = self;
        let buf = staging.as_mut()?;
        buf.end_open_record();
        let block = buf.block.take()?;
        let body = block.at + BLOCK_HEADER_LEN;
        let raw = buf.len - body;
        // Without a codec every block is stored raw: nothing to pick, nor to observe for `Auto`.
        let (codec, pick_ns) = match codec.mode {
            Compression::None => (Codec::Raw, 0),
            _ => codec.pick(&buf.filled()[body..], || quota_fill(core)),
        };
        Some(Closed {
            block,
            raw,
            codec,
            pick_ns,
        })
    }

    /// Seals the block open in the staging buffer where it stands, on this thread, stored raw:
    /// for a writer without a codec (a writer with one seals its blocks in order as their
    /// compressions come back, `stage.rs`). Nothing to seal with no open block.
    pub(super) fn seal(&mut self, core: &EngineShared, at: At, pad: bool) {
        let Some(closed) = self.close(core) else {
            return;
        };
        if let Some(buf) = self.staging.as_mut() {
            seal_closed(
                core,
                &mut self.codec,
                buf,
                &closed,
                (Codec::Raw, 0),
                at,
                pad,
            );
        }
    }
}

/// A block closed in its buffer (its header blank), to be sealed where it stands: where it
/// is, what it holds, the codec picked for it and the nanoseconds the pick took.
pub(super) struct Closed {
    block: OpenBlock,
    /// Its records' bytes, raw.
    raw: usize,
    pub(super) codec: Codec,
    pick_ns: u64,
}

impl Closed {
    /// Where its records start in the buffer.
    pub(super) fn body(&self) -> usize {
        self.block.at + BLOCK_HEADER_LEN
    }
}

/// Seals a closed block in `buf` where it stands: its records as `stored` says (the codec they
/// are stored with, `Raw` when as they were, and the nanoseconds their compression took),
/// its header and checksum for the file offset `at` gives the buffer (encrypted with the
/// engine's key), padded to `DIRECT_ALIGN` when `pad`. The bytes before the block (and any
/// deferred copy among them, which the I/O thread makes) stay where they are. Counted, and
/// observed by `Auto`.
pub(super) fn seal_closed(
    core: &EngineShared,
    codec: &mut CodecState,
    buf: &mut IoBuf,
    c: &Closed,
    stored: (Codec, u64),
    at: At,
    pad: bool,
) {
    let (used, codec_ns) = stored;
    if used == Codec::Raw && c.codec != Codec::Raw {
        codec.shrank_nothing();
    }
    let body = c.body();
    let stored_len = buf.len - body;
    let padn = buf.write_len(pad) - buf.len;
    let end = buf.len;
    let header = seal_in_place(
        core,
        at.bind,
        at.written + c.block.at as u64,
        used,
        c.raw as u64,
        c.block.records,
        padn as u32,
        c.block.chunk,
        &mut buf.space()[body..end],
    );
    buf.space()[c.block.at..body].copy_from_slice(&header);
    buf.space()[end..end + padn].fill(0);
    buf.len += padn;
    // Only `Auto` weighs what its blocks cost (a fixed codec's writer skips the clock read).
    if matches!(codec.mode, Compression::Auto) {
        codec.observe(buf.len, BLOCK_HEADER_LEN + c.raw, c.pick_ns, codec_ns);
    }
    count_block(
        core,
        used,
        (BLOCK_HEADER_LEN + c.raw) as u64,
        (BLOCK_HEADER_LEN + stored_len) as u64,
        c.pick_ns + codec_ns,
    );
}

/// Counts a sealed block: its codec, logical (header + raw) and physical (header + stored)
/// bytes, and the nanoseconds spent compressing it.
pub(super) fn count_block(
    core: &EngineShared,
    codec: Codec,
    logical: u64,
    physical: u64,
    nanos: u64,
) {
    let c = &core.counters;
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

/// Reserves a block header at the buffer's end and opens a block there.
pub(super) fn open_block(buf: &mut IoBuf) {
    let at = buf.len;
    buf.push(&[0u8; BLOCK_HEADER_LEN]);
    buf.block = Some(OpenBlock {
        at,
        records: 0,
        open_record: None,
        chunk: false,
    });
}

/// Block header + frame of a record that is a raw block of its own at `offset`.
pub(super) fn large_prefix(bind: Binding, offset: u64, rec: &[u8]) -> [u8; LARGE_PREFIX_LEN] {
    let (mut p, seal) = large_prefix_unsealed(bind, offset, rec.len());
    p[..BLOCK_HEADER_LEN].copy_from_slice(&seal.finish_over(rec));
    p
}

/// [`large_prefix`] of a record of `len` bytes with its block header left blank, and the seal
/// that gives the header once it has taken the record's bytes (the frame is in it already).
pub(super) fn large_prefix_unsealed(
    bind: Binding,
    offset: u64,
    len: usize,
) -> ([u8; LARGE_PREFIX_LEN], BlockSeal) {
    let frame = block::record_frame(len);
    let stored = (FRAME_LEN + len) as u64;
    let mut seal = BlockSeal::new(bind, offset, Codec::Raw, stored, stored, 1, 0);
    seal.update(&frame);
    let mut p = [0u8; LARGE_PREFIX_LEN];
    p[BLOCK_HEADER_LEN..].copy_from_slice(&frame);
    (p, seal)
}

/// Seals a block (see [`block::seal_in_place`]) with the engine's key if it has one, counting
/// the nanoseconds spent encrypting.
#[allow(clippy::too_many_arguments)]
fn seal_in_place(
    core: &EngineShared,
    bind: Binding,
    offset: u64,
    codec: Codec,
    raw: u64,
    records: u32,
    pad: u32,
    chunk: bool,
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
        chunk,
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
    core: &EngineShared,
    bind: Binding,
    offset: u64,
    rec: &[u8],
) -> ([u8; LARGE_PREFIX_LEN], Bytes) {
    let mut ct = Vec::with_capacity(FRAME_LEN + rec.len());
    ct.extend_from_slice(&block::record_frame(rec.len()));
    ct.extend_from_slice(rec);
    let raw = ct.len() as u64;
    let h = seal_in_place(core, bind, offset, Codec::Raw, raw, 1, 0, false, &mut ct);
    let mut p = [0u8; LARGE_PREFIX_LEN];
    p[..BLOCK_HEADER_LEN].copy_from_slice(&h);
    p[BLOCK_HEADER_LEN..].copy_from_slice(&ct[..FRAME_LEN]);
    (p, Bytes::from(ct).slice(FRAME_LEN..))
}

/// How full the quota is: bytes the ledger holds over `max_spill_bytes`, 0 without one (with
/// the open segment's root's fill, `Auto`'s space pressure: `codec.rs`).
pub(super) fn quota_fill(core: &EngineShared) -> f64 {
    let ledger = &core.store.ledger;
    ledger
        .max_bytes()
        .map_or(0.0, |max| ledger.bytes_used() as f64 / max as f64)
}
