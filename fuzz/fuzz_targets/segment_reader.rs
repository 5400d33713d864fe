//! The segment format (version 3: blocks), through the readers' own codec
//! (`spillring::testing::parse_segment`: the segment codec of `format/cursor.rs`, which every
//! reader walks with: the header's checks, then the blocks, each checked and decoded).
//!
//! (a) The raw input as a segment file (and as a segment file name): never panics, and a
//!     clean parse ends at the written length.
//! (b) The input also decodes (with `arbitrary`) into records, how they are cut into blocks
//!     and each block's codec (raw, lz4, zstd), a segment header and one mutation. The records
//!     are encoded as a valid segment (`testing::encode_segment_blocks`), the mutation is
//!     applied, and the parse must return exactly the records of the blocks before the first
//!     damaged byte, byte for byte, then stop with damage located at the start of the block
//!     that holds that byte (offset 0 for the header). Without damage it must return exactly
//!     the records written. A wrong byte is never returned.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use spillring::segment::{FRAME_LEN, HEADER_LEN, parse_header, parse_segment_file_name};
use spillring::testing::{encode_segment, encode_segment_blocks, parse_segment};

/// One record to write.
#[derive(Arbitrary, Debug)]
enum Rec {
    /// These bytes.
    Bytes(Vec<u8>),
    /// `len` bytes of a pattern (cheap long records).
    Fill { len: u16, seed: u8 },
    /// A large record, up to 64 KiB, of a pattern.
    Big { kib: u8, seed: u8 },
}

impl Rec {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Rec::Bytes(b) => b.clone(),
            Rec::Fill { len, seed } => pattern(*len as usize, *seed),
            Rec::Big { kib, seed } => pattern((*kib as usize % 65) << 10, *seed),
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = u64::from(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// What happens to the encoded segment before it is parsed. Offsets wrap around the segment's
/// written length.
#[derive(Arbitrary, Debug)]
enum Mutation {
    None,
    /// XOR one byte with a non-zero value (a bit rot).
    Flip {
        at: u32,
        xor: u8,
    },
    /// The file ends early (a torn or truncated file); the written length stays.
    Truncate {
        at: u32,
    },
    /// A range reads as zeros (a torn write, a hole).
    Zero {
        at: u32,
        len: u16,
    },
    /// A range holds noise (a misdirected write of unrelated data).
    Noise {
        at: u32,
        len: u16,
        seed: u64,
    },
    /// Bytes past the written length (direct-mode padding, a preallocated tail): ignored.
    Pad {
        extra: Vec<u8>,
    },
    /// A valid header, but of another segment or engine (a file swapped in by mistake).
    OtherHeader {
        segment: u32,
        engine: u64,
    },
}

#[derive(Arbitrary, Debug)]
struct Case {
    segment: u32,
    engine: u64,
    generation: u32,
    records: Vec<Rec>,
    /// Records per block (1..=8), and each block's codec (its byte mod 3).
    per_block: u8,
    codecs: Vec<u8>,
    mutation: Mutation,
}

/// Cap on a case's encoded size, so one exec stays fast.
const MAX_SEGMENT: usize = 512 << 10;

fuzz_target!(|data: &[u8]| {
    raw(data);
    if let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) {
        oracle(&case);
    }
});

/// (a): whatever the bytes are, parsing them neither panics nor returns a range outside the
/// buffer or out of order.
fn raw(data: &[u8]) {
    let name = String::from_utf8_lossy(data);
    let _ = parse_segment_file_name(&name);
    // The canonical name of a number parses back to it.
    if data.len() >= 4 {
        let n = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        assert_eq!(
            parse_segment_file_name(&format!("spill-segment-{n:06}.bin")),
            Some(n)
        );
    }
    // With the header's own numbers, so a valid header gets to the frames.
    let (segment, engine) = parse_header(data).map_or((0, 0), |h| (h.segment, h.engine));
    // The written length: the buffer's, or (emulating a truncated file) more than it holds,
    // or less (the reader never looks past it).
    let tail = data.last().copied().unwrap_or(0) as usize;
    for end in [
        data.len(),
        data.len() + tail,
        data.len().saturating_sub(tail),
    ] {
        let p = parse_segment(data, end, segment, engine);
        if let Some((off, _)) = p.damage {
            assert!(off as usize <= end, "damage past the end: {p:?}");
        }
        let bytes: usize = p.records.iter().map(|r| r.len() + FRAME_LEN).sum();
        assert!(
            p.records.is_empty() || bytes <= (1 << 30),
            "more decoded than the bound"
        );
    }
}

/// (b): a valid segment, one mutation, and what the parse may return.
fn oracle(case: &Case) {
    let mut records = Vec::with_capacity(case.records.len());
    let mut total = HEADER_LEN;
    for r in &case.records {
        let b = r.bytes();
        total += 64 + FRAME_LEN + b.len();
        if total > MAX_SEGMENT {
            break;
        }
        records.push(b);
    }
    let refs: Vec<&[u8]> = records.iter().map(|r| &r[..]).collect();
    let per = (case.per_block % 8 + 1) as usize;
    let groups: Vec<&[&[u8]]> = refs.chunks(per).collect();
    let blocks: Vec<(&[&[u8]], u8)> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (*g, case.codecs.get(i).map_or(0, |c| c % 3)))
        .collect();
    let orig = encode_segment_blocks(case.segment, case.engine, case.generation, &blocks);
    let end = orig.len();

    // Where each block starts and ends (from the headers' stored lengths), and how many
    // records precede it.
    let mut spans = Vec::with_capacity(blocks.len());
    let mut off = HEADER_LEN;
    let mut before = 0;
    for (g, _) in &blocks {
        let stored = u64::from_le_bytes(orig[off + 8..off + 16].try_into().unwrap()) as usize;
        spans.push((off, off + 64 + stored, before));
        before += g.len();
        off += 64 + stored;
    }
    assert_eq!(off, end);

    // The unmutated segment parses to exactly the records.
    let clean = parse_segment(&orig, end, case.segment, case.engine);
    assert_eq!(clean.damage, None, "a valid segment reported damage");
    check_prefix(&clean.records, &records, records.len());

    let mut buf = orig.clone();
    let wrap = |at: u32| at as usize % end;
    match &case.mutation {
        Mutation::None => {}
        Mutation::Flip { at, xor } => buf[wrap(*at)] ^= if *xor == 0 { 0x80 } else { *xor },
        Mutation::Truncate { at } => buf.truncate(wrap(*at)),
        Mutation::Zero { at, len } => {
            let a = wrap(*at);
            let b = (a + *len as usize).min(end);
            buf[a..b].fill(0);
        }
        Mutation::Noise { at, len, seed } => {
            let a = wrap(*at);
            let b = (a + *len as usize).min(end);
            let noise = pattern(b - a, (*seed % 251) as u8 ^ (*seed >> 8) as u8);
            buf[a..b].copy_from_slice(&noise);
        }
        Mutation::Pad { extra } => buf.extend_from_slice(extra),
        Mutation::OtherHeader { segment, engine } => {
            let h = encode_segment(*segment, *engine, &[]);
            buf[..HEADER_LEN].copy_from_slice(&h[..HEADER_LEN]);
        }
    }

    // The first byte of the written length that is not what was written (or is missing).
    let first_bad = first_difference(&orig[..end], &buf[..end.min(buf.len())])
        .or((buf.len() < end).then_some(buf.len()));
    let p = parse_segment(&buf, end, case.segment, case.engine);
    match first_bad {
        None => {
            assert_eq!(p.damage, None, "no byte changed, yet damage: {p:?}");
            check_prefix(&p.records, &records, records.len());
        }
        Some(i) if i < HEADER_LEN => {
            // A header of generation 0 swapped in for another generation's parses: the
            // blocks' checksums bind the generation, so the first block is damage.
            // A valid header of another generation over a segment with no block: nothing to
            // misread (the engine's reader checks the generation it expects; the blocks'
            // checksums bind it otherwise).
            if p.damage.is_none() && records.is_empty() && p.records.is_empty() {
                return;
            }
            let (off, detail) = p.damage.expect("a damaged header was accepted");
            assert!(
                p.records.is_empty(),
                "records from a damaged header: {p:?} ({detail})"
            );
            assert!(
                off == 0
                    || (off as usize == buf.len() && buf.len() < HEADER_LEN)
                    || off as usize == HEADER_LEN,
                "header damage at {off} ({detail})"
            );
        }
        Some(i) => {
            let &(start, _, before) = spans
                .iter()
                .find(|&&(s, e, _)| s <= i && i < e)
                .expect("a changed byte inside the blocks lies in a block");
            check_prefix(&p.records, &records, before);
            let (off, detail) = p.damage.unwrap_or_else(|| {
                panic!("byte {i} (block at {start}) changed, parse reported no damage")
            });
            assert_eq!(
                off as usize, start,
                "damage in the block at {start} (byte {i}) reported at {off} ({detail})"
            );
        }
    }
}

/// The first index where `a` and `b` differ, over their common length. Compares 4 KiB chunks
/// (one `memcmp` each) before bytes: a byte loop is slow under comparison tracing.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let n = a.len().min(b.len());
    let mut at = 0;
    while at < n {
        let to = (at + 4096).min(n);
        if a[at..to] != b[at..to] {
            return (at..to).find(|&i| a[i] != b[i]);
        }
        at = to;
    }
    None
}

/// The parse returned exactly the first `n` records, byte for byte.
fn check_prefix(got: &[Vec<u8>], records: &[Vec<u8>], n: usize) {
    assert_eq!(got.len(), n, "expected {n} records, got {}", got.len());
    for (j, r) in got.iter().enumerate() {
        assert!(r[..] == records[j][..], "record {j}: wrong bytes returned");
    }
}
