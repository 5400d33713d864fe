//! The byte stream of `SpillWriter::append` (and `impl std::io::Write`): cut into records at
//! buffer and segment boundaries, read back as their concatenation in both write modes, with
//! every codec and with encryption, mixed with the other record calls, and refused by the quota
//! with the writer left usable and the error typed through `std::io::Error`.

#[macro_use]
mod common;
use common::*;

use std::io::Write;

use rand::{Rng, SeedableRng, rngs::StdRng};
use spillring::{BackendKind, Bytes, Compression, Engine, SpillError, SpilledState};

per_backend!(
    a_stream_of_small_appends_reads_back_whole_in_records_of_a_buffer,
    appends_mixed_with_writes_and_slots_keep_their_order,
    a_stream_after_a_large_records_tail_round_trips,
    a_quota_refusal_mid_stream_is_typed_and_leaves_a_prefix,
);

fn read_all(state: &SpilledState) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::new();
    let mut lens = Vec::new();
    for rec in state.reader().unwrap() {
        let rec = rec.unwrap();
        lens.push(rec.len());
        out.extend_from_slice(&rec);
    }
    (out, lens)
}

/// Slices of 1 byte to 20 KB, 3 MiB in all, across segments of 256 KiB and buffers of 64 KiB:
/// the concatenation comes back, and the stream is cut into records of about a buffer (one per
/// buffer, not one per slice).
fn a_stream_of_small_appends_reads_back_whole_in_records_of_a_buffer(backend: BackendKind) {
    for mode in both_modes() {
        for (compression, encryption) in [
            (Compression::None, false),
            (Compression::Lz4, false),
            (Compression::Auto, false),
            (Compression::None, true),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = cfg(dir.path(), backend)
                .mode(mode)
                .compression(compression)
                .encryption(encryption);
            let engine = Engine::open(cfg).unwrap();
            let task = engine.task("append").unwrap();
            let mut w = task.writer().unwrap();
            let mut rng = StdRng::seed_from_u64(7);
            let mut want = Vec::new();
            let mut slices = 0u64;
            while want.len() < 3 << 20 {
                let len = if rng.random_bool(0.1) {
                    rng.random_range(1..20_000)
                } else {
                    rng.random_range(1..200)
                };
                // Half compressible text, half noise.
                let bytes: Vec<u8> = if rng.random_bool(0.5) {
                    (0..len).map(|i| b"lineitem|"[i % 9]).collect()
                } else {
                    record(slices, len)
                };
                w.append(&bytes).unwrap();
                want.extend_from_slice(&bytes);
                slices += 1;
            }
            assert_eq!(w.bytes_written(), want.len() as u64);
            let state = w.finish().unwrap();
            let (got, lens) = read_all(&state);
            assert_eq!(
                got.len(),
                want.len(),
                "{mode:?} {compression:?} {encryption}"
            );
            assert!(got == want, "{mode:?} {compression:?}: the stream differs");
            assert_eq!(state.records(), lens.len() as u64);
            if compression == Compression::None {
                assert!(state.segments() >= 12, "3 MiB over 256 KiB segments");
            }
            // About one record per 64 KiB buffer: never one per slice.
            let per_buffer = (want.len() / (64 << 10)) as u64;
            assert!(
                state.records() <= per_buffer + 2 * state.segments() as u64 + 2,
                "{} records for {slices} slices",
                state.records()
            );
            assert!(lens.iter().all(|&l| l <= 64 << 10));
            drop(state);
            assert_clean(&engine, dir.path());
        }
    }
}

/// `write`, `write_slice` and a slot each end the record the stream is filling; the records
/// come back in order with the stream's parts between them.
fn appends_mixed_with_writes_and_slots_keep_their_order(backend: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(cfg(dir.path(), backend).mode(mode)).unwrap();
        let task = engine.task("append-mixed").unwrap();
        let mut w = task.writer().unwrap();
        let mut want: Vec<Vec<u8>> = Vec::new();
        for i in 0..200u64 {
            w.append(b"ab").unwrap();
            w.append(b"cd").unwrap();
            want.push(b"abcd".to_vec());
            match i % 4 {
                0 => {
                    let r = record(i, 100);
                    w.write(Bytes::from(r.clone())).unwrap();
                    want.push(r);
                }
                1 => {
                    let r = record(i, 30);
                    w.write_slice(&r).unwrap();
                    want.push(r);
                }
                2 => {
                    let mut slot = w.record(8).unwrap();
                    slot.copy_from_slice(&i.to_le_bytes());
                    slot.commit().unwrap();
                    want.push(i.to_le_bytes().to_vec());
                }
                _ => {
                    // A large record (a block of its own) after the stream's record.
                    let r = record(i, 100 << 10);
                    w.write(Bytes::from(r.clone())).unwrap();
                    want.push(r);
                }
            }
        }
        // `flush` ends the open record too.
        Write::write_all(&mut w, b"tail").unwrap();
        Write::flush(&mut w).unwrap();
        w.append(b"end").unwrap();
        want.push(b"tail".to_vec());
        want.push(b"end".to_vec());
        let state = w.finish().unwrap();
        let got: Vec<Vec<u8>> = state
            .reader()
            .unwrap()
            .map(|r| r.unwrap().to_vec())
            .collect();
        assert_eq!(got.len(), want.len(), "{mode:?}");
        assert!(got == want, "{mode:?}: records out of order or torn");
        drop(state);
        assert_clean(&engine, dir.path());
    }
}

/// A large record copied through the staging buffers (direct mode) ends anywhere in a buffer;
/// with less room left than a block header needs, the stream's next bytes go out as a raw block
/// of their own. Every end offset around that bound round trips.
fn a_stream_after_a_large_records_tail_round_trips(backend: BackendKind) {
    let buf = 64 << 10;
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(cfg(dir.path(), backend).mode(mode)).unwrap();
        let task = engine.task("append-tail").unwrap();
        for len in (2 * buf - 260..2 * buf - 40).step_by(8) {
            let mut w = task.writer().unwrap();
            let big = record(len as u64, len);
            w.write(Bytes::from(big.clone())).unwrap();
            let mut stream = Vec::new();
            for i in 0..50u64 {
                let part = record(i, 300);
                w.append(&part).unwrap();
                stream.extend_from_slice(&part);
            }
            let state = w.finish().unwrap();
            let mut r = state.reader().unwrap();
            assert_eq!(r.next_record().unwrap().unwrap(), big, "{mode:?} {len}");
            let mut got = Vec::new();
            while let Some(rec) = r.next_record().unwrap() {
                got.extend_from_slice(&rec);
            }
            assert!(got == stream, "{mode:?} {len}: the stream differs");
        }
        assert_clean(&engine, dir.path());
    }
}

/// A quota of two segments: the stream fills the first, and the rotation into the third is
/// refused. `append` says `QuotaExceeded` (or `WriterCannotFit`), the stream holds a prefix of
/// the slice (`bytes_written` says which), the writer finishes with it; through
/// `std::io::Write` the refusal is a short count first, then an error of kind `QuotaExceeded`
/// that carries the `SpillError`.
fn a_quota_refusal_mid_stream_is_typed_and_leaves_a_prefix(backend: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let seg = 256u64 << 10;
        let engine =
            Engine::open(cfg(dir.path(), backend).mode(mode).max_spill_bytes(2 * seg)).unwrap();
        let task = engine.task("append-quota").unwrap();
        let mut w = task.writer().unwrap();
        let big = record(1, 2 << 20);
        let e = w.append(&big).unwrap_err();
        assert!(
            matches!(
                e,
                SpillError::QuotaExceeded { .. } | SpillError::WriterCannotFit { .. }
            ),
            "{mode:?}: {e:?}"
        );
        let kept = w.bytes_written() as usize;
        assert!(kept > 0 && kept < big.len(), "{mode:?}: {kept}");
        // The writer is usable: io::Write gives the refusal as an error carrying it.
        let err = Write::write(&mut w, &big).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::QuotaExceeded, "{err:?}");
        assert!(matches!(
            SpillError::from_io(err),
            SpillError::QuotaExceeded { .. } | SpillError::WriterCannotFit { .. }
        ));
        assert_eq!(w.bytes_written() as usize, kept, "nothing more went in");
        let state = w.finish().unwrap();
        let (got, _) = read_all(&state);
        assert!(got == big[..kept], "{mode:?}: the prefix differs");
        drop(state);

        // A short count: the slice went in part way (once the first writer's files are gone).
        assert!(engine.settle(std::time::Duration::from_secs(10)));
        let mut w = task.writer().unwrap();
        let n = Write::write(&mut w, &big).unwrap();
        assert!(n > 0 && n < big.len(), "{mode:?}: {n}");
        assert_eq!(w.bytes_written() as usize, n);
        drop(w);
        assert_clean(&engine, dir.path());
    }
}
