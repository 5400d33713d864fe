//! Round trips: records of random sizes (0 B..4 MiB) across many rotations, both write modes,
//! both backends, byte for byte.

#[macro_use]
mod common;
use common::*;

use rand::{Rng, SeedableRng, rngs::StdRng};
use spillring::{BackendKind, Bytes, Engine, WriteMode};

per_backend!(many_states_from_one_task_share_nothing);

/// 10,000 record sizes: mostly small, some medium, a few up to 4 MiB (larger than the 1 MiB
/// segments, so they get segments of their own), and some empty.
fn sizes(seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..10_000)
        .map(|_| match rng.random_range(0..100) {
            0..=4 => 0,
            5..=84 => rng.random_range(1..4096),
            85..=98 => rng.random_range(4096..256 << 10),
            _ => rng.random_range(256 << 10..=4 << 20),
        })
        .collect()
}

fn round_trip(backend: spillring::BackendKind, mode: WriteMode) {
    let _serial = serial();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), backend)
            .mode(mode)
            .segment_size(1 << 20)
            .io_buffer_size(128 << 10),
    )
    .unwrap();
    // Records are slices of one random pool: zero-copy Bytes, cheap to compare.
    let mut pool = vec![0u8; 8 << 20];
    StdRng::seed_from_u64(7).fill(&mut pool[..]);
    let pool = Bytes::from(pool);
    let mut rng = StdRng::seed_from_u64(11);
    let recs: Vec<Bytes> = sizes(3)
        .into_iter()
        .map(|len| {
            let at = rng.random_range(0..=pool.len() - len);
            pool.slice(at..at + len)
        })
        .collect();
    let total: usize = recs.iter().map(|r| r.len()).sum();

    let fds = fd_count();
    let task = engine.task("roundtrip").unwrap();
    let mut w = task.writer().unwrap();
    for (i, r) in recs.iter().enumerate() {
        // Alternate the two entry points: owned Bytes, and a borrowed slice.
        if i % 2 == 0 {
            w.write(r.clone()).unwrap();
        } else {
            w.write_slice(r).unwrap();
        }
    }
    let state = w.finish().unwrap();
    assert!(
        state.segments() > 20,
        "expected many rotations, got {} segments for {total} bytes",
        state.segments()
    );
    let mut r = state.reader().unwrap();
    for (i, want) in recs.iter().enumerate() {
        let got = r
            .next_record()
            .unwrap()
            .unwrap_or_else(|| panic!("missing record {i}"));
        assert_eq!(got.len(), want.len(), "length of record {i}");
        assert!(got == want, "bytes of record {i} differ");
    }
    assert!(r.next_record().unwrap().is_none(), "extra records");
    drop(r);
    drop(state);
    task.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(m.records_written, 10_000);
    assert_eq!(m.records_read, 10_000);
    assert_eq!(m.bytes_read as usize, total);
    assert_eq!(m.files_deleted, m.segments_created);
    assert_fds_back_to(fds);
}

#[test]
fn buffered_uring() {
    round_trip(spillring::BackendKind::Uring, WriteMode::Buffered);
}

#[test]
fn buffered_psync() {
    round_trip(spillring::BackendKind::Psync, WriteMode::Buffered);
}

#[test]
fn direct_uring() {
    round_trip(spillring::BackendKind::Uring, WriteMode::Direct);
}

#[test]
fn direct_psync() {
    round_trip(spillring::BackendKind::Psync, WriteMode::Direct);
}

fn many_states_from_one_task_share_nothing(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let task = engine.task("multi").unwrap();
    let states: Vec<_> = (0..5u64)
        .map(|k| {
            let mut w = task.writer().unwrap();
            for i in 0..200 {
                w.write(Bytes::from(record(k * 1000 + i, 3000))).unwrap();
            }
            w.finish().unwrap()
        })
        .collect();
    // Read them back in reverse, each from a clone (another grant).
    for (k, st) in states.iter().enumerate().rev() {
        let mut r = st.clone().into_reader().unwrap();
        for i in 0..200 {
            let rec = r.next_record().unwrap().unwrap();
            assert_eq!(&rec[..], &record(k as u64 * 1000 + i, 3000)[..]);
        }
        assert!(r.next_record().unwrap().is_none());
    }
    // Files stay while any grant lives; dropping all of them deletes every file.
    assert!(engine.settle(std::time::Duration::from_secs(5)));
    assert!(!files_under(dir.path()).is_empty());
    drop(states);
    assert!(engine.settle(std::time::Duration::from_secs(5)));
    assert_eq!(files_under(dir.path()), Vec::<std::path::PathBuf>::new());
    task.close();
    assert_clean(&engine, dir.path());
}
