//! The segment file format (version 3). Knows nothing of tickets or I/O backends.
//!
//! ```text
//! header (64 bytes, at offset 0)
//!   0  magic      b"SPILLRNG"
//!   8  version    u16 LE (2)
//!  10  header_len u16 LE (64)
//!  12  segment    u32 LE   segment number (the file's name)
//!  16  engine     u64 LE   id of the engine that wrote it
//!  24  generation u32 LE   which use of the file this is (a pooled file is reused)
//!  28  flags      u8       bit 0: encrypted (every block is; see format/crypt.rs)
//!  29  reserved   3 zero bytes
//!  32  key id     u64 LE   encrypted: the id of the engine's in-memory key; otherwise 0
//!  40  reserved   20 zero bytes
//!  60  crc        u32 LE   CRC-32C of bytes 0..60
//! blocks, back to back (see format/block.rs): a 64-byte block header (codec, stored and raw
//! lengths, record count, padding, CRC-32C bound to segment, generation, engine id and the
//! block's offset), the stored bytes (the records' frames, raw or compressed), then `pad` zeros
//! records inside a block, once decoded
//!   0  len        u32 LE   payload length
//!   4  reserved   u32      zero
//!   8  payload
//! ```
//!
//! The generation, the segment number, the engine id and the block's offset are bound into
//! every block's checksum, so a block left in a recycled file by an earlier use, or pasted from
//! another segment or another engine's segment of the same number, never parses as one of
//! this use's blocks. Records carry no checksum of their own: the block's covers them
//! (version 1 had a CRC per record frame; version 2 had version 3's blocks without the engine
//! id in their binding: a segment of either is refused with a typed `Corrupt` error by its
//! version, never read as version 3).
//!
//! The writer knows each segment's logical length; in direct mode every block but a segment's
//! last ends on 4 KiB (its `pad`), and the file is padded with zeros to 4 KiB past the logical
//! length. A reader parses exactly the logical length, so a torn or truncated file is detected
//! and located, and wrong bytes are never returned.

use super::block;

/// Bytes of the segment header.
pub const HEADER_LEN: usize = 64;
/// Bytes of a record's frame inside a block (length, 4 reserved zero bytes).
pub const FRAME_LEN: usize = 8;
/// Largest payload one record can hold.
pub const MAX_RECORD: u64 = u32::MAX as u64;
/// Format version written (and the only one read) by this build.
pub const VERSION: u16 = 3;

const MAGIC: &[u8; 8] = b"SPILLRNG";

/// Segment flags bit: the segment's blocks are encrypted under key `key_id`.
pub const FLAG_ENCRYPTED: u8 = 1;

/// The header of use `generation` of segment `segment`, written by engine `engine`; `key_id`
/// nonzero for an encrypted segment (the id of the key its blocks are sealed with).
pub(crate) fn encode_header(
    segment: u32,
    engine: u64,
    generation: u32,
    key_id: u64,
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    h[12..16].copy_from_slice(&segment.to_le_bytes());
    h[16..24].copy_from_slice(&engine.to_le_bytes());
    h[24..28].copy_from_slice(&generation.to_le_bytes());
    if key_id != 0 {
        h[28] = FLAG_ENCRYPTED;
        h[32..40].copy_from_slice(&key_id.to_le_bytes());
    }
    let crc = block::crc32c(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// What a valid header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Segment number within its task directory.
    pub segment: u32,
    /// Id of the engine that wrote it.
    pub engine: u64,
    /// Which use of the file this is.
    pub generation: u32,
    /// Format version.
    pub version: u16,
    /// The id of the key the blocks are encrypted with (`None`: not encrypted). The key
    /// itself lived only in the writing engine's memory.
    pub key_id: Option<u64>,
}

/// Parses and checks a segment header. Used by readers and to classify a stray file.
pub fn parse_header(buf: &[u8]) -> Result<SegmentHeader, &'static str> {
    if buf.len() < HEADER_LEN {
        return Err("file shorter than the segment header");
    }
    if &buf[0..8] != MAGIC {
        return Err("bad magic: not a spillring segment");
    }
    let stored = u32::from_le_bytes([buf[60], buf[61], buf[62], buf[63]]);
    if block::crc32c(&buf[..60]) != stored {
        return Err("header checksum mismatch");
    }
    let version = u16::from_le_bytes([buf[8], buf[9]]);
    if version == 1 {
        return Err("segment format version 1: this build reads version 3 only");
    }
    if version == 2 {
        return Err(
            "segment format version 2 (blocks not bound to their engine): this build reads version 3 only",
        );
    }
    if version != VERSION {
        return Err("unsupported segment format version");
    }
    if u16::from_le_bytes([buf[10], buf[11]]) as usize != HEADER_LEN {
        return Err("unexpected header length");
    }
    if buf[28] & !FLAG_ENCRYPTED != 0 {
        return Err("unsupported segment flags");
    }
    let key_id = u64::from_le_bytes([
        buf[32], buf[33], buf[34], buf[35], buf[36], buf[37], buf[38], buf[39],
    ]);
    let key_id = match (buf[28] & FLAG_ENCRYPTED != 0, key_id) {
        (false, 0) => None,
        (true, id) if id != 0 => Some(id),
        _ => return Err("segment flags and key id disagree"),
    };
    Ok(SegmentHeader {
        segment: u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]),
        engine: u64::from_le_bytes([
            buf[16], buf[17], buf[18], buf[19], buf[20], buf[21], buf[22], buf[23],
        ]),
        generation: u32::from_le_bytes([buf[24], buf[25], buf[26], buf[27]]),
        version,
        key_id,
    })
}

/// Bytes a record of `len` payload bytes takes inside a block.
#[inline]
pub(crate) fn framed_len(len: usize) -> u64 {
    FRAME_LEN as u64 + len as u64
}

/// A problem found while parsing: the offset where it starts and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    /// Offset in the segment.
    pub offset: u64,
    /// What is wrong.
    pub detail: &'static str,
}

impl Damage {
    /// The error a reader returns for this damage in segment `segment`, the file at `path`.
    pub(crate) fn error(self, path: std::path::PathBuf, segment: u32) -> crate::error::SpillError {
        crate::error::SpillError::Corrupt {
            path,
            segment,
            offset: self.offset,
            detail: self.detail,
        }
    }
}

/// Capacity of a segment file name buffer (NUL included).
pub(crate) const NAME_CAP: usize = 32;

/// `spill-segment-NNNNNN.bin` as a NUL-terminated name, built without allocating.
#[derive(Clone, Copy)]
pub(crate) struct SegmentFileName {
    buf: [u8; NAME_CAP],
    len: usize,
}

impl SegmentFileName {
    pub(crate) fn new(segment: u32) -> Self {
        const PREFIX: &[u8] = b"spill-segment-";
        const SUFFIX: &[u8] = b".bin";
        // The digits, at least six (zero-padded), written by hand: `write!` cost about as much
        // as the rest of a cleanup batch's work per name.
        let mut digits = [b'0'; 10];
        let mut n = segment;
        let mut i = digits.len();
        while n > 0 {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
        let digits = &digits[i.min(digits.len() - 6)..];
        // u32::MAX has 10 digits: "spill-segment-" (14) + 10 + ".bin" (4) = 28 < 32 (the NUL).
        let mut buf = [0u8; NAME_CAP];
        let mut len = 0;
        for part in [PREFIX, digits, SUFFIX] {
            buf[len..len + part.len()].copy_from_slice(part);
            len += part.len();
        }
        SegmentFileName { buf, len }
    }

    /// The name without the NUL.
    pub(crate) fn as_str(&self) -> &str {
        // Built from ASCII only.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("spill-segment-?.bin")
    }

    /// The name as a C string.
    pub(crate) fn as_cstr(&self) -> &std::ffi::CStr {
        std::ffi::CStr::from_bytes_until_nul(&self.buf).unwrap_or(c"")
    }
}

impl std::fmt::Debug for SegmentFileName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The segment number in a segment file name, if it is one.
pub fn parse_segment_file_name(name: &str) -> Option<u32> {
    name.strip_prefix("spill-segment-")?
        .strip_suffix(".bin")?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_damage() {
        let h = encode_header(7, 0xABCD, 42, 0);
        let p = parse_header(&h).unwrap();
        assert_eq!(
            (p.segment, p.engine, p.generation, p.version),
            (7, 0xABCD, 42, VERSION)
        );
        let mut bad = h;
        bad[13] ^= 1;
        assert_eq!(parse_header(&bad), Err("header checksum mismatch"));
        assert!(parse_header(&h[..10]).is_err());
    }

    #[test]
    fn an_encrypted_header_names_its_key_and_flags_must_agree() {
        let h = encode_header(7, 0xABCD, 42, 0x1234);
        let p = parse_header(&h).unwrap();
        assert_eq!((h[28], p.key_id), (FLAG_ENCRYPTED, Some(0x1234)));
        assert_eq!(
            parse_header(&encode_header(7, 1, 0, 0)).unwrap().key_id,
            None
        );
        // A flag without a key id (or the reverse), checksum valid: refused.
        for (flags, id) in [(FLAG_ENCRYPTED, 0u64), (0, 5)] {
            let mut h = encode_header(7, 1, 0, 0);
            h[28] = flags;
            h[32..40].copy_from_slice(&id.to_le_bytes());
            let crc = block::crc32c(&h[..60]);
            h[60..64].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(parse_header(&h), Err("segment flags and key id disagree"));
        }
    }

    /// A version-1 or version-2 header (valid checksum) is refused by name, never parsed as
    /// version 3 (whose blocks bind the engine id, which version 2's did not).
    #[test]
    fn a_version_1_or_2_segment_is_refused_by_name() {
        for (v, want) in [
            (
                1u16,
                "segment format version 1: this build reads version 3 only",
            ),
            (
                2,
                "segment format version 2 (blocks not bound to their engine): this build reads version 3 only",
            ),
        ] {
            let mut h = encode_header(7, 1, 0, 0);
            h[8..10].copy_from_slice(&v.to_le_bytes());
            let crc = block::crc32c(&h[..60]);
            h[60..64].copy_from_slice(&crc.to_le_bytes());
            assert_eq!(parse_header(&h), Err(want));
        }
    }

    #[test]
    fn names() {
        assert_eq!(SegmentFileName::new(3).as_str(), "spill-segment-000003.bin");
        for seg in [
            0,
            9,
            10,
            99_999,
            999_999,
            1_000_000,
            1_234_567,
            4_000_000_000,
        ] {
            let name = SegmentFileName::new(seg);
            assert_eq!(name.as_str(), format!("spill-segment-{seg:06}.bin"));
            assert_eq!(parse_segment_file_name(name.as_str()), Some(seg));
        }
        assert_eq!(
            SegmentFileName::new(u32::MAX).as_str(),
            "spill-segment-4294967295.bin"
        );
        assert_eq!(parse_segment_file_name("spill-segment-000003.bin"), Some(3));
        assert_eq!(parse_segment_file_name("spill-segment-x.bin"), None);
        assert_eq!(
            SegmentFileName::new(12).as_cstr().to_bytes(),
            b"spill-segment-000012.bin"
        );
    }
}
