//! Blocks of format version 3, as pure functions: the block header, its checksum, the codecs,
//! and the record frames inside a block. See [`crate::format::segment`] for the file layout.
//!
//! ```text
//! block header (64 bytes)
//!   0  magic      b"SRB2"
//!   4  codec      u8   0 raw, 1 lz4 (block format), 2 zstd
//!   5  flags      u8   bit 0: encrypted (see format/crypt.rs); bit 1: chunk (below); other
//!                      bits zero
//!   6  reserved   2 zero bytes
//!   8  stored     u64 LE  bytes of the block after this header, as written
//!  16  raw        u64 LE  bytes of the records (frames included) once decoded
//!  24  records    u32 LE  records in the block
//!  28  pad        u32 LE  zero bytes after the stored bytes (direct mode: to 4 KiB)
//!  32  nonce      u64 LE  encrypted: the block's nonce counter; otherwise zero
//!  40  reserved   8 zero bytes
//!  48  check      16 bytes: CRC-32C (u32 LE, then 12 zero bytes) of the binding
//!                 (segment u32 LE, generation u32 LE, engine id u64 LE, the block's file
//!                 offset u64 LE), header bytes 0..48 and the stored bytes; encrypted: the
//!                 AES-256-GCM tag over the stored bytes with binding + header bytes 0..48
//!                 as AAD
//! records, once decoded: frames back to back
//!   0  len        u32 LE  payload length
//!   4  reserved   u32     zero
//!   8  payload
//! chunk (flags bit 1): a record larger than a staging buffer, compressed, is cut into
//!   chunks, each a block of its own (bound, checked, encrypted like any other) whose decoded
//!   bytes are the next piece of frame + payload rather than whole frames: records is 1 on the
//!   first chunk (its bytes start with the record's frame, which gives the total length) and
//!   0 on the rest, which follow it back to back. A chunk out of place fails its binding.
//! ```
//!
//! The binding makes a block of another segment, of an earlier use of a recycled file, of
//! another engine (two engines number their segments alike) or of another place in the same
//! file fail its checksum. (Version 2 bound no engine id: its segments are refused by their
//! header's version, never read.) The checksum covers the stored bytes, so a
//! compressed block is checked before it is decompressed.

use std::ops::Range;

use super::crypt::BlockKey;
use super::segment::FRAME_LEN;
use crc_fast::{CrcAlgorithm, Digest};

/// Bytes of a block header.
pub const BLOCK_HEADER_LEN: usize = 64;
/// Bytes before the payload of a record written as a block of its own (a large record).
pub const LARGE_PREFIX_LEN: usize = BLOCK_HEADER_LEN + FRAME_LEN;

const BLOCK_MAGIC: &[u8; 4] = b"SRB2";
/// Block flags bit: the stored bytes are AES-256-GCM ciphertext, the check field its tag.
pub const FLAG_ENCRYPTED: u8 = 1;
/// Block flags bit: the block is a chunk of one record (see the layout above).
pub const FLAG_CHUNK: u8 = 2;
/// Blocks are padded to at most this alignment (direct mode's).
const PAD_ALIGN: usize = 4096;

/// How a block's records are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// As they are: records are views of the file.
    Raw,
    /// LZ4 block format (`lz4_flex`).
    Lz4,
    /// Zstandard at a level.
    Zstd(i32),
}

impl Codec {
    fn id(self) -> u8 {
        match self {
            Codec::Raw => 0,
            Codec::Lz4 => 1,
            Codec::Zstd(_) => 2,
        }
    }
}

/// What a valid block header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// 0 raw, 1 lz4, 2 zstd.
    pub codec: u8,
    /// Bytes after the header as written.
    pub stored: u64,
    /// Bytes of the records once decoded.
    pub raw: u64,
    /// Records in the block.
    pub records: u32,
    /// Zero bytes after the stored bytes.
    pub pad: u32,
    /// Encrypted (flags bit 0): the check field is a GCM tag.
    pub encrypted: bool,
    /// A chunk of one record (flags bit 1).
    pub chunk: bool,
}

/// Which engine, segment and use a block belongs to, and where it lies: bound into its
/// checksum (and an encrypted block's associated data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// Segment number.
    pub segment: u32,
    /// Use of the file.
    pub generation: u32,
    /// Id of the engine that wrote it (the segment header's engine field).
    pub engine: u64,
}

/// Bytes of a block's binding with its offset.
pub(super) const BINDING_LEN: usize = 24;

pub(super) fn binding_bytes(b: Binding, offset: u64) -> [u8; BINDING_LEN] {
    let mut v = [0u8; BINDING_LEN];
    v[0..4].copy_from_slice(&b.segment.to_le_bytes());
    v[4..8].copy_from_slice(&b.generation.to_le_bytes());
    v[8..16].copy_from_slice(&b.engine.to_le_bytes());
    v[16..24].copy_from_slice(&offset.to_le_bytes());
    v
}

/// The header's first 48 bytes (everything but the check).
fn header_fields(codec: u8, stored: u64, raw: u64, records: u32, pad: u32) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0..4].copy_from_slice(BLOCK_MAGIC);
    h[4] = codec;
    h[8..16].copy_from_slice(&stored.to_le_bytes());
    h[16..24].copy_from_slice(&raw.to_le_bytes());
    h[24..28].copy_from_slice(&records.to_le_bytes());
    h[28..32].copy_from_slice(&pad.to_le_bytes());
    h
}

/// A block header being built; the stored bytes are fed in pieces (a large record's frame and
/// payload), then [`BlockSeal::finish`] gives the header.
#[derive(Debug, Clone)]
pub(crate) struct BlockSeal {
    fields: [u8; 48],
    crc: u32,
}

impl BlockSeal {
    pub(crate) fn new(
        bind: Binding,
        offset: u64,
        codec: Codec,
        stored: u64,
        raw: u64,
        records: u32,
        pad: u32,
    ) -> Self {
        Self::with_fields(
            bind,
            offset,
            header_fields(codec.id(), stored, raw, records, pad),
        )
    }

    /// The CRC-32C of a block's binding and header fields, before its stored bytes: the one
    /// place the checksum's input is laid out, for the writer and the reader alike.
    fn with_fields(bind: Binding, offset: u64, fields: [u8; 48]) -> Self {
        let crc = crc32c(&binding_bytes(bind, offset));
        let crc = crc32c_append(crc, &fields);
        BlockSeal { fields, crc }
    }

    #[inline]
    pub(crate) fn update(&mut self, stored: &[u8]) {
        self.crc = crc32c_append(self.crc, stored);
    }

    /// [`BlockSeal::update`] with the last of the stored bytes, then [`BlockSeal::finish`].
    pub(crate) fn finish_over(mut self, last: &[u8]) -> [u8; BLOCK_HEADER_LEN] {
        self.update(last);
        self.finish()
    }

    pub(crate) fn finish(self) -> [u8; BLOCK_HEADER_LEN] {
        let mut h = [0u8; BLOCK_HEADER_LEN];
        h[..48].copy_from_slice(&self.fields);
        h[48..52].copy_from_slice(&self.crc.to_le_bytes());
        h
    }
}

/// Seals a block whose stored bytes are `stored`: without a key, the header with its CRC-32C;
/// with one, encrypts `stored` in place and returns the header with the flag, the nonce
/// counter and the tag (see `format/crypt.rs`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn seal_in_place(
    key: Option<&BlockKey>,
    bind: Binding,
    offset: u64,
    codec: Codec,
    raw: u64,
    records: u32,
    pad: u32,
    chunk: bool,
    stored: &mut [u8],
) -> [u8; BLOCK_HEADER_LEN] {
    let mut fields = header_fields(codec.id(), stored.len() as u64, raw, records, pad);
    if chunk {
        fields[5] = FLAG_CHUNK;
    }
    let Some(key) = key else {
        return BlockSeal::with_fields(bind, offset, fields).finish_over(stored);
    };
    fields[5] |= FLAG_ENCRYPTED;
    let counter = key.next_counter();
    fields[32..40].copy_from_slice(&counter.to_le_bytes());
    let tag = key.seal(bind, offset, &fields, counter, stored);
    let mut h = [0u8; BLOCK_HEADER_LEN];
    h[..48].copy_from_slice(&fields);
    h[48..].copy_from_slice(&tag);
    h
}

/// The frame of a record of `len` payload bytes inside a block.
#[inline]
pub fn record_frame(len: usize) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    f[0..4].copy_from_slice(&(len as u32).to_le_bytes());
    f
}

/// Parses a block header's fields (not its checksum).
pub fn parse_block_header(h: &[u8]) -> Result<BlockHeader, &'static str> {
    if h.len() < BLOCK_HEADER_LEN {
        return Err("truncated block header");
    }
    if &h[0..4] != BLOCK_MAGIC {
        return Err("bad block magic");
    }
    let codec = h[4];
    if codec > 2 {
        return Err("unknown block codec");
    }
    if h[5] & !(FLAG_ENCRYPTED | FLAG_CHUNK) != 0 {
        return Err("unsupported block flags");
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let header = BlockHeader {
        codec,
        stored: u64_at(8),
        raw: u64_at(16),
        records: u32_at(24),
        pad: u32_at(28),
        encrypted: h[5] & FLAG_ENCRYPTED != 0,
        chunk: h[5] & FLAG_CHUNK != 0,
    };
    if header.chunk && header.records > 1 {
        return Err("chunk block with more than one record");
    }
    if header.pad as usize >= PAD_ALIGN {
        return Err("block padding too large");
    }
    if codec == 0 && header.raw != header.stored {
        return Err("raw block whose lengths disagree");
    }
    Ok(header)
}

/// True when `h`, a plaintext block's 64 header bytes, holds the CRC-32C of its binding (`bind`
/// at `offset`), its fields and `stored`, its stored bytes.
pub(crate) fn crc_matches(h: &[u8], stored: &[u8], bind: Binding, offset: u64) -> bool {
    let mut fields = [0u8; 48];
    fields.copy_from_slice(&h[..48]);
    BlockSeal::with_fields(bind, offset, fields).finish_over(stored)[..] == h[..BLOCK_HEADER_LEN]
}

/// Compresses `src` into `dst` with `codec`; `None` when it does not fit (does not shrink
/// enough) or the codec fails. `Raw` is never compressed.
pub fn compress(codec: Codec, src: &[u8], dst: &mut [u8]) -> Option<usize> {
    match codec {
        Codec::Raw => None,
        Codec::Lz4 => lz4_into(src, dst),
        Codec::Zstd(level) => zstd_into(src, dst, level),
    }
    .filter(|n| *n < src.len())
}

/// Compresses `raw` with `codec` in place, when that shrinks it: into a per-thread scratch
/// buffer (kept: no allocation per block once it has grown, and no second staging buffer),
/// copied back over the raw bytes. The compressed length, `None` if the codec does not shrink
/// them (`raw` is then as it was).
pub fn compress_in_place(codec: Codec, raw: &mut [u8]) -> Option<usize> {
    with_scratch(codec, raw.len(), |out| {
        let n = compress(codec, raw, out)?;
        raw[..n].copy_from_slice(&out[..n]);
        Some(n)
    })
}

/// True when `codec` shrinks `sample` (compressed into the per-thread scratch, then dropped).
pub fn shrinks(codec: Codec, sample: &[u8]) -> bool {
    with_scratch(codec, sample.len(), |out| compress(codec, sample, out)).is_some()
}

/// `f` with the per-thread scratch buffer, room for `codec`'s output of `len` bytes.
fn with_scratch<T>(codec: Codec, len: usize, f: impl FnOnce(&mut [u8]) -> Option<T>) -> Option<T> {
    thread_local! {
        static OUT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    OUT.with(|s| {
        let mut s = s.borrow_mut();
        // lz4_flex compresses straight into room for its worst case; zstd needs no more than
        // the raw length (a larger output is refused anyway).
        let max = match codec {
            Codec::Lz4 => lz4_flex::block::get_maximum_output_size(len),
            _ => len,
        };
        if s.len() < max {
            s.resize(max, 0);
        }
        f(&mut s[..max])
    })
}

/// lz4_flex wants room for its worst case (110% + 20 bytes); a smaller `dst` (a staging
/// buffer the size of the block) gets the output through a per-thread scratch buffer, kept
/// for the next block. The hash table is kept per thread too (`compress_into_with_table`; a
/// plain `compress_into` allocates its 16 KiB table on every call): no allocation per block
/// once both have grown.
fn lz4_into(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    use lz4_flex::block::{CompressTable, compress_into_with_table};
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        static TABLE: std::cell::RefCell<Option<CompressTable>> =
            const { std::cell::RefCell::new(None) };
    }
    TABLE.with(|t| {
        let mut t = t.borrow_mut();
        let table = t.get_or_insert_with(CompressTable::large);
        let max = lz4_flex::block::get_maximum_output_size(src.len());
        if dst.len() >= max {
            return compress_into_with_table(src, dst, table).ok();
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < max {
                s.resize(max, 0);
            }
            let n = compress_into_with_table(src, &mut s[..max], table).ok()?;
            let out = dst.get_mut(..n)?;
            out.copy_from_slice(&s[..n]);
            Some(n)
        })
    })
}

thread_local! {
    /// Per-thread zstd contexts, kept: a block costs no context allocation after the first.
    static ZSTD_C: std::cell::RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { std::cell::RefCell::new(None) };
    static ZSTD_D: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

fn zstd_into(src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
    ZSTD_C.with(|c| {
        let mut c = c.borrow_mut();
        match c.as_mut() {
            Some((l, _)) if *l == level => {}
            Some((l, z)) => {
                z.set_compression_level(level).ok()?;
                *l = level;
            }
            None => *c = Some((level, zstd::bulk::Compressor::new(level).ok()?)),
        }
        let (_, z) = c.as_mut()?;
        z.compress_to_buffer(src, dst).ok()
    })
}

fn zstd_decode(src: &[u8], dst: &mut [u8]) -> Result<usize, &'static str> {
    ZSTD_D.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new().map_err(|_| "zstd context")?);
        }
        let z = d.as_mut().ok_or("zstd context")?;
        z.decompress_to_buffer(src, dst)
            .map_err(|_| "zstd block does not decode")
    })
}

/// Decompresses a block's stored bytes into `dst` (exactly the header's raw length).
pub fn decompress(codec: u8, src: &[u8], dst: &mut [u8]) -> Result<(), &'static str> {
    let n = match codec {
        1 => lz4_flex::block::decompress_into(src, dst).map_err(|_| "lz4 block does not decode")?,
        2 => zstd_decode(src, dst)?,
        _ => return Err("unknown block codec"),
    };
    if n != dst.len() {
        return Err("block decodes to another length than its header says");
    }
    Ok(())
}

/// The record at `off` of a block's decoded bytes `raw`: `Ok(None)` at its end.
pub fn record_in(raw: &[u8], off: usize) -> Result<Option<Range<usize>>, &'static str> {
    if off == raw.len() {
        return Ok(None);
    }
    if raw.len() - off < FRAME_LEN {
        return Err("truncated record frame in a block");
    }
    let len = u32::from_le_bytes([raw[off], raw[off + 1], raw[off + 2], raw[off + 3]]) as usize;
    if raw[off + 4..off + 8] != [0, 0, 0, 0] {
        return Err("record frame with nonzero reserved bytes");
    }
    let start = off + FRAME_LEN;
    if len > raw.len() - start {
        return Err("record runs past the end of its block");
    }
    Ok(Some(start..start + len))
}

// ---- CRC-32C (Castagnoli), the checksum of segment headers and blocks ----
//
// Computed with `crc-fast` (carry-less multiply folding, SSE4.2/AVX-512 picked at run time,
// a table fallback elsewhere). At the sizes the engine checksums most it is about twice as fast
// as the `crc32c` crate here (`cargo run --release` of a micro-bench, 2026-12-01: 1 MiB
// 18.7 vs 37.4 µs, 64 KiB 1.15 vs 2.52 µs, 4 KiB 97 vs 199 ns; equal at 64 B). The checksum is
// the same function: `block_tests.rs` cross-checks it against the `crc32c` crate (a dev-dependency,
// also the independent implementation loadgen's checker uses).

/// CRC-32C of `data`.
#[inline]
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC-32C of the bytes whose CRC-32C is `crc` followed by `data` (the `crc32c` crate's
/// `crc32c_append`).
#[inline]
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The digest's state is the running register, which the final XOR turns into a CRC: a
    // finished CRC continues from its complement.
    let mut d = Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;
