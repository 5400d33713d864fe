//! The staging buffer budget and disk proportional to what a writer wrote (issue 13, point 4).
//!
//! `max_buffer_memory` bounds every staging buffer the engine maps (held by writers, in flight,
//! or free): 64 writers written round-robin by one thread under a small budget complete (no
//! deadlock: a writer waits only for a buffer in flight), read back, and the budget is never
//! passed (`testing::buffer_stats`), blocking and async. A budget the open writers fill with
//! nothing in flight is a typed `BufferBudgetExhausted` that names the fix, and the other
//! writers lose nothing. In direct mode (and with `preallocate`) a segment is allocated in
//! steps, so the disk 64 small writers hold is proportional to what they wrote, a large
//! writer's segment grows to its reservation in steps (blocking and async), and `finish` trims
//! the last step's tail.

#[macro_use]
mod common;
use common::*;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use spillring::testing::buffer_stats;
use spillring::{BackendKind, Bytes, Engine, EngineConfig, SpillError, SpilledState, WriteMode};

per_backend!(
    round_robin_writers_share_a_small_budget_in_both_modes,
    async_round_robin_writers_wait_for_the_budget_asynchronously,
    a_budget_held_by_open_writers_is_a_typed_error_and_the_rest_lose_nothing,
    direct_disk_held_by_small_writers_is_proportional_to_their_data,
    a_segment_grows_in_steps_blocking_and_async_and_is_trimmed,
    preallocate_allocates_in_steps_too,
    a_long_writers_later_segments_are_allocated_whole,
);

const WRITERS: usize = 64;
/// Blocks of the engine's own files (the directory lock) counted with the segments.
const SLACK: u64 = 64 << 10;

/// Bytes allocated to every file under `dir` (`st_blocks` * 512).
fn disk_held(dir: &Path) -> u64 {
    files_under(dir)
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

fn read_all(state: &SpilledState) -> Vec<Vec<u8>> {
    let mut r = state.reader().unwrap();
    let mut out = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        out.push(rec.to_vec());
    }
    out
}

fn budget_cfg(root: &Path, backend: BackendKind, mode: WriteMode, budget: usize) -> EngineConfig {
    cfg(root, backend)
        .mode(mode)
        .max_buffer_memory(budget as u64)
}

/// 64 writers, one thread, round-robin, 3,000-byte records (frames cross buffer boundaries),
/// under a 512 KiB budget (the 64 KiB buffers of 64 writers would need 4 MiB).
fn round_robin_writers_share_a_small_budget_in_both_modes(backend: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let budget = 512 << 10;
        let engine = Engine::open(budget_cfg(dir.path(), backend, mode, budget)).unwrap();
        let task = engine.task("rr").unwrap();
        let mut ws: Vec<_> = (0..WRITERS).map(|_| task.writer().unwrap()).collect();
        let per = 40;
        for k in 0..per {
            for (i, w) in ws.iter_mut().enumerate() {
                w.write_slice(&record((i * 1000 + k) as u64, 3000)).unwrap();
            }
            let s = buffer_stats(&engine);
            assert!(
                s.mapped <= budget,
                "{mode:?}: {} mapped of {budget}",
                s.mapped
            );
        }
        let states: Vec<_> = ws.into_iter().map(|w| w.finish().unwrap()).collect();
        for (i, s) in states.iter().enumerate() {
            let recs = read_all(s);
            assert_eq!(recs.len(), per, "{mode:?} writer {i}");
            for (k, r) in recs.iter().enumerate() {
                assert_eq!(
                    r,
                    &record((i * 1000 + k) as u64, 3000),
                    "{mode:?} writer {i} rec {k}"
                );
            }
        }
        let s = buffer_stats(&engine);
        assert_eq!(s.budget, budget);
        assert!(s.peak <= budget, "{mode:?}: peak {} of {budget}", s.peak);
        // The budget was what bounded them: more than 4 KiB each at some point.
        assert!(
            s.peak > budget / 2,
            "{mode:?}: peak {} never near the budget",
            s.peak
        );
        drop(states);
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// The same with `write_async` on a one-thread runtime: a writer short of budget parks its
/// waker (the runtime's only thread must stay free for nothing else to run: the writes in
/// flight complete on the engine's threads and wake it).
fn async_round_robin_writers_wait_for_the_budget_asynchronously(backend: BackendKind) {
    for mode in both_modes() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let budget = 512 << 10;
        let engine =
            Engine::open(budget_cfg(dir.path(), backend, mode, budget).io_buffer_size(64 << 10))
                .unwrap();
        let task = engine.task("rr-async").unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let per = 30;
        let states = rt.block_on(async {
            let mut ws: Vec<_> = (0..WRITERS).map(|_| task.writer().unwrap()).collect();
            for k in 0..per {
                for (i, w) in ws.iter_mut().enumerate() {
                    w.write_async(Bytes::from(record((i * 1000 + k) as u64, 5000)))
                        .await
                        .unwrap();
                }
            }
            let mut states = Vec::new();
            for w in ws {
                states.push(w.finish_async().await.unwrap());
            }
            states
        });
        for (i, s) in states.iter().enumerate() {
            let recs = read_all(s);
            assert_eq!(recs.len(), per, "{mode:?} writer {i}");
            assert_eq!(recs[per - 1], record((i * 1000 + per - 1) as u64, 5000));
        }
        let s = buffer_stats(&engine);
        assert!(s.peak <= budget, "{mode:?}: peak {} of {budget}", s.peak);
        drop(states);
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// A 64 KiB budget holds at most 16 staging buffers of 4 KiB: opening more writers and
/// writing one small record to each (nothing goes in flight) fills it with buffers only their
/// writers could give back. The next writer gets `BufferBudgetExhausted` naming the fix (not
/// a wait that never ends); it deletes its own files, and every other writer's records read
/// back.
fn a_budget_held_by_open_writers_is_a_typed_error_and_the_rest_lose_nothing(backend: BackendKind) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let budget = 64 << 10;
    let engine =
        Engine::open(budget_cfg(dir.path(), backend, WriteMode::Buffered, budget)).unwrap();
    let task = engine.task("full").unwrap();
    let mut ok = Vec::new();
    let mut err = None;
    for i in 0..WRITERS {
        let mut w = task.writer().unwrap();
        match w.write_slice(&record(i as u64, 100)) {
            Ok(()) => ok.push((i, w)),
            Err(e) => {
                err = Some(e);
                // The failed writer takes no more records.
                assert!(matches!(
                    w.write_slice(b"more"),
                    Err(SpillError::WriterFailed)
                ));
                break;
            }
        }
    }
    let e = err.expect("a 64 KiB budget cannot hold 64 writers' buffers");
    match &e {
        SpillError::BufferBudgetExhausted { budget: b, held } => {
            assert_eq!(*b, budget);
            assert!(*held <= budget && *held > budget / 2, "held {held}");
        }
        other => panic!("expected BufferBudgetExhausted, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("max_buffer_memory"), "{msg}");
    assert!(ok.len() >= 2 && ok.len() <= 16, "{} writers fit", ok.len());
    assert!(buffer_stats(&engine).peak <= budget);
    // Finishing one gives its buffer back: a new writer fits again.
    let (i0, w0) = ok.remove(0);
    let s0 = w0.finish().unwrap();
    assert_eq!(read_all(&s0), vec![record(i0 as u64, 100)]);
    let mut again = task.writer().unwrap();
    again.write_slice(&record(999, 100)).unwrap();
    let mut states = vec![(999, again.finish().unwrap())];
    for (i, w) in ok {
        states.push((i, w.finish().unwrap()));
    }
    for (i, s) in &states {
        assert_eq!(read_all(s), vec![record(*i as u64, 100)], "writer {i}");
    }
    drop((s0, states));
    task.close();
    assert_clean(&engine, dir.path());
}

/// 64 direct-mode writers with 16 MiB segments, 256 KiB each: the disk they hold while open
/// is one 1 MiB first step each, not 64 whole segments (1 GiB; 4 GiB at the default size).
fn direct_disk_held_by_small_writers_is_proportional_to_their_data(backend: BackendKind) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), backend)
            .mode(WriteMode::Direct)
            .segment_size(16 << 20)
            .io_buffer_size(64 << 10),
    )
    .unwrap();
    let task = engine.task("disk").unwrap();
    let mut ws: Vec<_> = (0..WRITERS).map(|_| task.writer().unwrap()).collect();
    let per = 64;
    for k in 0..per {
        for (i, w) in ws.iter_mut().enumerate() {
            w.write_slice(&record((i * 1000 + k) as u64, 4000)).unwrap();
        }
    }
    let held = disk_held(dir.path());
    let data = (WRITERS * per * 4000) as u64;
    assert!(
        held <= WRITERS as u64 * (1 << 20) + (1 << 20),
        "{held} bytes held for {data} bytes of data"
    );
    assert!(held >= data, "{held} < {data}");
    let states: Vec<_> = ws.into_iter().map(|w| w.finish().unwrap()).collect();
    // `finish` trims each segment to its written blocks.
    let after = disk_held(dir.path());
    assert!(
        after < data + WRITERS as u64 * 8192,
        "{after} after finish, {data} written"
    );
    for (i, s) in states.iter().enumerate() {
        assert_eq!(read_all(s).len(), per, "writer {i}");
    }
    drop(states);
    task.close();
    assert_clean(&engine, dir.path());
}

/// One direct-mode writer writes 5 MiB into a 16 MiB segment, blocking, then another with
/// `write_async`: each segment's file is allocated in steps (1, 2, 4, 8 MiB), never the whole
/// 16 MiB, every record reads back, and `finish` trims the file to its written blocks.
fn a_segment_grows_in_steps_blocking_and_async_and_is_trimmed(backend: BackendKind) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), backend)
            .mode(WriteMode::Direct)
            .segment_size(16 << 20)
            .io_buffer_size(256 << 10),
    )
    .unwrap();
    let task = engine.task("grow").unwrap();
    let recs = 5 * 64; // 16 KiB records: 5 MiB
    let mut w = task.writer().unwrap();
    let mut max_size = 0;
    for k in 0..recs {
        w.write_slice(&record(k, 16 << 10)).unwrap();
        max_size = max_size.max(disk_held(dir.path()));
    }
    assert!(
        max_size <= (8 << 20) + SLACK,
        "blocking: {max_size} bytes held for 5 MiB"
    );
    let s1 = w.finish().unwrap();
    let trimmed = disk_held(dir.path());
    assert!(trimmed < (5 << 20) + (64 << 10), "{trimmed} after finish");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut max_async = 0;
    let s2 = rt.block_on(async {
        let mut w = task.writer().unwrap();
        for k in 0..recs {
            w.write_async(Bytes::from(record(k, 16 << 10)))
                .await
                .unwrap();
            max_async = max_async.max(disk_held(dir.path()) - trimmed);
        }
        w.finish_async().await.unwrap()
    });
    assert!(
        max_async <= (8 << 20) + SLACK,
        "async: {max_async} bytes held for 5 MiB"
    );
    assert!(
        max_async >= 5 << 20,
        "async: {max_async} bytes held for 5 MiB"
    );
    for s in [&s1, &s2] {
        let got = read_all(s);
        assert_eq!(got.len(), recs as usize);
        assert_eq!(got[recs as usize - 1], record(recs - 1, 16 << 10));
    }
    drop((s1, s2));
    task.close();
    assert_clean(&engine, dir.path());
}

/// Buffered mode with `preallocate`: the same steps, the file size kept to what was written.
fn preallocate_allocates_in_steps_too(backend: BackendKind) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let engine = Engine::open(
        cfg(dir.path(), backend)
            .preallocate(true)
            .segment_size(16 << 20)
            .io_buffer_size(256 << 10),
    )
    .unwrap();
    let task = engine.task("prealloc").unwrap();
    let mut w = task.writer().unwrap();
    let mut max_held = 0;
    for k in 0..64u64 {
        w.write_slice(&record(k, 16 << 10)).unwrap();
        max_held = max_held.max(disk_held(dir.path()));
    }
    assert!(
        max_held <= (2 << 20) + SLACK,
        "{max_held} bytes held for 1 MiB"
    );
    assert!(max_held >= 1 << 20, "{max_held}: not preallocated");
    let s = w.finish().unwrap();
    assert_eq!(read_all(&s).len(), 64);
    drop(s);
    task.close();
    assert_clean(&engine, dir.path());
}

/// `max_buffer_memory` below `io_buffer_size` or above 1 TiB is refused naming the field; its
/// default works with the largest `io_buffer_size`.
#[test]
fn max_buffer_memory_is_validated_and_its_default_fits_every_io_buffer_size() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [512 << 10, usize::MAX] {
        let r = EngineConfig::new(dir.path())
            .io_buffer_size(1 << 20)
            .max_buffer_memory(bad as u64)
            .validate();
        match r {
            Err(SpillError::InvalidConfig { field, .. }) => assert_eq!(field, "max_buffer_memory"),
            other => panic!("{bad}: expected InvalidConfig, got {other:?}"),
        }
    }
    EngineConfig::new(dir.path())
        .io_buffer_size(64 << 20)
        .validate()
        .unwrap();
    EngineConfig::new(dir.path())
        .max_buffer_memory(1 << 20)
        .validate()
        .unwrap();
}

/// Only a writer's first segment grows in steps: once a writer filled a segment it is a long
/// spill, and each later segment is allocated whole at its creation (one `fallocate`, not a
/// doubling series that contends with the segment's writes for the inode lock).
fn a_long_writers_later_segments_are_allocated_whole(backend: BackendKind) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let seg: u64 = 8 << 20;
    let engine = Engine::open(
        cfg(dir.path(), backend)
            .mode(WriteMode::Direct)
            .segment_size(seg)
            .io_buffer_size(256 << 10),
    )
    .unwrap();
    let task = engine.task("long").unwrap();
    let mut w = task.writer().unwrap();
    // The first segment starts small.
    w.write_slice(&record(0, 16 << 10)).unwrap();
    let first = disk_held(dir.path());
    assert!(
        first < (2 << 20) + SLACK,
        "first segment at its start: {first}"
    );
    // Fill it, and one record into the second.
    let mut k = 1;
    while w.segments() < 2 {
        w.write_slice(&record(k, 16 << 10)).unwrap();
        k += 1;
    }
    let held = disk_held(dir.path());
    // The first segment (about 8 MiB written) plus the second allocated whole.
    assert!(
        held >= 2 * seg - (1 << 20),
        "the second segment was not allocated whole: {held} bytes held"
    );
    assert!(held <= 2 * seg + (1 << 20) + SLACK, "{held} bytes held");
    let st = w.finish().unwrap();
    assert_eq!(read_all(&st).len() as u64, k);
    drop(st);
    task.close();
    assert_clean(&engine, dir.path());
}
