//! A corrupt byte, a damaged header and a truncated tail: the reader returns every intact
//! record before the damage, then `Corrupt` naming the segment and the record's offset, and
//! never a wrong byte.

#[macro_use]
mod common;
use common::*;

use std::io::{Seek, SeekFrom, Write};

use spillring::{BackendKind, Bytes, Engine, SpillError, SpilledState, TaskSpill, WriteMode};

per_backend!(
    damage_is_reported_where_it_is_buffered,
    damage_is_reported_where_it_is_direct,
    damage_is_reported_where_it_is_buffered_and_mapped,
    damage_is_reported_where_it_is_direct_and_mapped,
);

const REC: usize = 1000;
const FRAMED: u64 = REC as u64 + 8;
const HEADER: u64 = 64;
const PER_SEGMENT: u64 = 64; // (64 KiB - 64) / 1008

fn spill(engine: &Engine) -> (TaskSpill, SpilledState) {
    let task = engine.task("corrupt").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..300 {
        w.write(Bytes::from(record(i, REC))).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 5);
    (task, st)
}

/// Reads until an error; asserts every record returned is the one written.
fn read_until_error(st: &SpilledState) -> (u64, SpillError) {
    let mut r = st.reader().unwrap();
    let mut i = 0;
    loop {
        match r.next_record() {
            Ok(Some(rec)) => {
                assert_eq!(&rec[..], &record(i, REC)[..], "record {i} is wrong");
                i += 1;
            }
            Ok(None) => panic!("read all {i} records: the damage went unnoticed"),
            Err(e) => return (i, e),
        }
    }
}

/// `read_buffer_max`: segments up to it are read into a buffer (all of them at the default),
/// larger ones mapped (all of them at 0).
fn damage_cases(b: spillring::BackendKind, mode: WriteMode, read_buffer_max: usize) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), b)
            .mode(mode)
            .segment_size(64 << 10)
            .read_buffer_max(read_buffer_max),
    )
    .unwrap();
    let (task, st) = spill(&engine);
    let paths = st.paths();

    // 1. One flipped byte inside record 10 of segment 1.
    let at = HEADER + 10 * FRAMED;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&paths[1])
        .unwrap();
    f.seek(SeekFrom::Start(at + 8 + 5)).unwrap();
    f.write_all(&[0xAA]).unwrap();
    drop(f);
    let (good, err) = read_until_error(&st);
    assert_eq!(good, PER_SEGMENT + 10);
    match err {
        SpillError::Corrupt {
            segment,
            offset,
            detail,
            ref path,
        } => {
            assert_eq!((segment, offset), (1, at), "{err}");
            assert_eq!(detail, "record checksum mismatch");
            assert_eq!(path, &paths[1]);
        }
        other => panic!("want Corrupt, got {other}"),
    }

    // 2. A truncated tail: the last segment loses its last 10 bytes.
    let last_records = 300 - 4 * PER_SEGMENT; // 44
    let logical = HEADER + last_records * FRAMED;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[4])
        .unwrap()
        .set_len(logical - 10)
        .unwrap();
    // Repair segment 1 so the reader gets that far.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[1])
        .unwrap();
    f.seek(SeekFrom::Start(at + 8 + 5)).unwrap();
    f.write_all(&record(PER_SEGMENT + 10, REC)[5..6]).unwrap();
    drop(f);
    let (good, err) = read_until_error(&st);
    assert_eq!(good, 299, "every record before the cut is returned");
    match err {
        SpillError::Corrupt {
            segment,
            offset,
            detail,
            ..
        } => {
            assert_eq!(
                (segment, offset),
                (4, HEADER + (last_records - 1) * FRAMED),
                "{err}"
            );
            assert_eq!(detail, "segment truncated inside a record");
        }
        other => panic!("want Corrupt, got {other}"),
    }

    // 3. A damaged header: the segment is refused at offset 0 before any of its records.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    f.seek(SeekFrom::Start(13)).unwrap();
    f.write_all(&[0xFF]).unwrap();
    drop(f);
    let (good, err) = read_until_error(&st);
    assert_eq!(good, 2 * PER_SEGMENT);
    assert!(
        matches!(
            err,
            SpillError::Corrupt {
                segment: 2,
                offset: 0,
                ..
            }
        ),
        "{err}"
    );

    // Damage does not break ownership: the files are still deleted exactly once.
    drop(st);
    task.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.files_deleted, 5);
}

fn damage_is_reported_where_it_is_buffered(b: BackendKind) {
    damage_cases(b, WriteMode::Buffered, 256 << 10);
}

fn damage_is_reported_where_it_is_direct(b: BackendKind) {
    damage_cases(b, WriteMode::Direct, 256 << 10);
}

fn damage_is_reported_where_it_is_buffered_and_mapped(b: BackendKind) {
    damage_cases(b, WriteMode::Buffered, 0);
}

fn damage_is_reported_where_it_is_direct_and_mapped(b: BackendKind) {
    damage_cases(b, WriteMode::Direct, 0);
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
    // Flip a byte of the 4th record's payload (header 64 + 3 framed records of 108, + frame 8).
    // In place, never truncating: `all` still points into a mapping of this file.
    let path = &state.paths()[0];
    let at = 64 + 3 * 108 + 8 + 5;
    let byte = std::fs::read(path).unwrap()[at] ^ 1;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[byte], at as u64).unwrap();
    let items: Vec<_> = state.reader().unwrap().collect();
    assert_eq!(
        items.len(),
        4,
        "three records, then the error, then the end"
    );
    assert!(items[..3].iter().all(|r| r.is_ok()));
    assert!(
        matches!(items[3], Err(spillring::SpillError::Corrupt { .. })),
        "{:?}",
        items[3]
    );
    drop((all, state, task));
    assert_clean(&engine, dir.path());
}
