//! Publishing hands files to the caller for good; files are private and a planted symlink
//! cannot redirect a write; the public handles are Send/Sync as executors need.

#[macro_use]
mod common;
use common::*;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use spillring::{
    BackendKind, Bytes, Engine, SpillError, SpillReader, SpillWriter, SpilledState, TaskSpill,
};

per_backend!(
    publish_moves_the_files_to_the_caller_and_the_engine_forgets_them,
    files_are_private_and_a_planted_symlink_is_not_followed,
);

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Engine>();
    send_sync::<TaskSpill>();
    send_sync::<SpilledState>();
    send::<SpillWriter>();
    send::<SpillReader>();
}

fn publish_moves_the_files_to_the_caller_and_the_engine_forgets_them(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir_in(dir.path()).unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    let task = engine.task("publish").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..200 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    let st = w.finish().unwrap();
    let n = st.segments();
    // Not while another grant is alive.
    let r = st.reader().unwrap();
    let st2 = st.clone();
    assert!(matches!(
        st2.publish(dest.path(), "out"),
        Err(SpillError::StateShared { grants: 3 })
    ));
    drop((r, st2));
    let paths = st.publish(dest.path(), "out").unwrap();
    assert!(matches!(st.reader(), Err(SpillError::Closed { .. })));
    drop(st);
    assert_eq!(paths.len(), n);
    assert_eq!(
        engine.metrics().tickets_used,
        0,
        "published files hold no ticket"
    );
    // Closing the scope and the engine deletes nothing of them.
    task.close();
    assert!(engine.settle(std::time::Duration::from_secs(5)));
    let m = engine.metrics();
    assert_eq!(m.files_published, n as u64);
    assert_eq!(m.files_deleted, 0);
    drop((task, engine));
    let mut got = 0;
    for p in &paths {
        let data = std::fs::read(p).unwrap();
        let h = spillring::segment::parse_header(&data).unwrap();
        assert_eq!(h.segment as usize, got);
        got += 1;
    }
    assert_eq!(got, n);
    // The engine's own directories are gone; only the caller's files remain.
    let left: Vec<_> = files_under(dir.path());
    assert_eq!(left.len(), n);
    assert!(left.iter().all(|p| p.starts_with(dest.path())));
}

#[test]
fn a_published_direct_mode_file_holds_exactly_what_was_written() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let dest = tempfile::tempdir_in(dir.path()).unwrap();
    let engine = Engine::open(
        cfg(dir.path(), spillring::BackendKind::Uring)
            .mode(spillring::WriteMode::Direct)
            .segment_size(64 << 10),
    )
    .unwrap();
    let task = engine.task("publish-direct").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..100 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    let st = w.finish().unwrap();
    let paths = st.publish(dest.path(), "d").unwrap();
    // 64 records fill the first segment, 36 the second: header, block header, framed records,
    // and the block's recorded padding to 4 KiB (format v2: every direct-mode block ends
    // aligned; nothing past the last block).
    let lens: Vec<u64> = paths
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    assert_eq!(
        lens,
        vec![
            (64u64 + 64 + 64 * 1008).next_multiple_of(4096),
            (64u64 + 64 + 36 * 1008).next_multiple_of(4096)
        ]
    );
    drop(st);
    task.close();
    assert!(engine.settle(std::time::Duration::from_secs(5)));
}

#[test]
fn publish_into_a_missing_destination_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), spillring::BackendKind::Uring);
    let task = engine.task("publish-bad").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from_static(b"keep me")).unwrap();
    let st = w.finish().unwrap();
    let missing = dir.path().join("does-not-exist");
    // A bad destination or prefix changes nothing: the state keeps its files.
    let e = st.publish(&missing, "x").unwrap_err();
    assert!(matches!(e, SpillError::Io { .. }), "{e}");
    let e = st.publish(dir.path(), "a/b").unwrap_err();
    assert!(
        matches!(
            e,
            SpillError::InvalidName {
                what: "publish prefix",
                ..
            }
        ),
        "{e}"
    );
    // A destination on which the rename fails (a file in the way is never replaced).
    let dest = tempfile::tempdir_in(dir.path()).unwrap();
    std::fs::write(dest.path().join("x-000000.bin"), b"theirs").unwrap();
    let e = st.publish(dest.path(), "x").unwrap_err();
    assert!(matches!(e, SpillError::PublishFailed { .. }), "{e}");
    assert_eq!(
        std::fs::read(dest.path().join("x-000000.bin")).unwrap(),
        b"theirs"
    );
    drop(dest);
    let mut r = st.reader().unwrap();
    assert_eq!(&r.next_record().unwrap().unwrap()[..], b"keep me");
    drop((r, st));
    task.close();
    assert_clean(&engine, dir.path());
}

fn files_are_private_and_a_planted_symlink_is_not_followed(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(cfg(dir.path(), b).segment_size(64 << 10)).unwrap();
    let task = engine.task("private").unwrap();
    let mut w = task.writer().unwrap();
    w.write(Bytes::from(record(0, 1000))).unwrap();
    // Segments live flat in the engine's private process directory.
    let pd = engine.process_dirs()[0].clone();
    let tdir = pd.clone();
    assert_eq!(
        std::fs::metadata(&pd).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let seg0 = tdir.join("spill-segment-000000.bin");
    let meta = std::fs::metadata(&seg0).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), unsafe_free_uid());
    // Someone plants a symlink where the next segment will be created.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, tdir.join("spill-segment-000001.bin")).unwrap();
    let err = (1..1000)
        .find_map(|i| w.write(Bytes::from(record(i, 1000))).err())
        .unwrap();
    match &err {
        SpillError::Io { op, source, .. } => {
            assert_eq!(*op, "create");
            assert_eq!(source.raw_os_error(), Some(libc::EEXIST), "{err}");
        }
        other => panic!("want Io(create, EEXIST), got {other}"),
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    drop(w);
    std::fs::remove_file(tdir.join("spill-segment-000001.bin")).unwrap();
    std::fs::remove_file(&victim).unwrap();
    task.close();
    assert_clean(&engine, dir.path());
}

fn unsafe_free_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}
