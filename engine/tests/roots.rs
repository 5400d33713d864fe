//! The byte quota and several roots: a root whose creates fail is skipped and the task goes on
//! on the healthy one.

#[macro_use]
mod common;
use common::*;

use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, SpillError};

per_backend!(
    quota_refuses_the_reservation_and_reopens,
    segments_spread_round_robin_over_roots,
);

fn write_and_check(engine: &Engine, id: &str, n: u64, len: usize) {
    let task = engine.task(id).unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..n {
        w.write(Bytes::from(record(i, len))).unwrap();
    }
    let st = w.finish().unwrap();
    let mut r = st.reader().unwrap();
    for i in 0..n {
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, len)[..]);
    }
    assert!(r.next_record().unwrap().is_none());
    drop((r, st));
    task.close();
}

fn quota_refuses_the_reservation_and_reopens(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let seg = 64u64 << 10;
    let engine = Engine::open(
        cfg(dir.path(), b)
            .segment_size(seg)
            .max_spill_bytes(3 * seg),
    )
    .unwrap();
    let task = engine.task("quota").unwrap();
    let mut w = task.writer().unwrap();
    let mut n = 0;
    let err = loop {
        match w.write(Bytes::from(record(n, 1000))) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    match err {
        SpillError::QuotaExceeded {
            limit,
            in_use,
            requested,
        } => {
            assert_eq!(limit, 3 * seg);
            assert!(in_use + requested > limit);
        }
        other => panic!("want QuotaExceeded, got {other}"),
    }
    assert!(engine.settle(Duration::from_secs(5)));
    assert_eq!(
        segment_files(dir.path()),
        3,
        "the refused reservation created no file"
    );
    assert_eq!(engine.metrics().quota_failures, 1);
    // Distinct from the ledger: tickets were free.
    assert!(engine.metrics().tickets_used < engine.metrics().ticket_capacity);
    let st = w.finish().unwrap();
    let mut r = st.reader().unwrap();
    for i in 0..n {
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, 1000)[..]);
    }
    drop((r, st));
    assert!(engine.settle(Duration::from_secs(5)));
    assert_eq!(engine.metrics().spill_bytes_in_use, 0);
    write_and_check(&engine, "after", n, 1000);
    task.close();
    assert_clean(&engine, dir.path());
}

fn segments_spread_round_robin_over_roots(b: BackendKind) {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let engine =
        Engine::open(cfg(d1.path(), b).add_root(d2.path()).segment_size(64 << 10)).unwrap();
    let task = engine.task("spread").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..640 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 10);
    assert_eq!((segment_files(d1.path()), segment_files(d2.path())), (5, 5));
    let mut r = st.reader().unwrap();
    for i in 0..640 {
        assert_eq!(&r.next_record().unwrap().unwrap()[..], &record(i, 1000)[..]);
    }
    drop((r, st));
    task.close();
    assert_clean(&engine, d1.path());
    assert_clean(&engine, d2.path());
}

#[test]
fn a_full_root_is_skipped_next_to_a_healthy_one() {
    let _serial = serial();
    // Preallocation makes a full disk fail at the create, where another root can take over.
    let (_holder, full) = private_tmpfs("1m", false);
    let healthy = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        cfg(&full, BackendKind::Uring)
            .add_root(healthy.path())
            .segment_size(256 << 10)
            .preallocate(true)
            .root_skip(Duration::from_secs(60)),
    )
    .unwrap();
    // Fill the tmpfs so that no segment fits on it.
    let filler = full.join("filler");
    std::fs::write(&filler, vec![1u8; 900 << 10]).unwrap();
    write_and_check(&engine, "skips", 400, 10_000);
    let m = engine.metrics();
    assert_eq!(m.root_skips, 1, "one skip, kept for root_skip: {m:?}");
    assert!(m.segments_created >= 16);
    std::fs::remove_file(&filler).unwrap();
    assert_clean(&engine, &full);
    assert_clean(&engine, healthy.path());
}

#[test]
fn a_root_that_turns_read_only_is_skipped() {
    let _serial = serial();
    let (_holder, ro) = private_tmpfs("16m", false);
    let healthy = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        cfg(&ro, BackendKind::Psync)
            .add_root(healthy.path())
            .segment_size(64 << 10)
            .root_skip(Duration::from_secs(60)),
    )
    .unwrap();
    // The device goes read-only under the running engine.
    let target = std::ffi::CString::new(ro.to_str().unwrap()).unwrap();
    // SAFETY: valid NUL-terminated arguments; the result is checked.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_RDONLY,
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "remount ro: {}", std::io::Error::last_os_error());
    write_and_check(&engine, "erofs", 640, 1000);
    let m = engine.metrics();
    assert_eq!(m.root_skips, 1, "{m:?}");
    assert_eq!(segment_files(&ro), 0);
    assert_clean(&engine, healthy.path());
}
