//! Real device failures: a full tmpfs (ENOSPC), a read-only root (EROFS), and a spill
//! directory removed under a running writer. Each tmpfs lives in a private mount namespace of
//! the test's own thread (CI runs as root; without CAP_SYS_ADMIN these tests fail, loudly).

#[macro_use]
mod common;
use common::*;

use std::path::{Path, PathBuf};

use std::time::Duration;

use spillring::{BackendKind, Bytes, Engine, SpillError, WriteMode};

per_backend!(spill_directory_removed_under_a_writer);

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
