//! The segment codec: the one walk over a segment's bytes, for every reader of them (the
//! engine's `SpillReader` over a map or a read buffer, `SegmentReader` over a file it reads by
//! stream, `testing::parse_segment` and so the fuzz targets). [`SegmentCursor::open`] checks
//! the segment header against what the reader expects; then each block is found up to the
//! written length, checked (its CRC, or its tag as it is decrypted), decoded, and its records
//! handed out in order, a record in chunks put together first. Pure: the reader hands in the
//! bytes (a whole segment, or each block as it reads it) and the buffers to decode into.

use bytes::Bytes;

use super::block::{self, BLOCK_HEADER_LEN, Binding, BlockHeader};
use super::crypt::BlockKey;
use super::segment::{self, Damage, FRAME_LEN, HEADER_LEN, SegmentHeader};
use crate::metrics::Counters;

/// Where the cursor decrypts, decodes and puts chunked records together: zero-filled buffers
/// of a given length, which the records handed out own (`Bytes::from_owner`). The reader's
/// pool; `format` keeps none.
pub(crate) trait DecodeBufs {
    /// One buffer; it goes back to its pool when dropped.
    type Buf: AsRef<[u8]> + AsMut<[u8]> + Send + 'static;
    /// A zero-filled buffer of `len` bytes.
    fn take(&self, len: usize) -> Self::Buf;
}

/// What a reader expects a segment's header to say (`None`: whatever it says).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Expected {
    pub(crate) segment: Option<u32>,
    pub(crate) engine: Option<u64>,
    pub(crate) generation: Option<u32>,
    /// The reader's key id; 0: it holds no key, and reads plaintext segments only.
    pub(crate) key_id: u64,
}

/// A walk over one segment's blocks, from the first to the written length.
pub(crate) struct SegmentCursor<B: DecodeBufs> {
    header: SegmentHeader,
    /// The next block's offset.
    off: u64,
    /// The segment's written length.
    end: u64,
    /// The block whose records are being handed out.
    block: Option<CurBlock<B::Buf>>,
    bufs: B,
}

impl<B: DecodeBufs> SegmentCursor<B> {
    /// Checks the segment header at the start of `head` (the segment's first bytes, as many as
    /// it has) against `want`; the walk then goes from the first block to `end`, the written
    /// length. Damage at offset 0, or at the end of a file shorter than a header.
    pub(crate) fn open(head: &[u8], end: u64, want: Expected, bufs: B) -> Result<Self, Damage> {
        if head.len() < HEADER_LEN {
            return Err(Damage {
                offset: head.len() as u64,
                detail: "segment truncated inside its header",
            });
        }
        let bad = |detail| Damage { offset: 0, detail };
        let h = segment::parse_header(head).map_err(bad)?;
        match (h.key_id, want.key_id) {
            (None, 0) => {}
            (Some(k), id) if k == id => {}
            (Some(_), 0) => {
                return Err(bad(
                    "segment is encrypted: its key lived only in the memory of the engine that wrote it",
                ));
            }
            (Some(_), _) => {
                return Err(bad(
                    "segment encrypted by another engine (its key died with it)",
                ));
            }
            (None, _) => return Err(bad("plaintext segment in an encrypted engine")),
        }
        if want.segment.is_some_and(|s| s != h.segment)
            || want.engine.is_some_and(|e| e != h.engine)
        {
            return Err(bad("header names another segment or engine"));
        }
        if want.generation.is_some_and(|g| g != h.generation) {
            return Err(bad("header is of another use of this file"));
        }
        Ok(SegmentCursor {
            header: h,
            off: HEADER_LEN as u64,
            end,
            block: None,
            bufs,
        })
    }

    /// What the segment's header says.
    pub(crate) fn header(&self) -> SegmentHeader {
        self.header
    }

    /// The next record of `seg`, the segment's bytes in memory (shorter than the written
    /// length if its file was truncated); `None` at the written length. `key`: the engine's,
    /// when its blocks are encrypted; `c` counts the bytes read, decrypted and decoded.
    pub(crate) fn next_in(
        &mut self,
        seg: &Bytes,
        key: Option<&BlockKey>,
        c: Option<&Counters>,
    ) -> Result<Option<Bytes>, Damage> {
        loop {
            if let Some(rec) = self.record()? {
                return Ok(Some(rec));
            }
            let at = usize::try_from(self.off).map_or(seg.len(), |o| o.min(seg.len()));
            if !self.push(seg.slice(at..), key, c)? {
                return Ok(None);
            }
        }
    }

    /// The next record of the blocks pushed so far; `None` when the next block is needed.
    pub(crate) fn record(&mut self) -> Result<Option<Bytes>, Damage> {
        let Some(b) = self.block.as_mut() else {
            return Ok(None);
        };
        match b.next() {
            Ok(Some(rec)) => Ok(Some(rec)),
            Ok(None) => {
                // Spent; kept while it holds a chunked record still missing chunks.
                if b.part.is_none() {
                    self.block = None;
                }
                Ok(None)
            }
            Err(detail) => Err(Damage {
                offset: b.offset,
                detail,
            }),
        }
    }

    /// The length of the next block (header, stored bytes and padding), from `head`, its first
    /// bytes (a block header's worth, or what the file has left); `None` at the written length.
    /// For a reader that reads one block at a time: it then [`pushes`](Self::push) them.
    pub(crate) fn next_len(&self, head: &[u8]) -> Result<Option<usize>, Damage> {
        Ok(self.locate(head)?.map(|(_, len)| len))
    }

    /// Takes the next block, `bytes` from its header on (as many as the file has: fewer than
    /// its length is a truncated segment), checks and decodes it; its records come next.
    /// `false` at the written length. `key` and `c` as in [`SegmentCursor::next_in`].
    pub(crate) fn push(
        &mut self,
        bytes: Bytes,
        key: Option<&BlockKey>,
        c: Option<&Counters>,
    ) -> Result<bool, Damage> {
        let Some((h, len)) = self.locate(&bytes)? else {
            return Ok(false);
        };
        let offset = self.off;
        let damage = |detail| Damage { offset, detail };
        let stored_end = BLOCK_HEADER_LEN + h.stored as usize;
        if bytes.len() < stored_end {
            return Err(damage("segment truncated inside a block"));
        }
        if len as u64 > self.end - offset {
            return Err(damage("block padding runs past the end of the segment"));
        }
        let stored = bytes.slice(BLOCK_HEADER_LEN..stored_end);
        let cb = self
            .open_block(h, &bytes[..BLOCK_HEADER_LEN], stored, key, c)
            .and_then(|cb| cb.follow(self.block.take(), &self.bufs))
            .map_err(damage)?;
        self.off += len as u64;
        self.block = Some(cb);
        Ok(true)
    }

    /// The one place a block is checked and decoded: the block at the cursor, `h` its parsed
    /// header, `head` its 64 header bytes, `stored` its stored bytes. A plaintext block's CRC
    /// is checked; with `key` (an encrypting engine's reader), an encrypted block is
    /// decrypted and authenticated into a lent buffer instead, and a plaintext one refused.
    /// Then a compressed block is decoded into a lent buffer. `c` as in `next_in`.
    fn open_block(
        &self,
        h: BlockHeader,
        head: &[u8],
        stored: Bytes,
        key: Option<&BlockKey>,
        c: Option<&Counters>,
    ) -> Result<CurBlock<B::Buf>, &'static str> {
        let (offset, bufs) = (self.off, &self.bufs);
        let bind = Binding {
            segment: self.header.segment,
            generation: self.header.generation,
            engine: self.header.engine,
        };
        let (mut decrypt, mut decompress) = (0, 0);
        let stored = match (h.encrypted, key) {
            (false, None) if block::crc_matches(head, &stored, bind, offset) => stored,
            (false, None) => return Err("block checksum mismatch"),
            (true, Some(key)) => {
                let t = std::time::Instant::now();
                let mut plain = bufs.take(stored.len());
                plain.as_mut().copy_from_slice(&stored);
                key.open(bind, offset, head, plain.as_mut())?;
                decrypt = t.elapsed().as_nanos() as u64;
                Bytes::from_owner(plain)
            }
            (true, None) => {
                return Err(
                    "encrypted block: only the engine holding its key can check and read it",
                );
            }
            (false, Some(_)) => return Err("plaintext block in an encrypted engine's segment"),
        };
        if h.codec != 0 && h.raw > MAX_DECODED {
            return Err("compressed block claims a decoded length past 1 GiB");
        }
        let data = if h.codec == 0 {
            stored
        } else {
            let t = std::time::Instant::now();
            let mut out = bufs.take(h.raw as usize);
            block::decompress(h.codec, &stored, out.as_mut())?;
            decompress = t.elapsed().as_nanos() as u64;
            Bytes::from_owner(out)
        };
        if let Some(c) = c {
            Counters::add(&c.decrypt_nanos, decrypt);
            Counters::add(&c.decompress_nanos, decompress);
            Counters::add(&c.physical_bytes_read, BLOCK_HEADER_LEN as u64 + h.stored);
            Counters::add(&c.logical_bytes_read, BLOCK_HEADER_LEN as u64 + h.raw);
        }
        Ok(CurBlock {
            data,
            off: 0,
            left: h.records,
            offset,
            chunk: h.chunk,
            part: None,
        })
    }

    /// The header of the block at the cursor, read from `head` (its first bytes), and the
    /// block's length; checks nothing but the header's own fields and that the block ends
    /// within the written length. `None` at the written length.
    fn locate(&self, head: &[u8]) -> Result<Option<(BlockHeader, usize)>, Damage> {
        let damage = |detail| Damage {
            offset: self.off,
            detail,
        };
        let left = self.end.saturating_sub(self.off);
        if left == 0 {
            // A block still held here is putting a chunked record together: `record` lets a
            // spent block go otherwise, and the next block is asked for only once it is spent.
            return match &self.block {
                Some(b) => Err(Damage {
                    offset: b.offset,
                    detail: "segment ends inside a chunked record",
                }),
                None => Ok(None),
            };
        }
        if left < BLOCK_HEADER_LEN as u64 {
            return Err(damage("truncated block header"));
        }
        if head.len() < BLOCK_HEADER_LEN {
            return Err(damage("segment truncated inside a block header"));
        }
        let h = block::parse_block_header(head).map_err(damage)?;
        if h.stored > left - BLOCK_HEADER_LEN as u64 {
            return Err(damage("block runs past the end of the segment"));
        }
        Ok(Some((
            h,
            BLOCK_HEADER_LEN + h.stored as usize + h.pad as usize,
        )))
    }
}

/// The largest decoded length a compressed block may claim (a damaged header never makes a
/// reader allocate more).
const MAX_DECODED: u64 = 1 << 30;

/// A checked block's records, handed out in order: views of the segment for a raw block, of a
/// decode buffer for a decrypted or compressed one (back to its pool when the last view goes).
struct CurBlock<T> {
    data: Bytes,
    off: usize,
    left: u32,
    /// The block's offset in the segment (where its damage is reported).
    offset: u64,
    /// A chunk (`block::FLAG_CHUNK`): its decoded bytes are a piece of one record.
    chunk: bool,
    /// A record being put together from its chunks (frame + payload) and the bytes of it
    /// filled so far; the next block must be its next chunk ([`CurBlock::follow`]).
    part: Option<(T, usize)>,
}

impl<T: AsRef<[u8]> + AsMut<[u8]> + Send + 'static> CurBlock<T> {
    /// This block, decoded, after `prev` (the block before it in the segment, if kept): a
    /// chunk of a record larger than a buffer is put together, in a buffer of `bufs` of the
    /// record's length, from its first chunk (whose frame gives the length) and the chunks
    /// that follow it; the record is handed out once whole. Any other sequence is damage.
    fn follow<B: DecodeBufs<Buf = T>>(
        mut self,
        prev: Option<CurBlock<T>>,
        bufs: &B,
    ) -> Result<Self, &'static str> {
        let (mut part, mut filled) = match prev.and_then(|p| p.part) {
            None if !self.chunk => return Ok(self),
            None if self.left == 0 => return Err("chunk without the first chunk of its record"),
            None => {
                let d = &self.data;
                if d.len() < FRAME_LEN || d[4..8] != [0, 0, 0, 0] {
                    return Err("first chunk without its record's frame");
                }
                let total = FRAME_LEN + u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as usize;
                match total.cmp(&d.len()) {
                    // Whole in its first chunk (a buffer with room for it all).
                    std::cmp::Ordering::Equal => return Ok(self),
                    std::cmp::Ordering::Less => {
                        return Err("first chunk runs past the end of its record");
                    }
                    std::cmp::Ordering::Greater => (bufs.take(total), 0),
                }
            }
            Some(_) if !self.chunk || self.left != 0 => {
                return Err("chunked record cut short by another block");
            }
            Some(p) => p,
        };
        let out = part.as_mut();
        let end = filled + self.data.len();
        if end > out.len() {
            return Err("chunk runs past the end of its record");
        }
        out[filled..end].copy_from_slice(&self.data);
        filled = end;
        if filled < out.len() {
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
    fn next(&mut self) -> Result<Option<Bytes>, &'static str> {
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

/// The tests' walks: of single blocks, with buffers of their own.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::block::{Codec, seal_in_place};

    /// Buffers of the tests' own, each a fresh `Vec` (`vec!` zero-fills lazily: a 1 GiB claim
    /// costs no page until written).
    pub(crate) struct VecBufs;

    impl DecodeBufs for VecBufs {
        type Buf = Vec<u8>;
        fn take(&self, len: usize) -> Vec<u8> {
            vec![0; len]
        }
    }

    /// The records of the blocks of `buf` from `off` to `end`, walked by the cursor as a reader
    /// walks them (no segment header before them: `bind` says what they are bound to), until the
    /// first damage.
    pub(crate) fn walk_from(
        buf: &[u8],
        off: usize,
        end: usize,
        bind: Binding,
        key: Option<&BlockKey>,
    ) -> Result<Vec<Vec<u8>>, Damage> {
        let mut c = SegmentCursor {
            header: SegmentHeader {
                segment: bind.segment,
                engine: bind.engine,
                generation: bind.generation,
                version: segment::VERSION,
                key_id: key.map(BlockKey::id),
            },
            off: off as u64,
            end: end as u64,
            block: None,
            bufs: VecBufs,
        };
        let seg = Bytes::copy_from_slice(buf);
        let mut out = Vec::new();
        while let Some(r) = c.next_in(&seg, key, None)? {
            out.push(r.to_vec());
        }
        Ok(out)
    }

    const B: Binding = Binding {
        segment: 3,
        generation: 7,
        engine: 0xE1,
    };

    /// The walk over one block at offset 64 of codec `codec` claiming `raw` decoded bytes,
    /// its 16 stored bytes zero and its CRC valid.
    fn decode(codec: u8, raw: u64) -> Result<Vec<Vec<u8>>, &'static str> {
        let mut stored = [0u8; 16];
        let codec = match codec {
            0 => Codec::Raw,
            1 => Codec::Lz4,
            _ => Codec::Zstd(1),
        };
        let mut buf = vec![0u8; 64];
        buf.extend_from_slice(&seal_in_place(
            None,
            B,
            64,
            codec,
            raw,
            1,
            0,
            false,
            &mut stored,
        ));
        buf.extend_from_slice(&stored);
        walk_from(&buf, 64, buf.len(), B, None).map_err(|d| d.detail)
    }

    /// A compressed block claiming a decoded length past 1 GiB is refused before anything is
    /// allocated for it; exactly 1 GiB is not refused for its length (its bytes then fail to
    /// decode), and a raw block's length is never a decoded length. (The planted-bug run of
    /// cargo-mutants found no test reaching this check.)
    #[test]
    fn a_decoded_length_past_1_gib_is_refused() {
        const PAST: &str = "compressed block claims a decoded length past 1 GiB";
        assert_eq!(decode(1, MAX_DECODED + 1).err(), Some(PAST));
        assert_eq!(decode(2, u64::MAX).err(), Some(PAST));
        let at = decode(1, MAX_DECODED).err();
        assert!(at.is_some() && at != Some(PAST), "{at:?}");
        assert!(decode(0, MAX_DECODED + 1).err() != Some(PAST));
    }

    /// The header's checks, each against what the reader expects: the segment, the engine and
    /// the generation when it names them, and the key id always (0: a reader without a key).
    #[test]
    fn a_header_is_checked_against_what_the_reader_expects() {
        let open = |h: [u8; HEADER_LEN], want: Expected| {
            SegmentCursor::open(&h, HEADER_LEN as u64, want, VecBufs).map(|c| c.header())
        };
        let want = Expected {
            segment: Some(3),
            engine: Some(0xE1),
            generation: Some(7),
            key_id: 0,
        };
        let mine = segment::encode_header(3, 0xE1, 7, 0);
        assert_eq!(open(mine, want).map(|h| h.generation), Ok(7));
        assert_eq!(open(mine, Expected::default()).map(|h| h.segment), Ok(3));
        let bad = |h, want| open(h, want).map(|_| ()).unwrap_err();
        let at0 = |detail| Damage { offset: 0, detail };
        let other = "header names another segment or engine";
        assert_eq!(bad(segment::encode_header(4, 0xE1, 7, 0), want), at0(other));
        assert_eq!(bad(segment::encode_header(3, 0xE2, 7, 0), want), at0(other));
        assert_eq!(
            bad(segment::encode_header(3, 0xE1, 8, 0), want),
            at0("header is of another use of this file")
        );
        // Keys: a reader without one refuses an encrypted segment; one with a key refuses a
        // segment of another key and a plaintext one, and reads its own.
        let sealed = segment::encode_header(3, 0xE1, 7, 9);
        assert_eq!(
            bad(sealed, want),
            at0(
                "segment is encrypted: its key lived only in the memory of the engine that wrote it"
            )
        );
        let keyed = Expected { key_id: 9, ..want };
        assert_eq!(open(sealed, keyed).map(|h| h.key_id), Ok(Some(9)));
        assert_eq!(
            bad(sealed, Expected { key_id: 8, ..want }),
            at0("segment encrypted by another engine (its key died with it)")
        );
        assert_eq!(
            bad(mine, keyed),
            at0("plaintext segment in an encrypted engine")
        );
        // Shorter than a header: damage at its end.
        assert_eq!(
            SegmentCursor::open(&mine[..40], 64, want, VecBufs)
                .map(|_| ())
                .unwrap_err(),
            Damage {
                offset: 40,
                detail: "segment truncated inside its header"
            }
        );
    }

    /// A segment's bytes from offset 0 (a blank header: the walks below start at 64) with the
    /// blocks `(decoded bytes, records, chunk, pad)`, raw, each sealed valid at its place: only
    /// the walk's own checks can refuse them.
    fn blocks(bs: &[(&[u8], u32, bool, u32)]) -> Vec<u8> {
        let mut v = vec![0u8; HEADER_LEN];
        for &(data, records, chunk, pad) in bs {
            let mut stored = data.to_vec();
            let (off, raw) = (v.len() as u64, data.len() as u64);
            let h = seal_in_place(
                None,
                B,
                off,
                Codec::Raw,
                raw,
                records,
                pad,
                chunk,
                &mut stored,
            );
            v.extend_from_slice(&h);
            v.extend_from_slice(&stored);
            v.resize(v.len() + pad as usize, 0);
        }
        v
    }

    /// Records framed back to back, as a block's decoded bytes.
    fn frames(recs: &[&[u8]]) -> Vec<u8> {
        let mut v = Vec::new();
        for r in recs {
            v.extend_from_slice(&block::record_frame(r.len()));
            v.extend_from_slice(r);
        }
        v
    }

    fn walk(v: &[u8]) -> Result<Vec<Vec<u8>>, &'static str> {
        walk_from(v, HEADER_LEN, v.len(), B, None).map_err(|d| d.detail)
    }

    /// Valid blocks (their checksums good) that break the walk: a record count the frames do
    /// not match, padding past the written length.
    #[test]
    fn a_valid_block_the_walk_refuses() {
        let two = frames(&[b"ab", b"cd"]);
        assert_eq!(
            walk(&blocks(&[(&two, 2, false, 0)])),
            Ok(vec![b"ab".to_vec(), b"cd".to_vec()])
        );
        assert_eq!(
            walk(&blocks(&[(&two, 3, false, 0)])),
            Err("block holds fewer records than its header says")
        );
        assert_eq!(
            walk(&blocks(&[(&two, 1, false, 0)])),
            Err("block holds more records than its header says")
        );
        let padded = blocks(&[(&two, 2, false, 100)]);
        assert_eq!(walk(&padded).map(|r| r.len()), Ok(2));
        assert_eq!(
            walk_from(&padded, HEADER_LEN, padded.len() - 1, B, None).map_err(|d| d.detail),
            Err("block padding runs past the end of the segment")
        );
    }

    /// A record in chunks is put together only from its first chunk and the chunks that follow
    /// it, each valid: any other sequence is damage, each by its name.
    #[test]
    fn chunks_out_of_their_order_are_damage() {
        let rec: Vec<u8> = (0..100u8).collect();
        let whole = frames(&[&rec]);
        let (a, b) = whole.split_at(50);
        assert_eq!(
            walk(&blocks(&[(a, 1, true, 0), (b, 0, true, 0)])),
            Ok(vec![rec.clone()])
        );
        // Whole in its first chunk, an empty record too (exactly a frame).
        assert_eq!(
            walk(&blocks(&[(&whole, 1, true, 0)])),
            Ok(vec![rec.clone()])
        );
        assert_eq!(
            walk(&blocks(&[(&frames(&[b""]), 1, true, 0)])),
            Ok(vec![vec![]])
        );
        assert_eq!(
            walk(&blocks(&[(b, 0, true, 0)])),
            Err("chunk without the first chunk of its record")
        );
        let no_frame = "first chunk without its record's frame";
        assert_eq!(walk(&blocks(&[(&whole[..4], 1, true, 0)])), Err(no_frame));
        let mut reserved = whole.clone();
        reserved[5] = 1;
        assert_eq!(walk(&blocks(&[(&reserved, 1, true, 0)])), Err(no_frame));
        let mut long = whole.clone();
        long.push(0);
        assert_eq!(
            walk(&blocks(&[(&long, 1, true, 0)])),
            Err("first chunk runs past the end of its record")
        );
        let cut = "chunked record cut short by another block";
        let other = frames(&[b"x"]);
        assert_eq!(
            walk(&blocks(&[(a, 1, true, 0), (&other, 1, false, 0)])),
            Err(cut)
        );
        assert_eq!(
            walk(&blocks(&[(a, 1, true, 0), (&whole, 1, true, 0)])),
            Err(cut)
        );
        assert_eq!(
            walk(&blocks(&[(a, 1, true, 0), (&whole, 0, true, 0)])),
            Err("chunk runs past the end of its record")
        );
        assert_eq!(
            walk(&blocks(&[(a, 1, true, 0)])),
            Err("segment ends inside a chunked record")
        );
    }
}
