//! Reading a segment's bytes for the reader: the fd to read through (the writer's, kept with the
//! file, or one opened by name), one `pread` of a small segment into a kept read buffer, and the
//! page touch of an async reader's map; and a checked block's records handed out in order
//! (`CurBlock`: decrypted and decoded first when they must be).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;

use crate::format::block::{self, BLOCK_HEADER_LEN, Binding, BlockHeader};
use crate::format::crypt::BlockKey;
use crate::format::segment::{FRAME_LEN, HEADER_LEN};
use crate::io::{DECODE_POOL, Decoded, FileHandle};
use crate::metrics::Counters;

/// Touches one byte of every page of `map` (read-ahead for async readers, on an offload
/// thread): the page faults of a cold map are taken here, so the reader's caller finds the
/// pages resident.
pub(super) fn touch_pages(map: &[u8]) {
    let mut acc = 0u8;
    for i in (0..map.len()).step_by(4096) {
        acc ^= map[i];
    }
    std::hint::black_box(acc);
}

/// A segment's fd for one open: the writer's, kept with the file, or one opened here (closed
/// when the open is done: a map needs no fd).
pub(super) enum SegmentFd {
    Kept(Arc<FileHandle>),
    Opened(OwnedFd),
}

impl AsFd for SegmentFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            SegmentFd::Kept(h) => h.as_fd(),
            SegmentFd::Opened(fd) => fd.as_fd(),
        }
    }
}

/// Why [`read_small`] failed.
pub(super) enum ReadSmall {
    Io(std::io::Error),
    /// The file ends inside its header, after this many bytes.
    Short(usize),
}

/// One `pread` of a small segment's `end` written bytes into a kept read buffer
/// (`core.read_bufs`), which comes back when the last record pointing into it goes; a short
/// read is a truncated file (no fstat).
pub(super) fn read_small(
    core: &crate::shared::EngineShared,
    file: BorrowedFd<'_>,
    end: usize,
) -> std::result::Result<Bytes, ReadSmall> {
    let mut buf = core.read_bufs.take(end);
    let got = read_up_to(file, buf.space()).map_err(ReadSmall::Io)?;
    if got < HEADER_LEN {
        return Err(ReadSmall::Short(got));
    }
    buf.truncate(got);
    Ok(Bytes::from_owner(buf))
}

/// Reads from offset 0 until `buf` is full or the file ends; returns the bytes read.
pub(super) fn read_up_to(file: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match crate::sys::rw::pread(file, &mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The largest decoded length a compressed block may claim (a damaged header never makes a
/// reader allocate more).
const MAX_DECODED: u64 = 1 << 30;

/// A checked block's records, handed out in order: views of the segment for a raw block, of a
/// pooled decode buffer for a compressed one (back to the pool when the last view goes).
pub(crate) struct CurBlock {
    data: Bytes,
    off: usize,
    left: u32,
    /// The block's offset in the segment (where its damage is reported).
    pub(crate) offset: u64,
    /// A chunk (`block::FLAG_CHUNK`): its decoded bytes are a piece of one record.
    chunk: bool,
    /// A record being put together from its chunks (frame + payload) and the bytes of it
    /// filled so far; the next block must be its next chunk ([`CurBlock::follow`]).
    part: Option<(Decoded, usize)>,
}

impl CurBlock {
    /// Decodes a block whose checksum was checked (a plaintext block), or, with `sealed`
    /// (the engine's key, the block's binding and its 64 header bytes), decrypts and checks
    /// an encrypted one into a pooled buffer first: `stored` are its stored bytes.
    pub(crate) fn decode(
        h: BlockHeader,
        stored: Bytes,
        offset: u64,
        c: &crate::metrics::Counters,
        sealed: Option<(&BlockKey, Binding, &[u8])>,
    ) -> std::result::Result<Self, &'static str> {
        if h.codec != 0 && h.raw > MAX_DECODED {
            return Err("compressed block claims a decoded length past 1 GiB");
        }
        let stored = match (h.encrypted, sealed) {
            (false, None) => stored,
            (true, Some((key, bind, header))) => {
                let t = std::time::Instant::now();
                let mut plain = DECODE_POOL.take(stored.len());
                plain.as_mut_slice().copy_from_slice(&stored);
                key.open(bind, offset, header, plain.as_mut_slice())?;
                Counters::add(&c.decrypt_nanos, t.elapsed().as_nanos() as u64);
                Bytes::from_owner(plain)
            }
            (true, None) => {
                return Err("encrypted block: only the engine holding its key can read it");
            }
            (false, Some(_)) => return Err("plaintext block in an encrypted engine's segment"),
        };
        let data = if h.codec == 0 {
            stored
        } else {
            let t = std::time::Instant::now();
            let mut out = DECODE_POOL.take(h.raw as usize);
            block::decompress(h.codec, &stored, out.as_mut_slice())?;
            Counters::add(&c.decompress_nanos, t.elapsed().as_nanos() as u64);
            Bytes::from_owner(out)
        };
        Counters::add(&c.physical_bytes_read, (BLOCK_HEADER_LEN as u64) + h.stored);
        Counters::add(&c.logical_bytes_read, (BLOCK_HEADER_LEN as u64) + h.raw);
        Ok(CurBlock {
            data,
            off: 0,
            left: h.records,
            offset,
            chunk: h.chunk,
            part: None,
        })
    }

    /// True while a chunked record is missing chunks: a segment that ends here is damaged.
    pub(crate) fn assembling(&self) -> bool {
        self.part.is_some()
    }

    /// This block, decoded, after `prev` (the block before it in the segment, if kept): a
    /// chunk of a record larger than a buffer is put together, in a decode-pool buffer of the
    /// record's length, from its first chunk (whose frame gives the length) and the chunks
    /// that follow it; the record is handed out once whole. Any other sequence is damage.
    pub(crate) fn follow(
        mut self,
        prev: Option<CurBlock>,
    ) -> std::result::Result<Self, &'static str> {
        let (mut part, mut filled) = match prev.and_then(|p| p.part) {
            None if !self.chunk => return Ok(self),
            None if self.left == 0 => return Err("chunk without the first chunk of its record"),
            None => {
                let d = &self.data;
                if d.len() < FRAME_LEN || d[4..8] != [0, 0, 0, 0] {
                    return Err("first chunk without its record's frame");
                }
                let total = FRAME_LEN + u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as usize;
                if total == d.len() {
                    // Whole in its first chunk (a buffer with room for it all).
                    return Ok(self);
                }
                if total < d.len() {
                    return Err("first chunk runs past the end of its record");
                }
                (DECODE_POOL.take(total), 0)
            }
            Some(_) if !self.chunk || self.left != 0 => {
                return Err("chunked record cut short by another block");
            }
            Some(p) => p,
        };
        let out = part.as_mut_slice();
        let end = filled + self.data.len();
        if end > out.len() {
            return Err("chunk runs past the end of its record");
        }
        out[filled..end].copy_from_slice(&self.data);
        filled = end;
        if filled < part.as_mut_slice().len() {
            self.data = Bytes::new();
            self.left = 0;
            self.part = Some((part, filled));
        } else {
            self.data = Bytes::from_owner(part);
            self.left = 1;
        }
        Ok(self)
    }

    /// The next record, `None` at the block's end (its count checked).
    pub(crate) fn next(&mut self) -> std::result::Result<Option<Bytes>, &'static str> {
        match block::record_in(&self.data, self.off)? {
            Some(r) => {
                if self.left == 0 {
                    return Err("block holds more records than its header says");
                }
                self.left -= 1;
                self.off = r.end;
                Ok(Some(self.data.slice(r)))
            }
            None if self.left != 0 => Err("block holds fewer records than its header says"),
            None => Ok(None),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn header(codec: u8, raw: u64) -> BlockHeader {
        BlockHeader {
            codec,
            stored: 16,
            raw,
            records: 1,
            pad: 0,
            encrypted: false,
            chunk: false,
        }
    }

    fn decode(h: BlockHeader) -> std::result::Result<CurBlock, &'static str> {
        CurBlock::decode(
            h,
            Bytes::from(vec![0u8; 16]),
            64,
            &Counters::default(),
            None,
        )
    }

    /// A compressed block claiming a decoded length past 1 GiB is refused before anything is
    /// allocated for it; exactly 1 GiB is not refused for its length (its bytes then fail to
    /// decode), and a raw block's length is never a decoded length. (The planted-bug run of
    /// cargo-mutants found no test reaching this check.)
    #[test]
    fn a_decoded_length_past_1_gib_is_refused() {
        const PAST: &str = "compressed block claims a decoded length past 1 GiB";
        assert_eq!(decode(header(1, MAX_DECODED + 1)).err(), Some(PAST));
        assert_eq!(decode(header(2, u64::MAX)).err(), Some(PAST));
        let at = decode(header(1, MAX_DECODED)).err();
        assert!(at.is_some() && at != Some(PAST), "{at:?}");
        assert!(decode(header(0, MAX_DECODED + 1)).err() != Some(PAST));
    }
}
