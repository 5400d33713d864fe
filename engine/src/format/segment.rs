//! The segment file format. Knows nothing of tickets or I/O backends.
//!
//! ```text
//! header (64 bytes, at offset 0)
//!   0  magic      b"SPILLRNG"
//!   8  version    u16 LE (1)
//!  10  header_len u16 LE (64)
//!  12  segment    u32 LE   segment number (the file's name)
//!  16  engine     u64 LE   id of the engine that wrote it
//!  24  generation u32 LE   which use of the file this is (a pooled file is reused)
//!  28  reserved   32 zero bytes
//!  60  crc        u32 LE   CRC-32C of bytes 0..60
//! records, back to back
//!   0  len        u32 LE   payload length
//!   4  crc        u32 LE   CRC-32C of generation (4 bytes LE), len (4 bytes LE), payload
//!   8  payload
//! ```
//!
//! The generation is bound into every frame's checksum, so a record left in a recycled file by
//! an earlier use never parses as one of this use's records.
//!
//! The writer knows each segment's logical length; in direct mode the file is padded with
//! zeros to 4 KiB past it. A reader parses exactly the logical length, so a torn or truncated
//! file is detected and located, and wrong bytes are never returned.

use std::fmt::Write as _;

/// Bytes of the segment header.
pub const HEADER_LEN: usize = 64;
/// Bytes of a record's frame header.
pub const FRAME_LEN: usize = 8;
/// Largest payload one record can hold.
pub const MAX_RECORD: u64 = u32::MAX as u64;
/// Format version written by this build.
pub const VERSION: u16 = 1;

const MAGIC: &[u8; 8] = b"SPILLRNG";

/// The header of use `generation` of segment `segment`, written by engine `engine`.
pub(crate) fn encode_header(segment: u32, engine: u64, generation: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    h[12..16].copy_from_slice(&segment.to_le_bytes());
    h[16..24].copy_from_slice(&engine.to_le_bytes());
    h[24..28].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32c::crc32c(&h[..60]);
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
    if crc32c::crc32c(&buf[..60]) != stored {
        return Err("header checksum mismatch");
    }
    let version = u16::from_le_bytes([buf[8], buf[9]]);
    if version != VERSION {
        return Err("unsupported segment format version");
    }
    if u16::from_le_bytes([buf[10], buf[11]]) as usize != HEADER_LEN {
        return Err("unexpected header length");
    }
    Ok(SegmentHeader {
        segment: u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]),
        engine: u64::from_le_bytes([
            buf[16], buf[17], buf[18], buf[19], buf[20], buf[21], buf[22], buf[23],
        ]),
        generation: u32::from_le_bytes([buf[24], buf[25], buf[26], buf[27]]),
        version,
    })
}

/// The checksum of a frame: generation, length, payload.
#[inline]
fn frame_crc(generation: u32, len: [u8; 4], payload: &[u8]) -> u32 {
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&generation.to_le_bytes());
    head[4..].copy_from_slice(&len);
    crc32c::crc32c_append(crc32c::crc32c(&head), payload)
}

/// The frame header for `payload` in use `generation` of a segment.
#[inline]
pub(crate) fn frame_header(payload: &[u8], generation: u32) -> [u8; FRAME_LEN] {
    let len = (payload.len() as u32).to_le_bytes();
    let crc = frame_crc(generation, len, payload);
    let mut f = [0u8; FRAME_LEN];
    f[0..4].copy_from_slice(&len);
    f[4..8].copy_from_slice(&crc.to_le_bytes());
    f
}

/// Bytes a record of `len` payload bytes takes in a segment.
#[inline]
pub(crate) fn framed_len(len: usize) -> u64 {
    FRAME_LEN as u64 + len as u64
}

/// Where one record's payload lies in a segment buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub start: usize,
    pub end: usize,
}

/// A problem found while parsing: the offset where it starts and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Damage {
    pub offset: u64,
    pub detail: &'static str,
}

/// Parses the record at `off` in `buf` (use `generation` of a segment), whose written data ends
/// at `end` (the segment's logical length). `buf` may be shorter than `end` (a truncated file):
/// a record that crosses its end is reported as damage at the record's offset. `Ok(None)`
/// exactly at `end`.
pub(crate) fn next_frame(
    buf: &[u8],
    off: usize,
    end: usize,
    generation: u32,
) -> Result<Option<Frame>, Damage> {
    if off == end {
        return Ok(None);
    }
    let damage = |detail| Damage {
        offset: off as u64,
        detail,
    };
    let avail = end.min(buf.len());
    if off >= avail {
        return Err(damage(
            "segment truncated: the file ends before its written length",
        ));
    }
    if end - off < FRAME_LEN {
        return Err(damage("truncated record frame"));
    }
    if avail - off < FRAME_LEN {
        return Err(damage("segment truncated inside a record frame"));
    }
    let len = u32::from_le_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]) as usize;
    let stored = u32::from_le_bytes([buf[off + 4], buf[off + 5], buf[off + 6], buf[off + 7]]);
    let start = off + FRAME_LEN;
    if len > end - start {
        return Err(damage("record runs past the end of the segment"));
    }
    if len > avail - start {
        return Err(damage("segment truncated inside a record"));
    }
    let payload = &buf[start..start + len];
    let len_bytes = [buf[off], buf[off + 1], buf[off + 2], buf[off + 3]];
    let crc = frame_crc(generation, len_bytes, payload);
    if crc != stored {
        return Err(damage("record checksum mismatch"));
    }
    Ok(Some(Frame {
        start,
        end: start + len,
    }))
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
        struct W<'a>(&'a mut [u8; NAME_CAP], usize);
        impl std::fmt::Write for W<'_> {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                let b = s.as_bytes();
                // Leave room for the NUL.
                if self.1 + b.len() >= NAME_CAP {
                    return Err(std::fmt::Error);
                }
                self.0[self.1..self.1 + b.len()].copy_from_slice(b);
                self.1 += b.len();
                Ok(())
            }
        }
        let mut buf = [0u8; NAME_CAP];
        let mut w = W(&mut buf, 0);
        // u32::MAX has 10 digits: "spill-segment-" (14) + 10 + ".bin" (4) = 28 < 32.
        let _ = write!(w, "spill-segment-{segment:06}.bin");
        let len = w.1;
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
        let h = encode_header(7, 0xABCD, 42);
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
    fn frames_detect_corruption_and_truncation() {
        let mut buf = Vec::new();
        for p in [&b"hello"[..], b"", b"world!"] {
            buf.extend_from_slice(&frame_header(p, 5));
            buf.extend_from_slice(p);
        }
        let end = buf.len();
        let mut off = 0;
        let mut got = Vec::new();
        while let Some(f) = next_frame(&buf, off, end, 5).unwrap() {
            got.push(buf[f.start..f.end].to_vec());
            off = f.end;
        }
        assert_eq!(got, vec![b"hello".to_vec(), vec![], b"world!".to_vec()]);

        let mut bad = buf.clone();
        bad[FRAME_LEN + 1] ^= 0x40; // inside "hello"
        assert_eq!(
            next_frame(&bad, 0, end, 5),
            Err(Damage {
                offset: 0,
                detail: "record checksum mismatch"
            })
        );
        // Truncated tail: the last record is cut short.
        let second = FRAME_LEN + 5;
        let third = second + FRAME_LEN;
        assert_eq!(
            next_frame(&buf, third, end - 2, 5).unwrap_err().detail,
            "record runs past the end of the segment"
        );
        assert_eq!(
            next_frame(&buf, third, third + 3, 5).unwrap_err().detail,
            "truncated record frame"
        );
        // The file was cut short: the record crossing the cut is damage at its offset.
        assert_eq!(
            next_frame(&buf[..end - 2], third, end, 5).unwrap_err(),
            Damage {
                offset: third as u64,
                detail: "segment truncated inside a record"
            }
        );
        assert_eq!(
            next_frame(&buf[..third], third, end, 5).unwrap_err().detail,
            "segment truncated: the file ends before its written length"
        );
        // A zero-filled tail (direct-mode padding read as data) is never a valid record.
        let zeros = [0u8; 16];
        assert!(next_frame(&zeros, 0, 16, 0).is_err());
        assert!(next_frame(&zeros, 0, 16, 5).is_err());
    }

    /// A record of an earlier use of a recycled file never parses in a later use, even when it
    /// sits exactly where a record of the later use would start.
    #[test]
    fn a_frame_of_another_generation_is_damage() {
        let p = b"an earlier use";
        let mut buf = frame_header(p, 1).to_vec();
        buf.extend_from_slice(p);
        let end = buf.len();
        assert!(next_frame(&buf, 0, end, 1).unwrap().is_some());
        assert_eq!(
            next_frame(&buf, 0, end, 2).unwrap_err().detail,
            "record checksum mismatch"
        );
    }

    #[test]
    fn names() {
        assert_eq!(SegmentFileName::new(3).as_str(), "spill-segment-000003.bin");
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
