#[macro_use]
mod common;
use common::*;
use spillring::{BackendKind, Bytes};

per_backend!(small_round_trip);

fn small_round_trip(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let task = engine.task("smoke").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..1000u64 {
        w.write(Bytes::from(record(i, (i as usize * 37) % 5000)))
            .unwrap();
    }
    let st = w.finish().unwrap();
    assert!(st.segments() > 1);
    let mut r = st.reader().unwrap();
    let mut i = 0u64;
    while let Some(rec) = r.next_record().unwrap() {
        assert_eq!(
            &rec[..],
            &record(i, (i as usize * 37) % 5000)[..],
            "record {i}"
        );
        i += 1;
    }
    assert_eq!(i, 1000);
    drop(r);
    drop(st);
    task.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.records_read, 1000);
    assert_eq!(
        m.backend,
        if b == spillring::BackendKind::Uring {
            spillring::Backend::IoUring
        } else {
            spillring::Backend::Psync
        }
    );
}
