//! Records filled in place in the engine's staging buffer (no copy), mixed with ordinary
//! writes, in both modes and on both backends.

#[macro_use]
mod common;
use common::*;

use spillring::{BackendKind, Bytes, Engine, SpillError, WriteMode};

per_backend!(in_place_records_round_trip);

fn in_place_records_round_trip(b: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let engine = Engine::open(
            cfg(dir.path(), b)
                .mode(mode)
                .segment_size(256 << 10)
                .io_buffer_size(64 << 10),
        )
        .unwrap();
        let task = engine.task("slots").unwrap();
        let mut w = task.writer().unwrap();
        let mut in_place = 0;
        let lens: Vec<usize> = (0..2000u64)
            .map(|i| ((i * 7919) % 9000) as usize + (i as usize % 3) * 40_000)
            .collect();
        for (i, &len) in lens.iter().enumerate() {
            let want = record(i as u64, len);
            if i % 3 == 0 {
                w.write(Bytes::from(want)).unwrap();
                continue;
            }
            let mut slot = w.record(len).unwrap();
            in_place += usize::from(slot.is_in_place());
            assert_eq!(slot.len(), len);
            slot.copy_from_slice(&want);
            slot.commit().unwrap();
            if i % 5 == 0 {
                // A slot dropped without commit writes nothing.
                let mut junk = w.record(100).unwrap();
                junk.fill(0xEE);
                drop(junk);
            }
        }
        // Of the 1,333 slots, 667 fit a 64 KiB buffer; in direct mode some of those find
        // too little aligned room left in the current buffer and take an owned one.
        let want = if mode == WriteMode::Direct { 400 } else { 600 };
        assert!(
            in_place >= want,
            "only {in_place} records went in place ({mode:?})"
        );
        let st = w.finish().unwrap();
        let mut r = st.reader().unwrap();
        for (i, &len) in lens.iter().enumerate() {
            let got = r.next_record().unwrap().unwrap();
            assert!(
                got[..] == record(i as u64, len)[..],
                "record {i} ({mode:?})"
            );
        }
        assert!(r.next_record().unwrap().is_none());
        drop((r, st));
        task.close();
        assert_clean(&engine, dir.path());
    }
}

#[test]
fn a_slot_sees_a_cancel_at_commit() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), spillring::BackendKind::Uring);
    let task = engine.task("slot-cancel").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from_static(b"first")).unwrap();
    let mut slot = w.record(1000).unwrap();
    slot.fill(1);
    task.cancel();
    assert!(matches!(slot.commit(), Err(SpillError::Aborted)));
    drop(w);
    assert_clean(&engine, dir.path());
}

#[test]
fn direct_mode_keeps_alignment_with_slots() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), spillring::BackendKind::Uring)
            .mode(WriteMode::Direct)
            .io_buffer_size(8192),
    )
    .unwrap();
    let task = engine.task("align").unwrap();
    let mut w = task.writer().unwrap();
    // Odd sizes that straddle 8 KiB buffers: some fall back to an owned buffer.
    for i in 0..500u64 {
        let len = 1000 + (i as usize * 37) % 5000;
        let mut s = w.record(len).unwrap();
        s.copy_from_slice(&record(i, len));
        s.commit().unwrap();
    }
    let st = w.finish().unwrap();
    let mut r = st.reader().unwrap();
    for i in 0..500u64 {
        let len = 1000 + (i as usize * 37) % 5000;
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, len)[..]);
    }
    drop((r, st));
    task.close();
    assert_clean(&engine, dir.path());
}
