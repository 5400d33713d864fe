//! `SegmentReader`, the public reader of a published segment file, against the in-memory parse
//! (`spillring::testing::parse_segment`) of the same bytes with the written length set to the
//! file's length (the rule for a published file: it is trimmed to its written length).
//!
//! (a) The raw input as a file: `SegmentReader` never panics, and returns exactly the records
//!     the in-memory parse finds (the same bytes), then the same damage (offset and detail),
//!     or the end where the parse found none. Two implementations of the reading (a streamed,
//!     buffered read with one allocation a record, and one slice of the whole file) agree.
//! (b) The input also decodes (with `arbitrary`) into records and one mutation of their
//!     encoded segment; the same agreement must hold, and an unmutated segment reads back to
//!     exactly the records written. A wrong byte is never returned.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use spillring::segment::parse_header;
use spillring::testing::{encode_segment, parse_segment};
use spillring::{SegmentReader, SpillError};

#[derive(Arbitrary, Debug)]
enum Mutation {
    None,
    /// XOR one byte with a non-zero value.
    Flip {
        at: u32,
        xor: u8,
    },
    /// The file ends early.
    Truncate {
        at: u32,
    },
    /// Bytes past the last frame (padding left on a copied file).
    Pad {
        extra: Vec<u8>,
    },
    /// A frame's length field overwritten.
    Length {
        record: u8,
        len: u32,
    },
}

#[derive(Arbitrary, Debug)]
struct Case {
    segment: u32,
    engine: u64,
    records: Vec<Vec<u8>>,
    mutation: Mutation,
}

/// Cap on a case's encoded size, so one exec stays fast.
const MAX_SEGMENT: usize = 256 << 10;

/// One file, rewritten for each input, in a temporary directory (on tmpfs when there is one).
fn file() -> &'static PathBuf {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &FILE
        .get_or_init(|| {
            let dir = tempfile::tempdir_in("/dev/shm")
                .or_else(|_| tempfile::tempdir())
                .expect("temp dir");
            let p = dir.path().join("published.bin");
            (dir, p)
        })
        .1
}

fuzz_target!(|data: &[u8]| {
    agree(data);
    if let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) {
        structured(&case);
    }
});

/// Reads `bytes` as a published file with `SegmentReader` and checks it against the in-memory
/// parse; returns the records read.
fn agree(bytes: &[u8]) -> Vec<Vec<u8>> {
    let path = file();
    std::fs::write(path, bytes).expect("write the file");
    let (segment, engine) = parse_header(bytes).map_or((0, 0), |h| (h.segment, h.engine));
    let want = parse_segment(bytes, bytes.len(), segment, engine);
    let mut got = Vec::new();
    let damage = match SegmentReader::open(path) {
        Err(e) => Some(e),
        Ok(mut r) => loop {
            match r.next_record() {
                Ok(Some(rec)) => got.push(rec.to_vec()),
                Ok(None) => break None,
                Err(e) => {
                    assert!(
                        matches!(r.next_record(), Ok(None)),
                        "the reader goes on after an error"
                    );
                    break Some(e);
                }
            }
        },
    };
    assert_eq!(
        got.len(),
        want.records.len(),
        "record count: reader {got:?}, parse {want:?}"
    );
    for (j, (g, w)) in got.iter().zip(&want.records).enumerate() {
        assert!(
            g[..] == w[..],
            "record {j}: wrong bytes returned"
        );
    }
    match (damage, want.damage) {
        (None, None) => {}
        (Some(SpillError::Corrupt { offset, detail, .. }), Some((o, d))) => {
            assert_eq!((offset, detail), (o, d), "damage differs");
        }
        (d, w) => panic!("reader ended with {d:?}, parse with {w:?}"),
    }
    got
}

fn structured(case: &Case) {
    let mut records: Vec<&[u8]> = Vec::new();
    let mut total = spillring::segment::HEADER_LEN;
    for r in &case.records {
        total += 64 + spillring::segment::FRAME_LEN + r.len();
        if total > MAX_SEGMENT {
            break;
        }
        records.push(r);
    }
    let mut buf = encode_segment(case.segment, case.engine, &records);
    let end = buf.len();
    let wrap = |at: u32| at as usize % end;
    match &case.mutation {
        Mutation::None => {}
        Mutation::Flip { at, xor } => buf[wrap(*at)] ^= if *xor == 0 { 0x80 } else { *xor },
        Mutation::Truncate { at } => buf.truncate(wrap(*at)),
        Mutation::Pad { extra } => buf.extend_from_slice(extra),
        Mutation::Length { record, len } => {
            if !records.is_empty() {
                let k = *record as usize % records.len();
                // Format v2: one block (a 64-byte header) holds the records.
                let off = spillring::segment::HEADER_LEN
                    + 64
                    + records[..k]
                        .iter()
                        .map(|r| spillring::segment::FRAME_LEN + r.len())
                        .sum::<usize>();
                buf[off..off + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
    let got = agree(&buf);
    if matches!(case.mutation, Mutation::None) {
        assert_eq!(got.len(), records.len(), "a clean segment lost records");
        for (g, w) in got.iter().zip(&records) {
            assert!(g[..] == w[..], "a clean segment returned wrong bytes");
        }
    }
}
