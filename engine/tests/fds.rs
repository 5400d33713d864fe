//! Bounded fds (invariant 11): the segment fds open writers hold are bounded by
//! `max_open_files`; an idle writer's fd is closed for another and reopened by name at its next
//! write, in both write modes, with every record intact; a cancel of a writer whose fd was
//! closed deletes its files once and the writer sees `Aborted`. EMFILE never reaches a caller
//! raw: the engine closes an idle fd of its own and retries, and with none to close the create
//! is a typed `TooManyOpenFiles` that leaves the writer usable. 10,000 open spills (writers,
//! then held states, then readers mid-read) run under an `RLIMIT_NOFILE` far below 10,000.

#[macro_use]
mod common;
use common::*;

use std::path::Path;
use std::time::Duration;

use spillring::testing::fd_stats;
use spillring::{
    BackendKind, Bytes, Engine, FaultPlan, FaultPoint, SpillError, SpillReader, WriteMode,
};

per_backend!(
    emfile_at_a_segment_create_is_typed_and_the_writer_survives,
    emfile_from_the_os_closes_an_idle_fd_and_the_create_goes_on,
    eviction_and_reopen_keep_every_record_in_both_modes,
    cancel_of_a_writer_whose_fd_was_evicted_deletes_its_files_once,
    cancels_racing_reopens_leave_nothing_and_never_say_not_found,
    a_cancel_under_a_reopen_is_aborted_and_deletes_once,
    ten_thousand_open_spills_under_a_lowered_nofile_limit,
    sealed_segments_keep_their_fds_within_the_bound_and_close_them_with_their_deletes,
    the_engine_leaves_the_host_half_of_a_low_soft_nofile_limit,
);

/// Sets the soft `RLIMIT_NOFILE` to `soft`; returns the previous limits.
fn set_nofile(soft: u64) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with valid pointers to live rlimit values; results checked.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &new), 0);
    }
    old
}

fn restore_nofile(old: libc::rlimit) {
    // SAFETY: as in `set_nofile`.
    unsafe {
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &old), 0);
    }
}

/// The lowest descriptor number free now (the one the next open gets).
fn lowest_free_fd() -> u64 {
    // SAFETY: dup of stderr (open for the whole test) and a close of the fd it returned.
    unsafe {
        let fd = libc::dup(2);
        assert!(fd >= 0, "dup: {}", std::io::Error::last_os_error());
        libc::close(fd);
        fd as u64
    }
}

/// Restores the `RLIMIT_NOFILE` it was made with when dropped (also when a test panics).
struct NofileGuard(libc::rlimit);

impl NofileGuard {
    fn set(soft: u64) -> Self {
        NofileGuard(set_nofile(soft))
    }
}

impl Drop for NofileGuard {
    fn drop(&mut self) {
        restore_nofile(self.0);
    }
}

/// An engine whose lanes and reaper are warm, so the fds taken below are segments' only.
fn warm(engine: &Engine) {
    let task = engine.task("warm").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from(record(0, 100))).unwrap();
    let st = w.finish().unwrap();
    let recs: Vec<_> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 1);
    drop((recs, st));
    task.close();
    assert!(engine.settle(Duration::from_secs(10)));
}

/// With no descriptor left at all and no fd of its own to close, a segment create is a typed
/// `TooManyOpenFiles`; nothing is created and the writer stays usable.
fn emfile_at_a_segment_create_is_typed_and_the_writer_survives(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    warm(&engine);
    let task = engine.task("fds").unwrap();
    let mut w = task.writer().unwrap();
    // Every descriptor number below the limit is taken: none is left.
    let guard = NofileGuard::set(lowest_free_fd());
    let e = w
        .write(Bytes::from(record(1, 100)))
        .expect_err("no descriptor is left: the create must be refused");
    let files = segment_files(dir.path());
    drop(guard);
    assert!(
        matches!(
            &e,
            SpillError::TooManyOpenFiles { op: "create", source, .. }
                if source.raw_os_error() == Some(libc::EMFILE)
        ),
        "want TooManyOpenFiles(create, EMFILE), got {e}"
    );
    assert_eq!(files, 0, "a refused create leaves no file");
    w.write(Bytes::from(record(1000, 100)))
        .expect("the writer stays usable after TooManyOpenFiles");
    let st = w.finish().unwrap();
    let recs: Vec<_> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 1, "only the retried record was written");
    assert_eq!(&recs[0][..], &record(1000, 100)[..]);
    drop((recs, st));
    task.close();
    assert_clean(&engine, dir.path());
}

/// Under a soft limit of a few descriptors (far below `max_open_files`), EMFILE from the OS
/// makes the engine close an idle writer's fd and retry: 64 writers all open, write, and read
/// back (this is the case that was `TooManyOpenFiles` at the 7th writer before the bound).
fn emfile_from_the_os_closes_an_idle_fd_and_the_create_goes_on(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    warm(&engine);
    let task = engine.task("fds").unwrap();
    let base = fd_count();
    let guard = NofileGuard::set((base + 6) as u64);
    let mut writers = Vec::new();
    for i in 0..64u64 {
        let mut w = task.writer().unwrap();
        w.write(Bytes::from(record(i, 100)))
            .unwrap_or_else(|e| panic!("writer {i}: {e}"));
        writers.push(w);
    }
    // A second record each: every writer but the last few reopens its segment.
    for (i, w) in writers.iter_mut().enumerate() {
        w.write(Bytes::from(record(100 + i as u64, 100)))
            .unwrap_or_else(|e| panic!("writer {i}, second record: {e}"));
    }
    let states: Vec<_> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
    for (i, st) in states.iter().enumerate() {
        let recs: Vec<_> = st.reader().unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), 2, "state {i}");
        assert_eq!(&recs[0][..], &record(i as u64, 100)[..]);
        assert_eq!(&recs[1][..], &record(100 + i as u64, 100)[..]);
    }
    drop(guard);
    assert!(
        fd_stats(&engine).evictions >= 58,
        "idle fds were closed for the others: {:?}",
        fd_stats(&engine)
    );
    drop(states);
    task.close();
    assert_clean(&engine, dir.path());
}

/// Eight writers interleaved under `max_open_files(2)`: each write finds its fd closed by the
/// others and reopens it (staged and vectored writes, rotations); every record reads back in
/// both write modes, and no more than the bound is ever open.
fn eviction_and_reopen_keep_every_record_in_both_modes(b: BackendKind) {
    for mode in [WriteMode::Buffered, WriteMode::Direct] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(
            cfg(dir.path(), b)
                .mode(mode)
                .segment_size(64 << 10)
                .io_buffer_size(8 << 10)
                .large_record_threshold(16 << 10)
                .max_open_files(2),
        )
        .unwrap();
        warm(&engine);
        let base = fd_count();
        let task = engine.task("evict").unwrap();
        let mut writers: Vec<_> = (0..8).map(|_| task.writer().unwrap()).collect();
        // Record i is written by writer i % 8 in round i / 8: each writer gets every length.
        let len = |i: u64| [100, 3000, 20 << 10, 5][((i / 8 + i % 8) % 4) as usize];
        let mut peak = 0;
        for round in 0..24u64 {
            for (w_i, w) in writers.iter_mut().enumerate() {
                let i = round * 8 + w_i as u64;
                w.write(Bytes::from(record(i, len(i))))
                    .unwrap_or_else(|e| panic!("{mode:?} write {i}: {e}"));
                peak = peak.max(fd_stats(&engine).open);
            }
        }
        let fds_while_open = fd_count();
        let states: Vec<_> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
        let st = fd_stats(&engine);
        assert!(peak <= 2, "{mode:?}: {peak} counted fds open, bound 2");
        assert!(
            fds_while_open <= base + 2 + 2,
            "{mode:?}: {fds_while_open} fds with 8 open writers, {base} before"
        );
        assert!(st.evictions >= 8 * 20, "{mode:?}: {st:?}");
        for (w_i, s) in states.iter().enumerate() {
            assert!(s.segments() > 1, "{mode:?}: the writers rotated");
            let recs: Vec<_> = s.reader().unwrap().map(|r| r.unwrap()).collect();
            assert_eq!(recs.len(), 24, "{mode:?} writer {w_i}");
            for (round, r) in recs.iter().enumerate() {
                let i = round as u64 * 8 + w_i as u64;
                assert_eq!(&r[..], &record(i, len(i))[..], "{mode:?} record {i}");
            }
        }
        drop(states);
        task.close();
        assert_clean(&engine, dir.path());
    }
}

/// Fds open in this process that point into `dir` (deleted files included).
fn fds_into(dir: &Path) -> usize {
    fd_paths()
        .iter()
        .filter(|(_, t)| t.starts_with(dir))
        .count()
}

/// A sealed segment keeps its writer's fd (its reader and the pool's next writer use it, no
/// open by name), inside the same `max_open_files` bound: states whose fds the bound closed
/// read by name. Every kept fd closes with its file's delete, so no deleted file stays open
/// (its blocks would stay allocated).
fn sealed_segments_keep_their_fds_within_the_bound_and_close_them_with_their_deletes(
    b: BackendKind,
) {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(
            cfg(dir.path(), b)
                .mode(mode)
                .segment_size(64 << 10)
                .max_open_files(3),
        )
        .unwrap();
        warm(&engine);
        // The engine's own directory fds under the root.
        let base = fds_into(dir.path());
        let task = engine.task("kept").unwrap();
        let states: Vec<_> = (0..8u64)
            .map(|s| {
                let mut w = task.writer().unwrap();
                // Two segments each.
                for k in 0..2 {
                    w.write(Bytes::from(record(s * 2 + k, 40 << 10))).unwrap();
                }
                let st = w.finish().unwrap();
                assert_eq!(st.segments(), 2);
                st
            })
            .collect();
        let kept = fds_into(dir.path()) - base;
        assert!(
            (1..=3).contains(&kept),
            "{mode:?}: {kept} fds kept by 16 sealed segments, bound 3"
        );
        for (s, st) in states.iter().enumerate() {
            let recs: Vec<_> = st.reader().unwrap().map(|r| r.unwrap()).collect();
            assert_eq!(recs.len(), 2, "{mode:?} state {s}");
            for (k, r) in recs.iter().enumerate() {
                assert_eq!(&r[..], &record(s as u64 * 2 + k as u64, 40 << 10)[..]);
            }
            assert!(fds_into(dir.path()) - base <= 3, "{mode:?}: past the bound");
        }
        drop(states);
        // The released files went to the pool with their fds (within the bound); trimming it
        // deletes them, and their fds close.
        assert!(engine.settle(Duration::from_secs(10)));
        engine.trim_pool();
        task.close();
        assert!(engine.settle(Duration::from_secs(10)));
        let left = fds_into(dir.path()) - base;
        assert_eq!(left, 0, "{mode:?}: fds of deleted files stay open");
        assert_clean(&engine, dir.path());
    }
}

/// An engine whose writers share one segment fd (4 KiB staging buffers, 64 KiB segments),
/// warmed up.
fn one_fd_engine(dir: &Path, b: BackendKind) -> Engine {
    let engine = Engine::open(
        cfg(dir, b)
            .io_buffer_size(4096)
            .segment_size(64 << 10)
            .max_open_files(1),
    )
    .unwrap();
    warm(&engine);
    engine
}

/// A writer whose fd the bound closed is cancelled: the cancel deletes its files (once: the
/// reopen never creates), the writer's next write is `Aborted`, not a `NotFound` from the
/// reopen, and nothing is left.
fn cancel_of_a_writer_whose_fd_was_evicted_deletes_its_files_once(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_fd_engine(dir.path(), b);
    let deleted_before = engine.metrics().files_deleted;
    let task = engine.task("cancel").unwrap();
    let other = engine.task("other").unwrap();
    let mut a = task.writer().unwrap();
    a.write(Bytes::from(record(1, 6000))).unwrap();
    let mut b_w = other.writer().unwrap();
    // B's create takes the only fd: A's, idle, is closed.
    b_w.write(Bytes::from(record(2, 6000))).unwrap();
    let ev = fd_stats(&engine).evictions;
    assert!(ev >= 1, "A's fd was closed for B: {:?}", fd_stats(&engine));
    assert_eq!(segment_files(dir.path()), 2);
    task.cancel();
    assert!(engine.settle(Duration::from_secs(10)));
    assert_eq!(
        segment_files(dir.path()),
        1,
        "A's segment is deleted, B's kept"
    );
    let e = a
        .write(Bytes::from(record(3, 6000)))
        .expect_err("a write after the cancel");
    assert!(matches!(e, SpillError::Aborted), "want Aborted, got {e}");
    assert!(a.finish().is_err(), "an aborted writer does not finish");
    // B goes on (its fd may be reopened) and reads back.
    b_w.write(Bytes::from(record(4, 6000))).unwrap();
    let st = b_w.finish().unwrap();
    let recs: Vec<_> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(&recs[1][..], &record(4, 6000)[..]);
    drop((recs, st));
    other.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(
        m.files_deleted - deleted_before,
        2,
        "each file deleted once: {m:?}"
    );
    assert_eq!(m.files_already_absent, 0, "no second delete found it gone");
}

/// A cancel lands while a writer whose fd was closed is about to reopen its segment (paused at
/// `writer::reopen`, after its abort check): the cancel deletes the file, the reopen finds it
/// gone and the writer reports `Aborted`, never a NotFound; the file is deleted once.
fn a_cancel_under_a_reopen_is_aborted_and_deletes_once(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = one_fd_engine(dir.path(), b);
    let deleted_before = engine.metrics().files_deleted;
    let task = engine.task("reopen").unwrap();
    let other = engine.task("other").unwrap();
    let plan = FaultPlan::new(7);
    task.set_fault_plan(plan.clone());
    let mut a = task.writer().unwrap();
    a.write(Bytes::from(record(1, 100))).unwrap();
    let mut b_w = other.writer().unwrap();
    b_w.write(Bytes::from(record(2, 100))).unwrap();
    assert!(fd_stats(&engine).evictions >= 1, "A's fd was closed for B");
    let pause = plan.pause_once(FaultPoint::WriterReopen);
    let h = std::thread::spawn(move || {
        let r = a.write(Bytes::from(record(3, 100)));
        (a, r)
    });
    assert!(pause.wait_reached(Duration::from_secs(10)), "A reopens");
    task.cancel();
    assert!(engine.settle(Duration::from_secs(10)));
    assert_eq!(segment_files(dir.path()), 1, "A's file is gone, B's kept");
    pause.release();
    let (a, r) = h.join().unwrap();
    assert!(
        matches!(r, Err(SpillError::Aborted)),
        "a reopen of a file the cancel deleted must be Aborted: {r:?}"
    );
    drop(a);
    drop(b_w.finish().unwrap());
    other.close();
    let m = assert_clean(&engine, dir.path());
    assert_eq!(
        m.files_deleted - deleted_before,
        2,
        "each file deleted once"
    );
    assert_eq!(m.files_already_absent, 0);
}

/// Threads write through a bound of 2 fds (so nearly every write reopens) while their scopes
/// are cancelled at random points: every write is `Ok` or `Aborted` (never an I/O error from
/// a reopen of a deleted file), and every file is deleted exactly once.
fn cancels_racing_reopens_leave_nothing_and_never_say_not_found(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        cfg(dir.path(), b)
            .io_buffer_size(4096)
            .segment_size(64 << 10)
            .max_open_files(2),
    )
    .unwrap();
    warm(&engine);
    let m0 = engine.metrics();
    for round in 0..20u64 {
        let tasks: Vec<_> = (0..4)
            .map(|t| engine.task(&format!("r{round}-{t}")).unwrap())
            .collect();
        std::thread::scope(|s| {
            for (t, task) in tasks.iter().enumerate() {
                s.spawn(move || {
                    let mut w = match task.writer() {
                        Ok(w) => w,
                        // Cancelled before the writer was made: every call on a cancelled
                        // scope says Aborted.
                        Err(SpillError::Aborted) => return,
                        Err(e) => panic!("round {round} writer {t}: {e}"),
                    };
                    for i in 0..40u64 {
                        match w.write(Bytes::from(record(i, 3000))) {
                            Ok(()) => {}
                            Err(SpillError::Aborted) => return,
                            Err(e) => panic!("round {round} writer {t} write {i}: {e}"),
                        }
                    }
                    match w.finish() {
                        Ok(st) => drop(st),
                        Err(SpillError::Aborted) => {}
                        Err(e) => panic!("round {round} writer {t} finish: {e}"),
                    }
                });
            }
            s.spawn(|| {
                std::thread::sleep(Duration::from_micros(200 * (round % 5)));
                for task in &tasks {
                    task.cancel();
                    std::thread::sleep(Duration::from_micros(300));
                }
            });
        });
    }
    let m = assert_clean(&engine, dir.path());
    assert_eq!(
        m.files_deleted - m0.files_deleted,
        m.segments_created - m0.segments_created,
        "every file deleted exactly once: {m:?}"
    );
}

/// Extra fds allowed on top of `max_open_files` during the 10,000-spill test: a reader's
/// transient open, a trim's, the reaper's lag.
const SLACK: usize = 16;

/// The issue-10 row: 10,000 writers that each wrote (one staged write submitted, a record
/// still staged), then their 10,000 held states, then 10,000 readers mid-read, under a soft
/// `RLIMIT_NOFILE` of the fds open now + `max_open_files` + 1,500 (before the bound, each
/// open writer held an fd and the 2,5xx-th `write` was refused). None is refused, the extra
/// fds stay within `max_open_files` + a small constant, every record reads back, and
/// everything is deleted after.
fn ten_thousand_open_spills_under_a_lowered_nofile_limit(b: BackendKind) {
    const N: usize = 10_000;
    const MAX: usize = 1024;
    let (_holder, root) = private_tmpfs("1g", false);
    let engine = Engine::open(
        cfg(&root, b)
            .io_buffer_size(4096)
            .segment_size(64 << 10)
            .max_open_files(MAX),
    )
    .unwrap();
    warm(&engine);
    let base = fd_count();
    let limit = base + MAX + 1500;
    let guard = NofileGuard::set(limit as u64);
    let task = engine.task("ten-thousand").unwrap();
    let rec = |w: usize, k: u64| record(w as u64 * 4 + k, if k == 0 { 3000 } else { 200 });
    let over = |what: &str| {
        let now = fd_count();
        assert!(
            now <= base + MAX + SLACK,
            "{what}: {} extra fds (bound {MAX})",
            now - base
        );
        now - base
    };
    let mut writers = Vec::with_capacity(N);
    let mut peak = 0;
    for w in 0..N {
        let mut wr = task
            .writer()
            .unwrap_or_else(|e| panic!("writer {w} refused: {e}"));
        // 3,000 + 200 + 200 bytes in a 4 KiB staging buffer: the third record flushes it.
        for k in 0..3 {
            wr.write(Bytes::from(rec(w, k)))
                .unwrap_or_else(|e| panic!("writer {w} record {k} refused: {e}"));
        }
        writers.push(wr);
        if w % 1000 == 999 {
            peak = peak.max(over("open writers"));
        }
    }
    assert_eq!(segment_files(&root), N);
    let states: Vec<_> = writers
        .into_iter()
        .enumerate()
        .map(|(w, wr)| {
            wr.finish()
                .unwrap_or_else(|e| panic!("finish of writer {w} refused: {e}"))
        })
        .collect();
    peak = peak.max(over("held states"));
    let mut readers: Vec<SpillReader> = Vec::with_capacity(N);
    for (w, st) in states.iter().enumerate() {
        let mut r = st
            .reader()
            .unwrap_or_else(|e| panic!("reader {w} refused: {e}"));
        let first = r.next_record().expect("read").expect("a record");
        assert_eq!(&first[..], &rec(w, 0)[..], "reader {w}");
        readers.push(r);
        if w % 1000 == 999 {
            peak = peak.max(over("readers mid-read"));
        }
    }
    for (w, r) in readers.iter_mut().enumerate() {
        for k in 1..3 {
            let got = r.next_record().expect("read").expect("a record");
            assert_eq!(&got[..], &rec(w, k)[..], "reader {w} record {k}");
        }
        assert!(
            r.next_record().expect("read").is_none(),
            "reader {w}: three records"
        );
    }
    drop(guard);
    eprintln!(
        "10,000 spills: peak {peak} extra fds (limit {limit}, {base} before), {:?}",
        fd_stats(&engine)
    );
    drop(readers);
    drop(states);
    task.close();
    assert_clean(&engine, &root);
}

/// Issue 25 item 4: under `ulimit -n 256` with the default `max_open_files` (1,024), the engine
/// holds at most half of the soft limit, so with 1,000 open writers the host's own opens
/// still succeed. (Before: the engine's fds filled the process up to the limit, and the
/// host's `File::open` failed with EMFILE.)
fn the_engine_leaves_the_host_half_of_a_low_soft_nofile_limit(b: BackendKind) {
    const SOFT: u64 = 256;
    let dir = tempfile::tempdir().unwrap();
    let _guard = NofileGuard::set(SOFT);
    let engine = Engine::open(
        cfg(dir.path(), b)
            .io_buffer_size(4096)
            .segment_size(64 << 10),
    )
    .unwrap();
    assert_eq!(
        spillring::testing::fd_stats(&engine).max,
        (SOFT / 2) as usize,
        "the bound at open: half the soft limit"
    );
    warm(&engine);
    let task = engine.task("host-headroom").unwrap();
    let mut writers = Vec::new();
    for w in 0..1000u64 {
        let mut wr = task.writer().unwrap_or_else(|e| panic!("writer {w}: {e}"));
        // 3,000 + 2 x 200 bytes in a 4 KiB staging buffer: the segment is created and written.
        for k in 0..3 {
            let len = if k == 0 { 3000 } else { 200 };
            wr.write(Bytes::from(record(w * 4 + k, len)))
                .unwrap_or_else(|e| panic!("writer {w} record {k}: {e}"));
        }
        writers.push(wr);
    }
    assert!(spillring::testing::fd_stats(&engine).open <= (SOFT / 2) as usize);
    // The host's own opens: 64 at once, all must succeed.
    let host: Vec<_> = (0..64)
        .map(|i| {
            std::fs::File::open("/proc/self/stat")
                .unwrap_or_else(|e| panic!("the host's open {i} failed: {e}"))
        })
        .collect();
    drop(host);
    let states: Vec<_> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
    for (i, st) in states.iter().enumerate() {
        assert_eq!(st.records(), 3, "state {i}");
    }
    drop(states);
    task.close();
    assert!(engine.settle(Duration::from_secs(30)));
}
