//! Publish is all or nothing (issue 13, point 5), and a published file reads back without an
//! engine through `SegmentReader` (point 6).

#[macro_use]
mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tempfile::TempDir;

use spillring::{
    BackendKind, Bytes, Engine, FaultAction, FaultPlan, FaultPoint, PublishOptions, SegmentReader,
    SpillError, SpilledState, TaskSpill, Trigger,
};

per_backend!(
    a_taken_kth_name_moves_nothing_and_the_state_reads_on,
    a_name_taken_during_the_publish_is_refused_and_what_moved_comes_back,
    a_rename_failing_part_way_rolls_back,
    a_move_back_that_fails_strands_that_file_and_says_so,
    a_live_reader_or_clone_is_its_own_error,
    a_destination_on_another_filesystem_is_refused_with_exdev_explained,
    a_rename_across_mounts_rolls_back_with_exdev_explained,
    the_mode_is_the_callers_choice,
    published_files_read_back_equal_the_records,
    a_cancel_during_a_failing_publish_deletes_the_files,
    a_cancel_during_a_publish_that_succeeds_leaves_the_files_to_the_caller,
    bad_destinations_and_prefixes_change_nothing,
    reader_during_a_publish_that_rolls_back,
);

const T: Duration = Duration::from_secs(10);
/// Records of 1000 bytes (1008 framed), 64 KiB segments: 64 records a segment.
const RECS: u64 = 300;
const REC_LEN: usize = 1000;

/// A spill of `RECS` records in 64 KiB segments (5 of them).
fn spill(task: &TaskSpill) -> SpilledState {
    let mut w = task.writer().unwrap();
    for i in 0..RECS {
        w.write(Bytes::from(record(i, REC_LEN))).unwrap();
    }
    let st = w.finish().unwrap();
    assert_eq!(st.segments(), 5);
    st
}

/// Reads the whole state and checks every record.
fn read_all(st: &SpilledState) {
    let mut n = 0;
    for rec in st.reader().unwrap() {
        assert_eq!(rec.unwrap(), record(n, REC_LEN), "record {n}");
        n += 1;
    }
    assert_eq!(n, RECS);
}

/// Reads published files with `SegmentReader` and checks they hold exactly the records.
fn read_published(paths: &[PathBuf]) {
    let mut n = 0;
    for p in paths {
        for rec in SegmentReader::open(p).unwrap() {
            assert_eq!(rec.unwrap(), record(n, REC_LEN), "record {n}");
            n += 1;
        }
    }
    assert_eq!(n, RECS);
}

/// The rename after the first `skip` ones fails once with `errno`.
fn fail_rename(plan: &FaultPlan, errno: i32, skip: u64) {
    plan.arm(
        FaultPoint::PublishRename,
        FaultAction::Fail(errno),
        Trigger::After { skip, times: 1 },
    );
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn engine(root: &Path, b: BackendKind, plan: Option<std::sync::Arc<FaultPlan>>) -> Engine {
    let mut c = cfg(root, b).segment_size(64 << 10);
    if let Some(p) = plan {
        c = c.fault_plan(p);
    }
    Engine::open(c).unwrap()
}

/// What most tests start from: a root, a destination directory, a fault plan, an engine on the
/// root with 64 KiB segments and that plan, and a task scope.
type Setup = (TempDir, TempDir, Arc<FaultPlan>, Engine, TaskSpill);

fn setup(b: BackendKind, seed: u64, task: &str) -> Setup {
    let root = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(seed);
    let engine = engine(root.path(), b, Some(plan.clone()));
    let task = engine.task(task).unwrap();
    (root, dest, plan, engine, task)
}

/// The case: with one destination name taken, the publish moved segment 0 and deleted
/// the other four. Now it checks every name first: nothing moves, the error names the taken
/// path and all the targets, and the state reads on and can publish elsewhere.
fn a_taken_kth_name_moves_nothing_and_the_state_reads_on(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 0, "collide");
    let st = spill(&task);
    let taken = dest.path().join("out-000003.bin");
    std::fs::write(&taken, b"theirs").unwrap();
    let e = st.publish(dest.path(), "out").unwrap_err();
    match &e {
        SpillError::PublishFailed {
            path,
            targets,
            stranded,
            source,
        } => {
            assert_eq!(path, &taken);
            assert_eq!(targets.len(), 5);
            assert_eq!(targets[0], dest.path().join("out-000000.bin"));
            assert!(stranded.is_empty());
            assert_eq!(source.raw_os_error(), Some(libc::EEXIST));
        }
        other => panic!("want PublishFailed, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("out-000003.bin")
            && msg.contains("taken")
            && msg.contains("nothing was moved"),
        "{msg}"
    );
    assert_eq!(
        e.os_error().and_then(|s| s.raw_os_error()),
        Some(libc::EEXIST)
    );
    // Nothing moved, not even for a moment (no rename was tried), nothing was replaced,
    // nothing was deleted.
    assert_eq!(plan.reached(FaultPoint::PublishRename), 0);
    assert_eq!(names(dest.path()), ["out-000003.bin"]);
    assert_eq!(std::fs::read(&taken).unwrap(), b"theirs");
    assert_eq!(st.paths().len(), 5);
    assert!(st.paths().iter().all(|p| p.exists()));
    assert_eq!(engine.metrics().tickets_used, 5);
    read_all(&st);
    // The caller retries with another prefix (`publish` takes any `AsRef<Path>`, like
    // `EngineConfig::new`: a `String` here).
    let paths = st
        .publish(dest.path().display().to_string(), "retry")
        .unwrap();
    assert_eq!(paths.len(), 5);
    read_published(&paths);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// A real cause of a rename failing part way: the name is taken after the check (another
/// process creates it). `RENAME_NOREPLACE` refuses it, and the three files already moved are
/// moved back.
fn a_name_taken_during_the_publish_is_refused_and_what_moved_comes_back(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 1, "race");
    let st = std::sync::Arc::new(spill(&task));
    let before = st.paths();
    // Pause before the fourth rename (segments 0, 1 and 2 have moved).
    let pause = std::sync::Arc::new(spillring::PauseHandle::default());
    plan.arm(
        FaultPoint::PublishRename,
        FaultAction::Pause(pause.clone()),
        Trigger::After { skip: 3, times: 1 },
    );
    let s2 = st.clone();
    let d2 = dest.path().to_path_buf();
    let publisher = thread::spawn(move || s2.publish(&d2, "out"));
    assert!(pause.wait_reached(T));
    assert_eq!(
        names(dest.path()),
        ["out-000000.bin", "out-000001.bin", "out-000002.bin"]
    );
    std::fs::write(dest.path().join("out-000003.bin"), b"late").unwrap();
    pause.release();
    let e = publisher.join().unwrap().unwrap_err();
    assert!(
        matches!(&e, SpillError::PublishFailed { path, stranded, source, .. }
            if path.ends_with("out-000003.bin") && stranded.is_empty()
                && source.raw_os_error() == Some(libc::EEXIST)),
        "{e:?}"
    );
    assert_eq!(names(dest.path()), ["out-000003.bin"]);
    assert_eq!(
        std::fs::read(dest.path().join("out-000003.bin")).unwrap(),
        b"late"
    );
    assert_eq!(st.paths(), before, "the files are back where they were");
    read_all(&st);
    let st = std::sync::Arc::into_inner(st).unwrap();
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// A rename that fails with an I/O error part way (the fault hook): the files already moved
/// come back, the error says which rename failed, the state is whole and publishes on retry.
fn a_rename_failing_part_way_rolls_back(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 2, "eio");
    let st = spill(&task);
    fail_rename(&plan, libc::EIO, 2);
    let e = st.publish(dest.path(), "out").unwrap_err();
    assert!(
        matches!(&e, SpillError::PublishFailed { path, stranded, source, .. }
            if path.ends_with("out-000002.bin") && stranded.is_empty()
                && source.raw_os_error() == Some(libc::EIO)),
        "{e:?}"
    );
    // Two forward renames, the failed one, two moves back.
    assert_eq!(plan.reached(FaultPoint::PublishRename), 5);
    assert!(names(dest.path()).is_empty(), "{:?}", names(dest.path()));
    read_all(&st);
    assert_eq!(engine.metrics().files_published, 0);
    let paths = st.publish(dest.path(), "out").unwrap();
    read_published(&paths);
    assert_eq!(engine.metrics().files_published, 5);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// A second fault: the rename of segment 3 fails, and so does moving segment 2 back. Segment 2
/// stays at the destination, named in `stranded` (the caller's: it reads back), segments 0 and
/// 1 come back, and the state reads up to segment 2, where it fails with `Io`. With the pool
/// on, the stranded segment's name never goes to the pool (a reuse would find no file).
fn a_move_back_that_fails_strands_that_file_and_says_so(b: BackendKind) {
    let root = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new(3);
    let engine = Engine::open(
        pooled_cfg(root.path(), b)
            .segment_size(64 << 10)
            .fault_plan(plan.clone()),
    )
    .unwrap();
    let task = engine.task("strand").unwrap();
    let st = spill(&task);
    // Calls 0-2 move segments 0-2; call 3 (segment 3) and call 4 (moving segment 2 back) fail.
    plan.arm(
        FaultPoint::PublishRename,
        FaultAction::Fail(libc::EIO),
        Trigger::After { skip: 3, times: 2 },
    );
    let e = st.publish(dest.path(), "out").unwrap_err();
    let stranded_path = dest.path().join("out-000002.bin");
    match &e {
        SpillError::PublishFailed { path, stranded, .. } => {
            assert!(path.ends_with("out-000003.bin"), "{e:?}");
            assert_eq!(stranded, std::slice::from_ref(&stranded_path));
        }
        other => panic!("want PublishFailed, got {other:?}"),
    }
    assert!(e.to_string().contains("moving back failed"), "{e}");
    assert_eq!(names(dest.path()), ["out-000002.bin"]);
    // The stranded file is whole: records 128..192.
    let got: Vec<Bytes> = SegmentReader::open(&stranded_path)
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got.len(), 64);
    for (j, rec) in got.iter().enumerate() {
        assert_eq!(rec, &record(128 + j as u64, REC_LEN));
    }
    // The state reads segments 0 and 1, then fails at segment 2 (never wrong bytes).
    let mut r = st.reader().unwrap();
    for n in 0..128 {
        assert_eq!(r.next_record().unwrap().unwrap(), record(n, REC_LEN));
    }
    let e = r.next_record().unwrap_err();
    assert!(
        matches!(&e, SpillError::Io { op: "open", source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{e:?}"
    );
    drop((r, st));
    assert!(engine.settle(T));
    let m = engine.metrics();
    assert_eq!(m.tickets_used, m.pool_segments, "{m:?}");
    assert_eq!(
        m.pool_segments, 4,
        "the stranded segment went to the pool: {m:?}"
    );
    // Every pooled file is reused by the next spill: none is a name without a file.
    let st = spill(&task);
    read_all(&st);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
    // The stranded file stays the caller's.
    assert!(stranded_path.exists());
}

/// A reader or a clone alive: `StateShared` (publish needs the only grant), nothing changed.
fn a_live_reader_or_clone_is_its_own_error(b: BackendKind) {
    let (root, dest, _, engine, task) = setup(b, 0, "shared");
    let st = spill(&task);
    let mut r = st.reader().unwrap();
    assert_eq!(r.next_record().unwrap().unwrap(), record(0, REC_LEN));
    let e = st.publish(dest.path(), "out").unwrap_err();
    assert!(matches!(e, SpillError::StateShared { grants: 2 }), "{e:?}");
    assert!(e.to_string().contains("only grant"), "{e}");
    // The reader reads on.
    assert_eq!(r.next_record().unwrap().unwrap(), record(1, REC_LEN));
    drop(r);
    let c = st.clone();
    let e = st.publish(dest.path(), "out").unwrap_err();
    assert!(matches!(e, SpillError::StateShared { grants: 2 }), "{e:?}");
    drop(c);
    assert!(names(dest.path()).is_empty());
    let paths = st.publish(dest.path(), "out").unwrap();
    read_published(&paths);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// The root on the disk, the destination on a tmpfs (/dev/shm): `EXDEV` found before any
/// rename, with a message that says what it means and what to do.
fn a_destination_on_another_filesystem_is_refused_with_exdev_explained(b: BackendKind) {
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    let dest = tempfile::tempdir_in("/dev/shm").unwrap();
    let engine = engine(root.path(), b, None);
    let task = engine.task("xdev").unwrap();
    let st = spill(&task);
    let e = st.publish(dest.path(), "out").unwrap_err();
    match &e {
        SpillError::PublishCrossesFilesystems { dest: d, root: r } => {
            assert_eq!(d, dest.path());
            assert!(r.starts_with(root.path()), "{r:?}");
        }
        other => panic!("want PublishCrossesFilesystems, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("another filesystem")
            && msg.contains("EXDEV")
            && msg.contains("cannot cross filesystems")
            && msg.contains("nothing was moved"),
        "{msg}"
    );
    assert!(names(dest.path()).is_empty());
    read_all(&st);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// `EXDEV` from the rename itself (a bind mount of the same filesystem has the same device
/// number, so only the rename finds it; injected here): rolled back, the same variant.
fn a_rename_across_mounts_rolls_back_with_exdev_explained(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 4, "xdev2");
    let st = spill(&task);
    fail_rename(&plan, libc::EXDEV, 1);
    let e = st.publish(dest.path(), "out").unwrap_err();
    assert!(
        matches!(&e, SpillError::PublishCrossesFilesystems { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("EXDEV"), "{e}");
    assert!(names(dest.path()).is_empty());
    read_all(&st);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The published files get the caller's mode (the umask does not apply); the default is the
/// engine's 0600; a mode with other bits is refused; a failed publish gives the engine's files
/// their private mode back.
fn the_mode_is_the_callers_choice(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 7, "mode");

    let st = spill(&task);
    let e = st
        .publish_with(dest.path(), "out", PublishOptions::default().mode(0o4755))
        .unwrap_err();
    assert!(
        matches!(&e, SpillError::InvalidConfig { field: "PublishOptions::mode", got, .. } if got == "0o4755"),
        "{e:?}"
    );
    // A publish with a mode that fails after the modes were set (the third rename): the
    // files are private again.
    fail_rename(&plan, libc::EIO, 2);
    let e = st
        .publish_with(dest.path(), "out", PublishOptions::default().mode(0o644))
        .unwrap_err();
    assert!(matches!(&e, SpillError::PublishFailed { .. }), "{e:?}");
    for p in st.paths() {
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    let paths = st
        .publish_with(dest.path(), "wide", PublishOptions::default().mode(0o644))
        .unwrap();
    for p in &paths {
        assert_eq!(mode(p), 0o644, "{}", p.display());
    }
    read_published(&paths);

    let st = spill(&task);
    let paths = st.publish(dest.path(), "default").unwrap();
    for p in &paths {
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    let st = spill(&task);
    let paths = st
        .publish_with(dest.path(), "none", PublishOptions::default().mode(0))
        .unwrap();
    assert_eq!(mode(&paths[0]), 0);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// Both write modes: published files, trimmed to their written length, read back through
/// `SegmentReader` to exactly the records; damage gives `Corrupt` at the bad frame's offset
/// with every record before it returned intact.
fn published_files_read_back_equal_the_records(b: BackendKind) {
    for wm in both_modes() {
        let root = tempfile::tempdir_in("/var/tmp").unwrap();
        let dest = tempfile::tempdir_in("/var/tmp").unwrap();
        let engine = Engine::open(cfg(root.path(), b).mode(wm).segment_size(64 << 10)).unwrap();
        let task = engine.task("readback").unwrap();
        let st = spill(&task);
        let paths = st.publish(dest.path(), "out").unwrap();
        drop(st);
        task.close();
        assert_clean(&engine, root.path());
        drop(engine);
        read_published(&paths);
        // One block of 64 frames of 1008 bytes after the 64-byte header (direct mode: padded
        // to 4 KiB, recorded in the block header): exactly the written length.
        let want = 64u64 + 64 + 64 * 1008;
        let want = if wm == spillring::WriteMode::Direct {
            want.next_multiple_of(4096)
        } else {
            want
        };
        assert_eq!(std::fs::metadata(&paths[0]).unwrap().len(), want);
        let h = SegmentReader::open(&paths[1]).unwrap().header();
        assert_eq!(h.version, spillring::segment::VERSION);
        check_damage(&paths[0]);
    }
}

/// Every kind of damage to a published file (64 records of 1000 bytes) is `Corrupt` at its
/// place, and the reader ends there.
fn check_damage(good: &Path) {
    let bytes = std::fs::read(good).unwrap();
    let dir = tempfile::tempdir_in(good.parent().unwrap()).unwrap();
    let frame = |k: usize| (64 + 64 + k * 1008) as u64;
    let case = |name: &str, data: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    // Reads until the error; returns the records before it and the error.
    let read = |p: &Path| -> (u64, SpillError) {
        let mut r = match SegmentReader::open(p) {
            Ok(r) => r,
            Err(e) => return (0, e),
        };
        let mut n = 0;
        loop {
            match r.next_record() {
                Ok(Some(rec)) => {
                    assert_eq!(rec, record(n, REC_LEN), "record {n} of {}", p.display());
                    n += 1;
                }
                Ok(None) => panic!("{}: damage not found after {n} records", p.display()),
                Err(e) => {
                    assert!(
                        r.next_record().unwrap().is_none(),
                        "reads on after an error"
                    );
                    return (n, e);
                }
            }
        }
    };
    let corrupt_at = |e: &SpillError| match e {
        SpillError::Corrupt { offset, detail, .. } => (*offset, *detail),
        other => panic!("want Corrupt, got {other:?}"),
    };
    // Format v3: the records are one block at offset 64, whose checksum covers them all.
    const BLOCK: u64 = 64;
    // Cut inside frame 10's payload, inside its frame, inside the block header.
    for cut in [frame(10) + 500, frame(10) + 3] {
        let (n, e) = read(&case("cut", &bytes[..cut as usize]));
        assert_eq!(
            (n, corrupt_at(&e)),
            (0, (BLOCK, "block runs past the end of the segment")),
            "{e}"
        );
    }
    let (n, e) = read(&case("cut-header", &bytes[..BLOCK as usize + 30]));
    assert_eq!((n, corrupt_at(&e)), (0, (BLOCK, "truncated block header")));
    // A flipped payload byte in frame 20: no record of the block is returned.
    let mut flip = bytes.clone();
    flip[frame(20) as usize + 8 + 77] ^= 0x10;
    let (n, e) = read(&case("flip", &flip));
    assert_eq!((n, corrupt_at(&e)), (0, (BLOCK, "block checksum mismatch")));
    // A stored length that claims 2^64 - 1 bytes: refused before any allocation.
    let mut len = bytes.clone();
    len[BLOCK as usize + 8..BLOCK as usize + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    let (n, e) = read(&case("len", &len));
    assert_eq!(
        (n, corrupt_at(&e)),
        (0, (BLOCK, "raw block whose lengths disagree"))
    );
    len[BLOCK as usize + 16..BLOCK as usize + 24].copy_from_slice(&u64::MAX.to_le_bytes());
    let (n, e) = read(&case("len2", &len));
    assert_eq!(
        (n, corrupt_at(&e)),
        (0, (BLOCK, "block runs past the end of the segment"))
    );
    // Zeros left past the last block (a padded file copied, not published): no block.
    let mut pad = bytes.clone();
    pad.extend_from_slice(&[0u8; 4096]);
    let (n, e) = read(&case("pad", &pad));
    assert_eq!(
        (n, corrupt_at(&e)),
        (64, (bytes.len() as u64, "bad block magic")),
        "{e}"
    );
    // A version-1 or version-2 segment (its header checksum valid): refused by name, never
    // misread (version 2's blocks were bound to no engine).
    for (v, want) in [
        (
            1u16,
            "segment format version 1: this build reads version 3 only",
        ),
        (
            2,
            "segment format version 2 (blocks not bound to their engine): this build reads version 3 only",
        ),
    ] {
        let mut old = bytes.clone();
        old[8..10].copy_from_slice(&v.to_le_bytes());
        let crc = crc32c_of(&old[..60]);
        old[60..64].copy_from_slice(&crc.to_le_bytes());
        let (_, e) = read(&case(&format!("v{v}"), &old));
        assert_eq!(corrupt_at(&e), (0, want));
    }
    // A damaged header, a file shorter than a header, an empty file, not a segment at all.
    let mut hdr = bytes.clone();
    hdr[13] ^= 1;
    let (_, e) = read(&case("hdr", &hdr));
    assert_eq!(corrupt_at(&e), (0, "header checksum mismatch"));
    let (_, e) = read(&case("short", &bytes[..40]));
    assert_eq!(corrupt_at(&e), (40, "segment truncated inside its header"));
    let (_, e) = read(&case("empty", &[]));
    assert_eq!(corrupt_at(&e).0, 0);
    let (_, e) = read(&case("text", &[b'x'; 200]));
    assert_eq!(corrupt_at(&e), (0, "bad magic: not a spillring segment"));
    // Only the header: a valid, empty segment.
    let p = case("header-only", &bytes[..64]);
    assert_eq!(SegmentReader::open(&p).unwrap().count(), 0);
    // A missing file is an I/O error naming it.
    let missing = dir.path().join("missing");
    let e = SegmentReader::open(&missing).unwrap_err();
    assert!(
        matches!(&e, SpillError::Io { op: "open", path, .. } if path == &missing),
        "{e:?}"
    );
}

/// The scope is cancelled while a publish that will fail is under way (paused before its
/// first rename, with a name planted for segment 2): the publish moves segments 0 and 1, fails,
/// moves them back, and then, the scope having closed the state meanwhile, deletes the files
/// as the close would have. Nothing of the engine is left; the planted file is untouched.
fn a_cancel_during_a_failing_publish_deletes_the_files(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 5, "cancel");
    let st = std::sync::Arc::new(spill(&task));
    let pause = plan.pause_once(FaultPoint::PublishRename);
    let s2 = st.clone();
    let d2 = dest.path().to_path_buf();
    let publisher = thread::spawn(move || s2.publish(&d2, "out"));
    assert!(pause.wait_reached(T));
    std::fs::write(dest.path().join("out-000002.bin"), b"planted").unwrap();
    task.cancel();
    pause.release();
    let e = publisher.join().unwrap().unwrap_err();
    assert!(matches!(&e, SpillError::PublishFailed { .. }), "{e:?}");
    assert!(matches!(st.reader(), Err(SpillError::Aborted)));
    assert_eq!(names(dest.path()), ["out-000002.bin"]);
    drop(st);
    assert_clean(&engine, root.path());
}

/// A cancel while a publish that succeeds is under way: the publish completes (the files are
/// the caller's, their tickets released), and the close finds nothing of the state to delete.
fn a_cancel_during_a_publish_that_succeeds_leaves_the_files_to_the_caller(b: BackendKind) {
    let (root, dest, plan, engine, task) = setup(b, 6, "cancel-ok");
    let st = std::sync::Arc::new(spill(&task));
    let pause = plan.pause_once(FaultPoint::PublishRename);
    let s2 = st.clone();
    let d2 = dest.path().to_path_buf();
    let publisher = thread::spawn(move || s2.publish(&d2, "out"));
    assert!(pause.wait_reached(T));
    task.cancel();
    pause.release();
    let paths = publisher.join().unwrap().unwrap();
    read_published(&paths);
    drop(st);
    let m = assert_clean(&engine, root.path());
    assert_eq!(m.files_published, 5);
    assert_eq!(m.files_deleted, 0);
}

/// Refused before anything moves, each with its typed error: a destination that is a file,
/// the engine's own directory, a prefix too long for a file name; and a segment file that
/// vanished from under the state (someone deleted it) fails the publish at that file with
/// nothing moved.
fn bad_destinations_and_prefixes_change_nothing(b: BackendKind) {
    let (root, dest, _, engine, task) = setup(b, 0, "bad");
    let st = spill(&task);
    let file = dest.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let e = st.publish(&file, "out").unwrap_err();
    assert!(
        matches!(&e, SpillError::Io { op: "open", source, .. } if source.raw_os_error() == Some(libc::ENOTDIR)),
        "{e:?}"
    );
    let own = engine.process_dirs()[0].clone();
    let e = st.publish(&own, "spill-segment").unwrap_err();
    assert!(
        matches!(
            &e,
            SpillError::InvalidName {
                what: "publish destination",
                ..
            }
        ),
        "{e:?}"
    );
    let long = "p".repeat(250);
    let e = st.publish(dest.path(), &long).unwrap_err();
    assert!(
        matches!(&e, SpillError::InvalidName { what: "publish prefix", reason, .. } if reason.contains("255")),
        "{e:?}"
    );
    assert_eq!(names(dest.path()), ["a-file"]);
    read_all(&st);
    // Segment 2's file is deleted behind the engine's back.
    std::fs::remove_file(&st.paths()[2]).unwrap();
    let e = st.publish(dest.path(), "out").unwrap_err();
    assert!(
        matches!(&e, SpillError::PublishFailed { path, stranded, source, .. }
            if path.ends_with("out-000002.bin") && stranded.is_empty()
                && source.kind() == std::io::ErrorKind::NotFound),
        "{e:?}"
    );
    assert_eq!(names(dest.path()), ["a-file"]);
    assert_eq!(st.paths().len(), 5);
    drop(st);
    task.close();
    assert_clean(&engine, root.path());
}

/// CRC-32C (Castagnoli), bitwise: the segment header's checksum, without a dependency.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Found by reading: `publish` marked the state's files released while it renamed them, so a
/// `reader()` on the same state got `Aborted` though nothing aborted, even when the publish
/// then rolled back. A reader now waits for the publish to end and reads on after a rollback.
fn reader_during_a_publish_that_rolls_back(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    // The first destination name is taken: the publish moves nothing and rolls back.
    std::fs::write(dest.path().join("out-000000.bin"), b"taken").unwrap();
    let plan = FaultPlan::new(31);
    let engine = Engine::open(cfg(dir.path(), b).fault_plan(plan.clone())).unwrap();
    let task = engine.task("publish").unwrap();
    let mut w = task.writer().unwrap();
    for i in 0..20 {
        w.write(Bytes::from(record(i, 1000))).unwrap();
    }
    let state = std::sync::Arc::new(w.finish().unwrap());
    let pause = plan.pause_once(FaultPoint::StatePublish);
    let s2 = state.clone();
    let dest_path = dest.path().to_path_buf();
    let publisher = thread::spawn(move || s2.publish(&dest_path, "out"));
    assert!(pause.wait_reached(T));
    let s3 = state.clone();
    let reader = thread::spawn(move || {
        let mut r = s3.reader()?;
        let mut n = 0;
        while let Some(rec) = r.next_record()? {
            assert_eq!(rec, record(n, 1000));
            n += 1;
        }
        Ok::<u64, SpillError>(n)
    });
    thread::sleep(Duration::from_millis(50));
    pause.release();
    let published = publisher.join().unwrap();
    assert!(
        matches!(&published, Err(SpillError::PublishFailed { .. })),
        "the taken name fails the publish: {published:?}"
    );
    let read = reader.join().unwrap();
    assert!(
        matches!(read, Ok(20)),
        "a reader during a publish that rolled back must read the state: {read:?}"
    );
    drop(state);
    drop(task);
    assert_clean(&engine, dir.path());
}
