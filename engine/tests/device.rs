//! Real device failures: a full tmpfs (ENOSPC), a read-only root (EROFS), and a spill
//! directory removed under a running writer. Each tmpfs lives in a private mount namespace of
//! the test's own thread (CI runs as root; without CAP_SYS_ADMIN these tests fail, loudly).

#[macro_use]
mod common;
use common::*;

use std::path::{Path, PathBuf};

use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, SpillError, WriteMode};

per_backend!(
    spill_directory_removed_under_a_writer,
    space_is_back_when_storage_full_returns_buffered,
    space_is_back_when_storage_full_returns_direct,
    space_is_back_when_storage_full_returns_async,
);

fn fill_until_error(engine: &Engine, id: &str) -> (SpillError, u64) {
    let task = engine.task(id).unwrap();
    let mut w = task.writer().unwrap();
    let mut i = 0u64;
    loop {
        if let Err(e) = w.write(Bytes::from(record(i, 64 << 10))) {
            return (e, i);
        }
        i += 1;
        assert!(i < 10_000, "a 4 MiB tmpfs took 640 MiB");
    }
}

fn serves_another_task(engine: &Engine) {
    let task = engine.task("healthy").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..16 {
        w.write(Bytes::from(record(i, 32 << 10))).unwrap();
    }
    let st = w.finish().unwrap();
    let mut r = st.reader().unwrap();
    for i in 0..16 {
        assert_eq!(
            &r.next_record().unwrap().unwrap()[..],
            &record(i, 32 << 10)[..]
        );
    }
    drop((r, st));
    task.close();
}

fn enospc(backend: spillring::BackendKind, mode: WriteMode, preallocate: bool) {
    let _serial = serial();
    let (_holder, root) = private_tmpfs("4m", false);
    let engine = Engine::open(
        cfg(&root, backend)
            .mode(mode)
            .segment_size(1 << 20)
            .preallocate(preallocate),
    )
    .unwrap();
    let fds = fd_count();
    let (err, written) = fill_until_error(&engine, "filler");
    assert!(err.is_storage_full(), "want StorageFull, got: {err}");
    let msg = err.to_string();
    assert!(
        msg.contains("storage full") && msg.contains("No space left"),
        "{msg}"
    );
    // Preallocation (always on in direct mode) makes a full disk fail at a rotation, never
    // mid-record.
    let at_rotation = preallocate || mode == WriteMode::Direct;
    if at_rotation {
        assert!(msg.contains("preallocate"), "{msg}");
    }
    assert!(written > 0);
    // Everything the failed writer created is gone, and the engine keeps serving.
    assert!(engine.settle(Duration::from_secs(10)));
    assert_eq!(files_under(&root), Vec::<PathBuf>::new());
    serves_another_task(&engine);
    let m = assert_clean(&engine, &root);
    if at_rotation {
        // The allocation at the rotation failed; no write did.
        assert_eq!(m.write_failures, 0, "{m:?}");
    } else {
        assert!(m.write_failures >= 1, "{m:?}");
    }
    assert_fds_back_to(fds);
}

#[test]
fn enospc_buffered_uring() {
    enospc(spillring::BackendKind::Uring, WriteMode::Buffered, false);
}

#[test]
fn enospc_buffered_psync() {
    enospc(spillring::BackendKind::Psync, WriteMode::Buffered, false);
}

#[test]
fn enospc_direct_uring() {
    enospc(spillring::BackendKind::Uring, WriteMode::Direct, false);
}

#[test]
fn enospc_direct_psync() {
    enospc(spillring::BackendKind::Psync, WriteMode::Direct, false);
}

#[test]
fn enospc_preallocated_fails_at_rotation() {
    enospc(spillring::BackendKind::Uring, WriteMode::Buffered, true);
}

#[test]
fn read_only_root_is_a_typed_error() {
    let (_holder, root) = private_tmpfs("1m", true);
    let e = Engine::open(cfg(&root, spillring::BackendKind::Psync)).unwrap_err();
    match &e {
        SpillError::Io { source, path, .. } => {
            assert_eq!(source.raw_os_error(), Some(libc::EROFS), "{e}");
            assert!(path.starts_with(&root), "{e}");
        }
        other => panic!("want Io(EROFS), got {other}"),
    }
}

fn spill_directory_removed_under_a_writer(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    let task = engine.task("removed").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..100 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    // An operator (or a bug elsewhere) removes the engine's process directory, where the
    // segments live.
    let pd = &engine.process_dirs()[0];
    std::fs::remove_dir_all(pd).unwrap();
    let err = loop {
        if let Err(e) = w.write(Bytes::from(record(1, 1000))) {
            break e;
        }
    };
    match &err {
        SpillError::Io { op, source, .. } => {
            assert_eq!(*op, "create", "{err}");
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{err}");
        }
        other => panic!("want Io(create, ENOENT), got {other}"),
    }
    // The engine never re-creates the deleted directory; the files the writer had are
    // "already absent", which releases their tickets.
    drop(w);
    task.close();
    let m = assert_clean(&engine, dir.path());
    assert!(m.files_already_absent >= 1, "{m:?}");
    assert!(!Path::new(pd).exists());
}

/// Bytes the filesystem holding `p` has free for an unprivileged writer.
fn free_bytes(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: statvfs is plain old data; all zeros is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and an out-struct of the right type; checked.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s.f_bavail * s.f_frsize
}

/// How a write call is made: blocking, or `write_async` on a current-thread runtime.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Call {
    Blocking,
    Async,
}

/// Fills a 4 MiB tmpfs until `StorageFull`; asserts that when the error returns, the failed
/// writer's files are gone and their space is back (no settle, no sleep), and that an
/// immediate retry of half as many bytes on the same filesystem succeeds. `unlink_delay`
/// holds each unlink on the I/O thread that long (the fault plan), so a writer that returns
/// before its deletes completed is caught every time, not only when the reaper is slow.
/// Before the fix, the error returned with every file still there (the deletes were queued,
/// and the fds closed on the reaper 10-25 ms later) and the retry failed with `StorageFull`.
fn space_is_back_when_storage_full_returns(b: BackendKind, mode: WriteMode, call: Call) {
    for unlink_delay in [None, Some(Duration::from_millis(30))] {
        let (_holder, root) = private_tmpfs("4m", false);
        let plan = spillring::FaultPlan::new(3);
        if let Some(d) = unlink_delay {
            plan.arm(
                spillring::FaultPoint::IoUnlink,
                spillring::FaultAction::Delay(d),
                spillring::Trigger::Always,
            );
        }
        let engine = Engine::open(
            cfg(&root, b)
                .mode(mode)
                .segment_size(1 << 20)
                .fault_plan(plan),
        )
        .unwrap();
        let empty = free_bytes(&root);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let write = |w: &mut spillring::SpillWriter, i: u64| match call {
            Call::Blocking => w.write(Bytes::from(record(i, 64 << 10))),
            Call::Async => rt.block_on(w.write_async(Bytes::from(record(i, 64 << 10)))),
        };
        let task = engine.task("filler").unwrap();
        let mut w = task.writer().unwrap();
        let mut written = 0u64;
        let err = loop {
            if let Err(e) = write(&mut w, written) {
                break e;
            }
            written += 1;
            assert!(written < 10_000, "a 4 MiB tmpfs took 640 MiB");
        };
        let files_left = files_under(&root).len();
        let free = free_bytes(&root);
        assert!(err.is_storage_full(), "want StorageFull, got: {err}");
        assert!(written > 8, "{written} records before the error");
        assert_eq!(
            files_left, 0,
            "{mode:?} {call:?} unlink delay {unlink_delay:?}: the failed writer's files are still there when StorageFull returns"
        );
        assert!(
            free + (64 << 10) >= empty,
            "{mode:?} {call:?} unlink delay {unlink_delay:?}: {free} bytes free when StorageFull returns, {empty} before the spill"
        );
        drop(w);
        // An immediate retry of half as much on the same filesystem.
        let mut w = task.writer().unwrap();
        for i in 0..written / 2 {
            write(&mut w, i).unwrap_or_else(|e| {
                panic!(
                    "{mode:?} {call:?}: retry record {i} of {}: {e}",
                    written / 2
                )
            });
        }
        let st = w.finish().unwrap();
        assert_eq!(st.records(), written / 2);
        drop((st, task));
        assert_clean(&engine, &root);
    }
}

fn space_is_back_when_storage_full_returns_buffered(b: BackendKind) {
    space_is_back_when_storage_full_returns(b, WriteMode::Buffered, Call::Blocking);
}

fn space_is_back_when_storage_full_returns_direct(b: BackendKind) {
    space_is_back_when_storage_full_returns(b, WriteMode::Direct, Call::Blocking);
}

fn space_is_back_when_storage_full_returns_async(b: BackendKind) {
    for mode in both_modes() {
        space_is_back_when_storage_full_returns(b, mode, Call::Async);
    }
}
