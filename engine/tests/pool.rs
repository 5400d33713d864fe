//! The segment pool, on both backends: a recycled file never shows its past (invariant 10), a
//! record a caller holds never changes, the ownership rules hold at every pool transition, and
//! a full ledger or quota trims the pool before it refuses a writer.

#[macro_use]
mod common;
use common::*;

use std::path::PathBuf;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

use spillring::{BackendKind, Bytes, Engine, SpillError, TaskSpill};

per_backend!(
    a_reused_file_shows_only_its_last_use,
    a_held_record_never_changes_across_release_and_reuse,
    cancel_of_a_writer_on_a_reused_file_deletes_it_once,
    a_full_ledger_trims_the_pool_before_refusing,
    the_pool_keeps_its_bounds,
    the_pool_keeps_its_byte_bound_exactly,
    a_pool_turned_off_takes_no_part,
    shutdown_empties_the_pool,
    a_pooled_file_whose_reuse_fails_is_deleted_once,
    cancels_racing_releases_into_the_pool_release_every_ticket_once,
    a_kept_map_serves_the_next_use_and_shows_only_it,
    publish_lets_go_of_a_kept_map,
    a_lost_write_on_a_reused_file_reads_as_corrupt_not_as_its_last_use,
    a_reused_file_holds_a_whole_segment_of_quota_while_written_again,
);

fn spill(task: &TaskSpill, first: u64, n: u64, len: usize) -> spillring::SpilledState {
    let mut w = task.writer().unwrap();
    for i in first..first + n {
        w.write(Bytes::from(record(i, len))).unwrap();
    }
    w.finish().unwrap()
}

fn read_all(st: &spillring::SpilledState) -> Vec<Bytes> {
    st.reader().unwrap().map(|r| r.unwrap()).collect()
}

/// A long spill, released into the pool, then a short one on the same file: the reader sees the
/// short one's records only, though the long one's bytes are still in the file past them.
fn a_reused_file_shows_only_its_last_use(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b)).unwrap();
    let task = engine.task("reuse").unwrap();
    let long = spill(&task, 0, 200, 1000);
    assert_eq!(long.segments(), 1);
    let path: PathBuf = long.paths()[0].clone();
    let long_len = std::fs::metadata(&path).unwrap().len();
    drop(long);
    let m = engine.metrics();
    assert_eq!((m.pool_segments, m.tickets_used), (1, 1), "{m:?}");
    assert!(path.exists(), "a pooled file stays on disk");

    let short = spill(&task, 1000, 3, 1000);
    assert_eq!(
        short.paths(),
        vec![path.clone()],
        "the pooled file was reused"
    );
    let m = engine.metrics();
    assert_eq!(
        (m.pool_hits, m.pool_segments, m.pool_bytes),
        (1, 0, 0),
        "{m:?}"
    );
    let got = read_all(&short);
    assert_eq!(got.len(), 3, "records of the earlier use were returned");
    for (k, rec) in got.iter().enumerate() {
        assert_eq!(&rec[..], &record(1000 + k as u64, 1000)[..]);
    }
    // The file was cut back to this use's length at finish: the quota bounds blocks on disk.
    let now = std::fs::metadata(&path).unwrap().len();
    assert!(now < long_len, "{now} >= {long_len}");
    drop(short);
    task.close();
    assert_clean_and_unmapped(&engine, dir.path());
}

/// A record a caller holds keeps its bytes after its state is released and the next spills
/// run on the same file. A mapped segment (one larger than the reader reads into a buffer)
/// never goes back to the pool while a mapping of it is alive; a small one, read into a
/// buffer of its own, does, and its held records are unaffected.
fn a_held_record_never_changes_across_release_and_reuse(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).segment_size(1 << 20)).unwrap();
    let task = engine.task("held").unwrap();
    // 400 KB in one segment: mapped.
    let st = spill(&task, 0, 400, 1000);
    assert_eq!(st.segments(), 1);
    let held = st.reader().unwrap().next_record().unwrap().unwrap();
    drop(st);
    assert_eq!(
        engine.metrics().pool_segments,
        0,
        "a mapped segment went back to the pool"
    );
    for k in 0..3 {
        drop(spill(&task, 1000 + k * 400, 400, 1000));
        assert_eq!(&held[..], &record(0, 1000)[..], "a held record changed");
    }
    drop(held);
    // Without a live mapping the next release pools its segment.
    let st = spill(&task, 5000, 400, 1000);
    let recs = read_all(&st);
    assert_eq!(recs.len(), 400);
    drop((recs, st));
    assert_eq!(engine.metrics().pool_segments, 1);
    // 20 KB: read into a buffer; the segment is pooled and reused while a record is held.
    let st = spill(&task, 9000, 20, 1000);
    let held = st.reader().unwrap().next_record().unwrap().unwrap();
    let path = st.paths()[0].clone();
    drop(st);
    assert_eq!(engine.metrics().pool_segments, 1);
    let again = spill(&task, 9500, 20, 1000);
    assert_eq!(again.paths(), vec![path], "the small segment was reused");
    assert_eq!(&held[..], &record(9000, 1000)[..], "a held record changed");
    drop((again, held));
    task.close();
    assert_clean_and_unmapped(&engine, dir.path());
}

/// A writer that took a pooled file is cancelled: the file is deleted once, its ticket released
/// once, and the cancel reads as `Aborted`.
fn cancel_of_a_writer_on_a_reused_file_deletes_it_once(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b)).unwrap();
    let warm = engine.task("warm").unwrap();
    drop(spill(&warm, 0, 10, 1000));
    assert_eq!(engine.metrics().pool_segments, 1);
    let task = engine.task("cancelled").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from(record(1, 1000))).unwrap();
    assert_eq!(engine.metrics().pool_hits, 1);
    task.cancel();
    let e = w.write(Bytes::from(record(2, 1000))).unwrap_err();
    assert!(matches!(e, SpillError::Aborted), "{e}");
    drop(w);
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(
        (m.tickets_used, m.pool_segments, m.files_deleted),
        (0, 0, 1),
        "{m:?}"
    );
    warm.close();
    assert_clean_and_unmapped(&engine, dir.path());
}

/// Pooled files hold tickets. A writer on a root whose pool is empty, refused by a full
/// ledger, first deletes a pooled file of the other root and then gets its ticket.
fn a_full_ledger_trims_the_pool_before_refusing(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let (r0, r1) = (dir.path().join("r0"), dir.path().join("r1"));
    let engine = Engine::open(pooled_cfg(&r0, b).add_root(&r1).ticket_capacity(2)).unwrap();
    let task = engine.task("pressure").unwrap();
    // Roots are picked round-robin: a on r0, p on r1. p is released into r1's pool.
    let a = spill(&task, 0, 10, 1000);
    drop(spill(&task, 100, 10, 1000));
    let m = engine.metrics();
    assert_eq!((m.pool_segments, m.tickets_used), (1, 2), "{m:?}");
    assert!(a.paths()[0].starts_with(&r0), "{:?}", a.paths());
    // The next segment goes to r0, whose pool is empty, and the ledger is full.
    let w = spill(&task, 200, 10, 1000);
    assert!(w.paths()[0].starts_with(&r0), "{:?}", w.paths());
    let m = engine.metrics();
    assert_eq!(
        (m.pool_trims, m.pool_segments, m.admission_failures),
        (1, 0, 1),
        "{m:?}"
    );
    let got = read_all(&w);
    assert_eq!(got.len(), 10);
    assert_eq!(&got[9][..], &record(209, 1000)[..]);
    drop((a, w));
    task.close();
    assert_clean(&engine, &r0);
    assert_clean(&engine, &r1);
}

/// The pool keeps at most `pool_max_segments` files; the rest of a release is deleted.
fn the_pool_keeps_its_bounds(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).pool_max_segments(2)).unwrap();
    let task = engine.task("bounded").unwrap();
    let st = spill(&task, 0, 5 * 240, 1000);
    assert_eq!(st.segments(), 5);
    drop(st);
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(
        (m.pool_segments, m.tickets_used, m.files_deleted),
        (2, 2, 3),
        "{m:?}"
    );
    assert_eq!(segment_files(dir.path()), 2);
    task.close();
    assert_clean_and_unmapped(&engine, dir.path());
}

/// `pool_max_bytes` holds to the byte: a release whose segment would pass it deletes that
/// segment, one that lands exactly on it keeps it.
fn the_pool_keeps_its_byte_bound_exactly(b: BackendKind) {
    // One 200,000-byte record per 256 KiB segment (a second would pass it): header, block
    // header, frame.
    const FULL: u64 = 64 + 64 + 8 + 200_000;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).pool_max_bytes(2 * FULL)).unwrap();
    let task = engine.task("bytes").unwrap();
    let st = spill(&task, 0, 4, 200_000);
    assert_eq!(st.segments(), 4);
    drop(st);
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(
        (m.pool_segments, m.pool_bytes, m.files_deleted, m.pool_trims),
        (2, 2 * FULL, 2, 2),
        "{m:?}"
    );
    task.close();
    assert_clean_and_unmapped(&engine, dir.path());
}

/// With either bound at 0 the pool is off: writers neither take from it nor count misses, and
/// released files are deleted.
fn a_pool_turned_off_takes_no_part(b: BackendKind) {
    for segments_off in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = pooled_cfg(dir.path(), b);
        let cfg = if segments_off {
            cfg.pool_max_segments(0)
        } else {
            cfg.pool_max_bytes(0)
        };
        let engine = Engine::open(cfg).unwrap();
        let task = engine.task("off").unwrap();
        for k in 0..3 {
            drop(spill(&task, k * 10, 10, 1000));
        }
        assert!(engine.settle(T));
        let m = engine.metrics();
        assert_eq!(
            (m.pool_hits, m.pool_misses, m.pool_segments, m.files_deleted),
            (0, 0, 0, 3),
            "segments_off {segments_off}: {m:?}"
        );
        task.close();
        assert_clean_and_unmapped(&engine, dir.path());
    }
}

/// A shutdown deletes the pooled files with everything else.
fn shutdown_empties_the_pool(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b)).unwrap();
    let task = engine.task("down").unwrap();
    drop(spill(&task, 0, 3 * 240, 1000));
    assert_eq!(engine.metrics().pool_segments, 3);
    drop(task);
    let r = engine.shutdown(T);
    assert!(r.drained, "{r:?}");
    assert_eq!(r.tickets_held, 0, "{r:?}");
    assert_eq!(r.directories_left, 0, "{r:?}");
    assert_eq!(segment_files(dir.path()), 0);
}

/// A pooled file whose reuse fails (here it was deleted behind the engine's back, so the
/// reopen finds no file) is given up: its delete finds it absent, its ticket is released once,
/// and the writer goes on with a new file.
fn a_pooled_file_whose_reuse_fails_is_deleted_once(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b)).unwrap();
    let task = engine.task("reuse-fails").unwrap();
    let st = spill(&task, 0, 10, 1000);
    let path = st.paths()[0].clone();
    drop(st);
    let m0 = engine.metrics();
    assert_eq!((m0.pool_segments, m0.tickets_used), (1, 1), "{m0:?}");
    std::fs::remove_file(&path).unwrap();

    let st = spill(&task, 100, 10, 1000);
    let got = read_all(&st);
    assert_eq!(got.len(), 10);
    for (k, rec) in got.iter().enumerate() {
        assert_eq!(&rec[..], &record(100 + k as u64, 1000)[..]);
    }
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(m.pool_hits, m0.pool_hits, "a failed reuse is no hit: {m:?}");
    assert_eq!(m.pool_trims, m0.pool_trims + 1, "{m:?}");
    assert_eq!(m.pool_segments, 0, "{m:?}");
    assert_eq!(m.files_already_absent, m0.files_already_absent + 1, "{m:?}");
    // Only the new state's file holds a ticket: the given-up file's was released, once.
    assert_eq!(m.tickets_used, 1, "{m:?}");
    drop((got, st));
    task.close();
    let m = assert_clean_and_unmapped(&engine, dir.path());
    assert_eq!(m.files_already_absent, m0.files_already_absent + 1, "{m:?}");
}

/// States are released into the pool (and writers take pooled files) while their scopes are
/// cancelled from another thread: at every transition (release to the pool, reuse, trim) each
/// file ends deleted or pooled, and every ticket is released exactly once.
fn cancels_racing_releases_into_the_pool_release_every_ticket_once(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    for round in 0..30u64 {
        let tasks: Vec<TaskSpill> = (0..3)
            .map(|t| engine.task(&format!("r{round}-{t}")).unwrap())
            .collect();
        std::thread::scope(|s| {
            for task in &tasks {
                s.spawn(move || {
                    for k in 0..6u64 {
                        let mut w = match task.writer() {
                            Ok(w) => w,
                            Err(SpillError::Aborted) => return,
                            Err(e) => panic!("writer: {e}"),
                        };
                        let mut failed = false;
                        for i in 0..20u64 {
                            match w.write(Bytes::from(record(k * 100 + i, 4000))) {
                                Ok(()) => {}
                                Err(SpillError::Aborted) => {
                                    failed = true;
                                    break;
                                }
                                Err(e) => panic!("write: {e}"),
                            }
                        }
                        if failed {
                            return;
                        }
                        match w.finish() {
                            // Released at once: its segments go to the pool, or are deleted
                            // by the cancel if it came first.
                            Ok(st) => drop(st),
                            Err(SpillError::Aborted) => return,
                            Err(e) => panic!("finish: {e}"),
                        }
                    }
                });
            }
            s.spawn(|| {
                std::thread::sleep(Duration::from_micros(150 * (round % 7)));
                for task in &tasks {
                    task.cancel();
                }
            });
        });
        drop(tasks);
        assert!(engine.settle(T));
        let m = engine.metrics();
        assert_eq!(
            m.tickets_used, m.pool_segments,
            "round {round}: every ticket held is a pooled file's: {m:?}"
        );
        assert_eq!(
            segment_files(dir.path()) as u64,
            m.pool_segments,
            "round {round}: every file left is pooled: {m:?}"
        );
    }
    let m = assert_clean_and_unmapped(&engine, dir.path());
    assert!(m.pool_hits > 0, "no reuse happened: {m:?}");
    assert_eq!(
        m.files_deleted + m.files_already_absent,
        m.segments_created,
        "every file created was deleted exactly once: {m:?}"
    );
}

/// Buffered mode keeps a mapped segment's map with its pooled file: the reader of the file's
/// next use reads through it (no second map), sees only that use's records when it is shorter
/// than the map, maps anew when it is longer, and the map goes with the file.
fn a_kept_map_serves_the_next_use_and_shows_only_it(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).segment_size(4 << 20)).unwrap();
    let task = engine.task("kept-map").unwrap();
    // 600 KB: past `read_buffer_max` (256 KiB), so mapped.
    let first = spill(&task, 0, 600, 1000);
    let path = first.paths()[0].clone();
    let got = read_all(&first);
    assert_eq!(got.len(), 600);
    assert_eq!(&got[599][..], &record(599, 1000)[..]);
    drop((got, first));
    assert_eq!(engine.metrics().pool_segments, 1, "the segment was pooled");
    assert!(engine.settle(T));
    assert_eq!(
        mappings_of(&path),
        1,
        "its map was kept with the pooled file"
    );

    // Shorter (300 KB, still mapped): the kept map is longer than this use.
    let short = spill(&task, 1000, 300, 1000);
    assert_eq!(
        short.paths(),
        vec![path.clone()],
        "the pooled file was reused"
    );
    let got = read_all(&short);
    assert_eq!(got.len(), 300, "records of the earlier use were returned");
    for (k, rec) in got.iter().enumerate() {
        assert_eq!(&rec[..], &record(1000 + k as u64, 1000)[..]);
    }
    assert_eq!(
        mappings_of(&path),
        1,
        "the kept map was read through, none made"
    );
    drop((got, short));

    // Longer (1.5 MB): the kept map is too short, so the reader maps the file anew.
    let long = spill(&task, 5000, 1500, 1000);
    assert_eq!(long.paths(), vec![path.clone()]);
    let got = read_all(&long);
    assert_eq!(got.len(), 1500);
    for (k, rec) in got.iter().enumerate() {
        assert_eq!(&rec[..], &record(5000 + k as u64, 1000)[..]);
    }
    drop((got, long));
    assert!(engine.settle(T));
    assert_eq!(mappings_of(&path), 1, "the new map replaced the short one");
    task.close();
    // The pooled file's delete unmaps it.
    assert_clean_and_unmapped(&engine, dir.path());
    assert_eq!(mappings_of(&path), 0);
}

/// A published file is the caller's: the engine leaves no map of it (the map a reader left
/// with it goes at the publish).
fn publish_lets_go_of_a_kept_map(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir_in(dir.path()).unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).segment_size(4 << 20)).unwrap();
    let task = engine.task("publish-map").unwrap();
    let st = spill(&task, 0, 600, 1000);
    assert_eq!(read_all(&st).len(), 600);
    assert!(engine.settle(T));
    assert_eq!(mappings_of(&st.paths()[0]), 1, "the reader's map was kept");
    let files = st.publish(dest.path(), "out").unwrap();
    assert!(engine.settle(T));
    assert_eq!(
        mappings_of(&files[0]),
        0,
        "a map of the published file was left"
    );
    task.close();
    std::fs::remove_dir_all(dest.path()).unwrap();
    assert_clean_and_unmapped(&engine, dir.path());
}

/// Issue 25, planted bugs: a lost write on a reused pooled file leaves the previous use's
/// block at a valid offset, checksum and all; the generation bound into every block's CRC
/// makes it damage, never that use's records. Records past `large_record_threshold` go out
/// as one write each, one block each, at the same offsets in both uses (the writes: the
/// first record's block, the segment header, then one per record); the second use's write
/// of its second record is reported done and not made (fault `Skip` on the third write), so
/// its file holds this use's header and first block, then the last use's second block,
/// intact. Seen failing with the
/// generation left out of the binding: the reader returned the first use's record as the
/// second use's.
fn a_lost_write_on_a_reused_file_reads_as_corrupt_not_as_its_last_use(b: BackendKind) {
    const LEN: usize = 300 << 10;
    let dir = tempfile::tempdir().unwrap();
    let plan = spillring::FaultPlan::new(5);
    let engine = Engine::open(
        pooled_cfg(dir.path(), b)
            .segment_size(4 << 20)
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("lost-write").unwrap();
    let first = spill(&task, 0, 3, LEN);
    let path = first.paths()[0].clone();
    assert_eq!(read_all(&first).len(), 3);
    drop(first);
    assert_eq!(engine.metrics().pool_segments, 1, "the segment was pooled");
    plan.arm(
        spillring::FaultPoint::IoWrite,
        spillring::FaultAction::Skip,
        spillring::Trigger::After { skip: 2, times: 1 },
    );
    let second = spill(&task, 1000, 3, LEN);
    assert_eq!(second.paths(), vec![path], "the pooled file was reused");
    let mut r = second.reader().unwrap();
    let mut n = 0u64;
    let err = loop {
        match r.next_record() {
            Ok(Some(rec)) => {
                assert!(
                    rec[..] == record(1000 + n, LEN)[..],
                    "record {n} of the second use is not its own (the first use's block read as this use's)"
                );
                n += 1;
            }
            Ok(None) => panic!("read all {n} records: the lost write went unnoticed"),
            Err(e) => break e,
        }
    };
    assert_eq!(
        n, 1,
        "the first record is this use's, the second the damage"
    );
    assert!(
        matches!(&err, SpillError::Corrupt { segment: 0, offset, .. } if *offset > 64),
        "want Corrupt at the second block of segment 0, got {err}"
    );
    drop((r, second));
    task.close();
    assert_clean(&engine, dir.path());
}

/// Issue 25, planted bugs: a pooled file's ticket is shrunk to what its last use wrote; a
/// writer that reuses it must hold a whole segment of quota again, as a new segment does, or
/// the quota no longer bounds what is written. Under a quota of two segments and a page, the
/// reused file and a new segment leave no room for a third writer; seen failing with the
/// ticket left at its shrunk size (`grow_to` dropped from the reuse in `rotate.rs`): the
/// reused file held 4 KiB of quota and the third writer was admitted.
fn a_reused_file_holds_a_whole_segment_of_quota_while_written_again(b: BackendKind) {
    const SEG: u64 = 256 << 10;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(pooled_cfg(dir.path(), b).max_spill_bytes(2 * SEG + 4096)).unwrap();
    let task = engine.task("reuse-quota").unwrap();
    drop(spill(&task, 0, 1, 100));
    let m = engine.metrics();
    assert_eq!(m.pool_segments, 1, "{m:?}");
    assert_eq!(
        m.spill_bytes_in_use, 4096,
        "a pooled file holds what it wrote"
    );
    let mut reused = task.writer().unwrap();
    reused.write(Bytes::from(record(1, 100))).unwrap();
    let m = engine.metrics();
    assert_eq!((m.pool_hits, m.pool_segments), (1, 0), "{m:?}");
    assert_eq!(
        m.spill_bytes_in_use, SEG,
        "the reused file holds a whole segment again"
    );
    let mut fresh = task.writer().unwrap();
    fresh.write(Bytes::from(record(2, 100))).unwrap();
    let mut third = task.writer().unwrap();
    let err = third.write(Bytes::from(record(3, 100))).unwrap_err();
    assert!(matches!(err, SpillError::QuotaExceeded { .. }), "{err}");
    let states = [reused.finish().unwrap(), fresh.finish().unwrap()];
    assert!(states.iter().all(|s| s.records() == 1));
    drop((states, third));
    task.close();
    assert_clean(&engine, dir.path());
}
