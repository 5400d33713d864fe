//! A corrupt byte, a damaged block header, a block pasted from another segment, a damaged
//! segment header and a truncated tail (format v2, every codec): the reader returns every
//! record of the intact blocks before the damage, then `Corrupt` naming the segment and the
//! damaged block's offset, and never a wrong byte.

#[macro_use]
mod common;
use common::*;

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use spillring::{
    BackendKind, Bytes, Compression, Engine, EngineConfig, FaultAction, FaultPlan, FaultPoint,
    SpillError, SpilledState, TaskSpill, Trigger, WriteMode,
};

per_backend!(
    damage_is_reported_where_it_is_buffered,
    damage_is_reported_where_it_is_direct,
    damage_is_reported_where_it_is_buffered_and_mapped,
    damage_is_reported_where_it_is_direct_and_mapped,
    damage_in_lz4_blocks_buffered,
    damage_in_zstd_blocks_direct_mapped,
    damage_in_auto_blocks_direct,
    damage_in_encrypted_blocks_buffered,
    damage_in_encrypted_lz4_blocks_direct_mapped,
    damage_in_compressed_chunks,
    a_segment_cut_inside_its_header_is_corrupt_at_the_cut,
);

const REC: usize = 1000;
const HEADER: u64 = 64;
const BLOCK: u64 = 64;
/// (64 KiB - segment header - block header) / (1000 + 8): one block per segment.
const PER_SEGMENT: u64 = 64;

/// Record `i`: random bytes, or (`text`) a lineitem-like row that compresses.
fn rec(i: u64, text: bool) -> Vec<u8> {
    if !text {
        return record(i, REC);
    }
    let mut v = Vec::with_capacity(REC);
    let mut k = i;
    while v.len() < REC {
        let row = format!(
            "{k}|{}|{}|{}|{}.00|0.0{}|N|O|1996-0{}-1{}|DELIVER IN PERSON|TRUCK|carefully final deposits\n",
            k * 7 % 200_000,
            k % 10_000,
            k % 7,
            (k % 50) * 1000,
            k % 9,
            k % 9 + 1,
            k % 10
        );
        v.extend_from_slice(row.as_bytes());
        k += 1;
    }
    v.truncate(REC);
    v
}

fn spill(engine: &Engine, text: bool) -> (TaskSpill, SpilledState) {
    let task = engine.task("corrupt").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..300 {
        w.write(Bytes::from(rec(i, text))).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 5);
    (task, st)
}

/// Reads until an error; asserts every record returned is the one written.
fn read_until_error(st: &SpilledState, text: bool) -> (u64, SpillError) {
    let mut r = st.reader().unwrap();
    let mut i = 0;
    loop {
        match r.next_record() {
            Ok(Some(got)) => {
                assert!(got[..] == rec(i, text)[..], "record {i} is wrong");
                i += 1;
            }
            Ok(None) => panic!("read all {i} records: the damage went unnoticed"),
            Err(e) => return (i, e),
        }
    }
}

fn assert_corrupt(err: &SpillError, want: (u32, u64), want_detail: Option<&str>) {
    match err {
        SpillError::Corrupt {
            segment,
            offset,
            detail,
            ..
        } => {
            assert_eq!((*segment, *offset), want, "{err}");
            if let Some(d) = want_detail {
                assert_eq!(*detail, d, "{err}");
            }
        }
        other => panic!("want Corrupt, got {other}"),
    }
}

fn flip(path: &std::path::Path, at: u64) -> u8 {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0xAA], at).unwrap();
    b[0]
}

fn restore(path: &std::path::Path, at: u64, byte: u8) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&[byte], at).unwrap();
}

/// `read_buffer_max`: segments up to it are read into a buffer (all of them at the default),
/// larger ones mapped (all of them at 0).
/// With `Auto`, a slow device and one write in flight: `Auto` compresses only when the writer
/// waits for the device (its cost model weighs the device time its saved bytes free against
/// their CPU), so that it waits on a loaded machine too. Without them a writer that never
/// waited kept all five blocks raw (5 of 40 runs with three busy loops beside it, under the
/// cost model before `7a9b383`; under that one, a writer that never waits always stores raw).
fn slow_for_auto(c: EngineConfig, compression: Compression) -> EngineConfig {
    if compression != Compression::Auto {
        return c;
    }
    let plan = FaultPlan::new(7);
    plan.arm(
        FaultPoint::IoWrite,
        FaultAction::Delay(std::time::Duration::from_millis(3)),
        Trigger::Always,
    );
    c.queue_depth(1).fault_plan(plan)
}

fn damage_cases(
    b: spillring::BackendKind,
    mode: WriteMode,
    read_buffer_max: usize,
    compression: Compression,
    encrypt: bool,
) {
    let text = compression != Compression::None;
    // An encrypted block's tag takes the CRC's place: its damage is a failed authentication.
    let bad_block = if encrypt {
        "encrypted block fails authentication (damaged, moved, or of another key)"
    } else {
        "block checksum mismatch"
    };
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let c = cfg(dir.path(), b)
        .mode(mode)
        .segment_size(64 << 10)
        .read_buffer_max(read_buffer_max as u64)
        .compression(compression)
        .encryption(encrypt);
    let engine = Engine::open(slow_for_auto(c, compression)).unwrap();
    let (task, st) = spill(&engine, text);
    let paths = st.paths();
    if text {
        let m = engine.metrics();
        if compression == Compression::Auto {
            // Auto may keep a block raw while it measures (its first trial weighs a prior, and
            // a raw block puts the next trial off by one block): some blocks shrink.
            assert!(m.blocks_lz4 + m.blocks_zstd > 0, "{m:?}");
            assert!(
                m.physical_bytes_written < m.logical_bytes_written,
                "compressible rows shrink: {m:?}"
            );
        } else {
            assert!(
                m.physical_bytes_written * 2 < m.logical_bytes_written,
                "compressible rows shrink: {m:?}"
            );
            assert_eq!(m.blocks_raw, 0, "{m:?}");
        }
    }

    // 1. One flipped byte inside the block of segment 1 (a record's bytes, or the compressed
    //    bytes holding them): the whole block is refused, at the block's offset.
    let at = HEADER + BLOCK + 100;
    let old = flip(&paths[1], at);
    let (good, err) = read_until_error(&st, text);
    assert_eq!(good, PER_SEGMENT);
    assert_corrupt(&err, (1, HEADER), Some(bad_block));
    assert!(
        err.to_string().contains(paths[1].to_str().unwrap()),
        "{err}"
    );
    restore(&paths[1], at, old);

    // 2. A damaged block header (its stored length): refused at the block's offset.
    let at = HEADER + 9;
    let old = flip(&paths[1], at);
    let (good, err) = read_until_error(&st, text);
    assert_eq!(good, PER_SEGMENT);
    assert_corrupt(&err, (1, HEADER), None);
    restore(&paths[1], at, old);

    // 3. The block of segment 3 pasted over segment 2's (same place, same length when raw):
    //    the checksum (or the tag's AAD) binds the segment number, so it is refused.
    let s3 = std::fs::read(&paths[3]).unwrap();
    let s2 = std::fs::read(&paths[2]).unwrap();
    let n = s2.len().min(s3.len());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    f.write_all_at(&s3[HEADER as usize..n], HEADER).unwrap();
    drop(f);
    let (good, err) = read_until_error(&st, text);
    assert_eq!(good, 2 * PER_SEGMENT);
    assert_corrupt(&err, (2, HEADER), None);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    f.write_all_at(&s2[HEADER as usize..], HEADER).unwrap();
    drop(f);

    // 3b. The blocks of another engine's segment with the same number and generation (two
    //     engines number their segments alike) pasted behind this segment's header: the
    //     checksum (or the tag's AAD) binds the engine id, so they are refused. Before the
    //     binding named the engine, another engine's records read back as this file's.
    let other_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    // Configured alike, down to `Auto`'s slow device: its blocks are this engine's size.
    let other = Engine::open(slow_for_auto(
        cfg(other_dir.path(), b)
            .mode(mode)
            .segment_size(64 << 10)
            .read_buffer_max(read_buffer_max as u64)
            .compression(compression)
            .encryption(encrypt),
        compression,
    ))
    .unwrap();
    let other_task = other.task("corrupt").unwrap();
    let mut w = other_task.writer().unwrap();
    for i in 0..300 {
        w.write(Bytes::from(rec(i + 1_000_000, text))).unwrap();
    }
    let other_st = w.finish().unwrap();
    let o2 = std::fs::read(&other_st.paths()[2]).unwrap();
    assert_eq!(
        (&o2[12..16], &o2[24..28]),
        (&s2[12..16], &s2[24..28]),
        "the other engine's segment has this one's number and generation"
    );
    assert_ne!(o2[16..24], s2[16..24], "another engine id");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    f.write_all_at(&o2[HEADER as usize..s2.len().min(o2.len())], HEADER)
        .unwrap();
    drop(f);
    let (good, err) = read_until_error(&st, text);
    assert_eq!(good, 2 * PER_SEGMENT);
    assert_corrupt(&err, (2, HEADER), Some(bad_block));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    f.write_all_at(&s2[HEADER as usize..], HEADER).unwrap();
    drop(f);
    drop((other_st, other_task));
    assert_clean(&other, other_dir.path());
    drop(other);

    // 4. A truncated tail: the last segment is cut inside its block.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[4])
        .unwrap()
        .set_len(HEADER + BLOCK + 10)
        .unwrap();
    let (good, err) = read_until_error(&st, text);
    assert_eq!(
        good,
        4 * PER_SEGMENT,
        "every block before the cut is returned"
    );
    assert_corrupt(&err, (4, HEADER), Some("segment truncated inside a block"));

    // 5. A damaged segment header: the segment is refused at offset 0 before any record.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    f.seek(SeekFrom::Start(13)).unwrap();
    f.write_all(&[0xFF]).unwrap();
    drop(f);
    let (good, err) = read_until_error(&st, text);
    assert_eq!(good, 2 * PER_SEGMENT);
    assert_corrupt(&err, (2, 0), None);

    // Damage does not break ownership: the files are still deleted exactly once.
    drop(st);
    task.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.files_deleted, 5);
}

fn damage_is_reported_where_it_is_buffered(b: BackendKind) {
    damage_cases(b, WriteMode::Buffered, 256 << 10, Compression::None, false);
}

fn damage_is_reported_where_it_is_direct(b: BackendKind) {
    damage_cases(b, WriteMode::Direct, 256 << 10, Compression::None, false);
}

fn damage_is_reported_where_it_is_buffered_and_mapped(b: BackendKind) {
    damage_cases(b, WriteMode::Buffered, 0, Compression::None, false);
}

fn damage_is_reported_where_it_is_direct_and_mapped(b: BackendKind) {
    damage_cases(b, WriteMode::Direct, 0, Compression::None, false);
}

fn damage_in_lz4_blocks_buffered(b: BackendKind) {
    damage_cases(b, WriteMode::Buffered, 256 << 10, Compression::Lz4, false);
}

fn damage_in_zstd_blocks_direct_mapped(b: BackendKind) {
    damage_cases(
        b,
        WriteMode::Direct,
        0,
        Compression::Zstd { level: 3 },
        false,
    );
}

fn damage_in_auto_blocks_direct(b: BackendKind) {
    damage_cases(b, WriteMode::Direct, 256 << 10, Compression::Auto, false);
}

/// A segment cut inside its header (40 of its 64 bytes left, or none) is `Corrupt` at the cut,
/// after every record of the segments before it, whether the reader reads segments into a
/// buffer or maps them (a file shorter than its header is mapped too, even an empty one: the
/// walk reports the cut).
fn a_segment_cut_inside_its_header_is_corrupt_at_the_cut(b: BackendKind) {
    for (read_buffer_max, cut) in [(256 << 10, 40), (0, 40), (256 << 10, 0), (0, 0)] {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let c = cfg(dir.path(), b)
            .segment_size(64 << 10)
            .read_buffer_max(read_buffer_max);
        let engine = Engine::open(c).unwrap();
        let (task, st) = spill(&engine, false);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&st.paths()[2])
            .unwrap()
            .set_len(cut)
            .unwrap();
        let (good, err) = read_until_error(&st, false);
        assert_eq!(
            good,
            2 * PER_SEGMENT,
            "read_buffer_max {read_buffer_max}, cut {cut}"
        );
        assert_corrupt(&err, (2, cut), Some("segment truncated inside its header"));
        drop(st);
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// The reader as an iterator yields every record in order, then ends; on a damaged segment it
/// yields the records before the damage, then the `Corrupt` error once, then ends.
#[test]
fn the_reader_iterator_ends_after_its_first_error() {
    let dir = tempfile::tempdir().unwrap();
    let engine = spillring::Engine::open(cfg(dir.path(), spillring::BackendKind::Psync)).unwrap();
    let task = engine.task("iter").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..10 {
        w.write(spillring::Bytes::from(record(i, 100))).unwrap();
    }
    let state = w.finish().unwrap();
    let all: Vec<_> = state
        .reader()
        .unwrap()
        .collect::<spillring::Result<_>>()
        .unwrap();
    assert_eq!(all.len(), 10);
    for (i, r) in all.iter().enumerate() {
        assert_eq!(r[..], record(i as u64, 100)[..]);
    }
    // Flip a byte of the 4th record's payload (header 64 + block header 64 + 3 framed records
    // of 108, + frame 8). In place, never truncating: `all` still points into a mapping of
    // this file.
    let path = &state.paths()[0];
    let at = 64 + 64 + 3 * 108 + 8 + 5;
    let byte = std::fs::read(path).unwrap()[at] ^ 1;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[byte], at as u64).unwrap();
    let items: Vec<_> = state.reader().unwrap().collect();
    // The block's checksum covers all ten records: none is returned, the error once, then
    // the end.
    assert_eq!(items.len(), 1, "the error, then the end");
    assert!(
        matches!(items[0], Err(spillring::SpillError::Corrupt { .. })),
        "{:?}",
        items[0]
    );
    drop((all, state, task));
    assert_clean(&engine, dir.path());
}

fn damage_in_encrypted_blocks_buffered(b: BackendKind) {
    damage_cases(b, WriteMode::Buffered, 256 << 10, Compression::None, true);
}

fn damage_in_encrypted_lz4_blocks_direct_mapped(b: BackendKind) {
    damage_cases(b, WriteMode::Direct, 0, Compression::Lz4, true);
}

/// The blocks of a segment file: (offset, end, flags, records).
fn blocks_of(file: &[u8]) -> Vec<(usize, usize, u8, u32)> {
    let mut v = Vec::new();
    let mut off = HEADER as usize;
    while off + 64 <= file.len() {
        let h = &file[off..off + 64];
        let stored = u64::from_le_bytes(h[8..16].try_into().unwrap()) as usize;
        let pad = u32::from_le_bytes(h[28..32].try_into().unwrap()) as usize;
        let records = u32::from_le_bytes(h[24..28].try_into().unwrap());
        let end = off + 64 + stored + pad;
        v.push((off, end, h[5], records));
        off = end;
    }
    v
}

/// A record larger than a staging buffer is compressed in chunks (flags bit 1): a byte
/// flipped in a middle chunk, the file cut after the first chunk, and a chunk pasted from
/// another record each read as `Corrupt` at the chunk's offset, after the intact records
/// before it, never as a wrong record (sync reader, and `SegmentReader` for the cut).
fn damage_in_compressed_chunks(b: BackendKind) {
    let text = |n: usize, k: u64| -> Vec<u8> {
        let mut v = Vec::new();
        let mut i = k;
        while v.len() < n {
            v.extend_from_slice(&rec(i, true));
            i += 1;
        }
        v.truncate(n);
        v
    };
    let want = [
        rec(0, true),
        text(700 << 10, 10),
        text(700 << 10, 5000),
        rec(1, true),
    ];
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(4 << 20)
            .io_buffer_size(256 << 10)
            .compression(Compression::Lz4),
    )
    .unwrap();
    let task = engine.task("chunks").unwrap();
    let mut w = task.writer().unwrap();
    for r in &want {
        w.write(Bytes::from(r.clone())).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 1);
    let seg = match spillring::SegmentReader::open(&st.paths()[0]) {
        Ok(r) => r.header().segment,
        Err(e) => panic!("{e}"),
    };
    let path = st.paths()[0].clone();
    let orig = std::fs::read(&path).unwrap();
    let chunks: Vec<_> = blocks_of(&orig)
        .into_iter()
        .filter(|b| b.2 & 2 != 0)
        .collect();
    // Two records of 700 KiB: at least 3 chunks each, the first of each with its frame.
    let firsts: Vec<usize> = (0..chunks.len()).filter(|&i| chunks[i].3 == 1).collect();
    assert!(
        chunks.len() >= 6 && firsts.len() == 2 && firsts[0] == 0,
        "{chunks:?}"
    );
    let read = |what: &str| -> SpillError {
        let mut r = st.reader().unwrap();
        let mut i = 0;
        loop {
            match r.next_record() {
                Ok(Some(g)) => {
                    assert!(g[..] == want[i][..], "{what}: record {i} is wrong");
                    i += 1;
                }
                Ok(None) => panic!("{what}: read all {i} records: the damage went unnoticed"),
                Err(e) => {
                    assert_eq!(i, 1, "{what}: the record before the damage is returned");
                    return e;
                }
            }
        }
    };
    let put = |bytes: &[u8]| {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f.set_len(bytes.len() as u64).unwrap();
    };
    // 1. A byte flipped in a middle chunk's stored bytes.
    let mid = chunks[1];
    let byte = flip(&path, (mid.0 + 64 + 100) as u64);
    assert_corrupt(
        &read("flip"),
        (seg, mid.0 as u64),
        Some("block checksum mismatch"),
    );
    restore(&path, (mid.0 + 64 + 100) as u64, byte);
    // 2. A chunk of the second record pasted over the first one's second chunk.
    let other = chunks[firsts[1] + 1];
    let mut pasted = orig.clone();
    pasted.splice(mid.0..mid.1, orig[other.0..other.1].iter().copied());
    put(&pasted);
    let err = read("paste");
    assert!(
        matches!(err, SpillError::Corrupt { offset, .. } if offset == mid.0 as u64),
        "{err}"
    );
    // 3. The file cut after the first chunk: the reader and `SegmentReader` (which reads to
    //    the file's end) say so at the chunk.
    put(&orig[..chunks[0].1]);
    assert!(matches!(read("cut"), SpillError::Corrupt { .. }));
    let mut sr = spillring::SegmentReader::open(&path).unwrap();
    assert!(sr.next_record().unwrap().unwrap()[..] == want[0][..]);
    assert_corrupt(
        &sr.next_record().unwrap_err(),
        (seg, chunks[0].0 as u64),
        Some("segment ends inside a chunked record"),
    );
    put(&orig);
    let got: Vec<Bytes> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(got.len(), want.len());
    drop((got, st));
    task.close();
    assert_clean(&engine, dir.path());
}
