//! Which I/O backend a bench means, and an `Engine::open` that makes sure it got it.
//!
//! `EngineConfig`'s default backend is `Auto`, which falls back to psync when io_uring cannot
//! be set up (a seccomp profile, an old kernel, `io_uring_disabled`): a bench opened that way
//! would quietly measure psync under an io_uring label. Every bench opens its engines through
//! [`open_engine`] instead: the backend is asked for by name (io_uring unless
//! `SPILLRING_BENCH_BACKEND=psync`), so `Engine::open` fails rather than fall back, and the
//! backend that runs is checked against it before anything is measured.

use spillring::{Backend, BackendKind, Engine, EngineConfig};

/// The backend the benches measure: `SPILLRING_BENCH_BACKEND` (`uring`, the default, or
/// `psync`). Panics on any other value, so a typo cannot select a backend nobody asked for.
pub fn wanted_backend() -> Backend {
    match std::env::var("SPILLRING_BENCH_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("uring") | Ok("io_uring") => Backend::IoUring,
        Ok("psync") => Backend::Psync,
        Ok(other) => panic!("SPILLRING_BENCH_BACKEND={other}: expected uring or psync"),
    }
}

/// The configuration's backend field for `b`.
fn kind(b: Backend) -> BackendKind {
    match b {
        Backend::IoUring => BackendKind::Uring,
        Backend::Psync => BackendKind::Psync,
    }
}

/// Opens `cfg` with the backend [`wanted_backend`] names (never `Auto`) and checks that this
/// backend runs. Panics with the reason otherwise: a bench that meant io_uring must not report
/// psync figures.
pub fn open_engine(cfg: EngineConfig, what: &str) -> Engine {
    let want = wanted_backend();
    let engine = Engine::open(cfg.backend(kind(want))).unwrap_or_else(|e| {
        panic!(
            "open the {what} engine with backend {}: {e} (set SPILLRING_BENCH_BACKEND=psync to \
             measure psync on purpose)",
            want.as_str()
        )
    });
    assert_backend(&engine, want, what);
    engine
}

/// Panics unless `engine` runs `want` (by `Engine::backend` and by its metrics).
pub fn assert_backend(engine: &Engine, want: Backend, what: &str) {
    let (ran, in_metrics) = (engine.backend(), engine.metrics().backend);
    assert!(
        ran == want && in_metrics == want,
        "the {what} engine runs {} (metrics say {}), but the bench means {}",
        ran.as_str(),
        in_metrics.as_str(),
        want.as_str()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_psync_engine_is_not_taken_for_io_uring() {
        let dir = tempfile::tempdir().expect("temp dir");
        let engine = Engine::open(EngineConfig::new(dir.path()).backend(BackendKind::Psync))
            .expect("open a psync engine");
        assert_backend(&engine, Backend::Psync, "psync");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_backend(&engine, Backend::IoUring, "psync");
        }));
        let msg = caught.expect_err("a psync engine must fail an io_uring assertion");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("runs psync"), "{msg}");
    }
}
