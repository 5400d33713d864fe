//! Probe and fall back: with io_uring refused by a seccomp filter (as in Docker's default
//! profile), `BackendKind::Auto` runs on psync, says so in the metrics, and works;
//! `BackendKind::Uring` fails with a typed error.

mod common;
use common::*;

use spillring::{BackendKind, Bytes, Engine, EngineConfig, SpillError};

/// Makes `io_uring_setup` fail with EPERM for this thread and the threads it starts later.
#[cfg(target_arch = "x86_64")]
fn refuse_io_uring() {
    const NR_IO_URING_SETUP: u32 = 425;
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: NR_IO_URING_SETUP,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl with a valid, live filter program; results are checked.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog
            ),
            0,
            "install seccomp filter: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn io_uring_refused_falls_back_to_psync() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // Runs on a thread of its own, so the filter stays with it (and the engine it starts).
    let root = dir.path().to_path_buf();
    std::thread::spawn(move || {
        refuse_io_uring();
        let e = Engine::open(EngineConfig::new(&root).backend(BackendKind::Uring)).unwrap_err();
        // Its own variant with the errno (issue 25; before, `Io { op: "start io backend" }`
        // with an empty path).
        match &e {
            SpillError::UringUnavailable { errno, source } => {
                assert_eq!(*errno, Some(libc::EPERM), "{e}");
                assert_eq!(source.raw_os_error(), Some(libc::EPERM), "{e}");
                assert!(e.to_string().contains("Auto falls back to psync"), "{e}");
            }
            other => panic!("want UringUnavailable(EPERM), got {other}"),
        }
        assert!(
            dirs_under(&root).is_empty(),
            "a refused open leaves nothing"
        );
        let engine = Engine::open(EngineConfig::new(&root).backend(BackendKind::Auto)).unwrap();
        assert_eq!(engine.backend(), spillring::Backend::Psync);
        assert_eq!(engine.metrics().backend.as_str(), "psync");
        assert!(
            engine
                .metrics()
                .to_prometheus()
                .contains("backend=\"psync\"")
        );
        let task = engine.task("fallback").unwrap();
        let mut w = task.writer().unwrap();
        for i in 0..100 {
            w.write(Bytes::from(record(i, 10_000))).unwrap();
        }
        let st = w.finish().unwrap();
        let mut r = st.reader().unwrap();
        for i in 0..100 {
            assert_eq!(
                &r.next_record().unwrap().unwrap()[..],
                &record(i, 10_000)[..]
            );
        }
        drop((r, st));
        task.close();
        assert_clean(&engine, &root);
    })
    .join()
    .unwrap();
}
