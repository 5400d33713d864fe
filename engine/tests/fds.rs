//! Too many open files: EMFILE never reaches a caller raw. Under a lowered `RLIMIT_NOFILE`, the
//! segment create that finds no descriptor is a typed `TooManyOpenFiles`, nothing is created or
//! leaked, and the writer stays usable: once descriptors are free, the same write succeeds.

#[macro_use]
mod common;
use common::*;

use std::time::Duration;

use spillring::{BackendKind, Bytes, SpillError};

per_backend!(emfile_at_a_segment_create_is_typed_and_the_writer_survives);

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

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

fn emfile_at_a_segment_create_is_typed_and_the_writer_survives(b: BackendKind) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), b);
    let task = engine.task("fds").unwrap();
    // Warm the engine's lanes and reaper, so the only descriptors taken below are segments'.
    let mut warm = task.writer().unwrap();
    warm.write(Bytes::from(record(0, 100))).unwrap();
    drop(warm.finish().unwrap());
    assert!(engine.settle(Duration::from_secs(10)));

    // Each open writer holds its segment's descriptor: a few of them exhaust the limit.
    let old = set_nofile((open_fds() + 6) as u64);
    let mut writers = Vec::new();
    let mut refused = None;
    for i in 0..64 {
        let mut w = task.writer().unwrap();
        match w.write(Bytes::from(record(i, 100))) {
            Ok(()) => writers.push(w),
            Err(e) => {
                refused = Some((w, e));
                break;
            }
        }
    }
    let Some((mut w, e)) = refused else {
        restore_nofile(old);
        panic!("64 writers opened under a limit of a few descriptors");
    };
    let raw_ok = matches!(
        &e,
        SpillError::TooManyOpenFiles { op: "create", source, .. }
            if source.raw_os_error() == Some(libc::EMFILE)
    );
    // Descriptors back: drop some writers (their files are deleted, their fds closed).
    writers.truncate(writers.len() / 2);
    assert!(engine.settle(Duration::from_secs(10)));
    let retried = w.write(Bytes::from(record(1000, 100)));
    restore_nofile(old);
    assert!(raw_ok, "want TooManyOpenFiles(create, EMFILE), got {e}");
    retried.expect("the writer stays usable after TooManyOpenFiles");
    let st = w.finish().unwrap();
    let recs: Vec<_> = st.reader().unwrap().map(|r| r.unwrap()).collect();
    assert_eq!(recs.len(), 1, "only the retried record was written");
    assert_eq!(&recs[0][..], &record(1000, 100)[..]);
    drop((recs, st, writers));
    task.close();
    assert_clean(&engine, dir.path());
}
