//! Helpers shared by the integration tests.
#![allow(dead_code)]

/// Stamps `uring::name` and `psync::name` from `fn name(backend)`, one test per backend, so
/// nextest names the backend that fails. The caller imports `BackendKind` and `serial`.
#[allow(unused_macros)]
macro_rules! per_backend {
    ($($name:ident),* $(,)?) => {
        mod uring {
            $(#[test] fn $name() { let _s = super::serial(); super::$name(super::BackendKind::Uring) })*
        }
        mod psync {
            $(#[test] fn $name() { let _s = super::serial(); super::$name(super::BackendKind::Psync) })*
        }
    };
}

use std::path::{Path, PathBuf};
use std::time::Duration;

use spillring::{BackendKind, Engine, EngineConfig, Metrics, WriteMode};

/// A small-segment config on `root` with the given backend, with the segment pool off and every
/// segment mapped on read: most tests check the delete path, which a released state's files
/// take only without the pool, and readers of mappings (`pool.rs` tests the pool and
/// `corrupt.rs` both read paths, with `pooled_cfg`).
pub fn cfg(root: &Path, backend: BackendKind) -> EngineConfig {
    pooled_cfg(root, backend)
        .pool_max_segments(0)
        .read_buffer_max(0)
}

/// A small-segment config with the segment pool and the read path at their defaults.
pub fn pooled_cfg(root: &Path, backend: BackendKind) -> EngineConfig {
    EngineConfig::new(root)
        .backend(backend)
        .segment_size(256 << 10)
        .io_buffer_size(64 << 10)
        .cleanup_retry_delay(Duration::from_millis(20))
}

pub fn open(root: &Path, backend: BackendKind) -> Engine {
    Engine::open(cfg(root, backend)).expect("open engine")
}

/// Serialises the tests of one binary that count fds (`cargo test` runs them as threads of one
/// process; nextest runs each in its own process, where this costs nothing).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Number of open fds of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Asserts the process is back to `before` open fds. The last close of a segment runs on the
/// engine's reaper thread, a moment after the delete that made it the last: a leaked fd stays,
/// so the check waits up to 5 s for the count to come back before it fails.
pub fn assert_fds_back_to(before: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fd_count() != before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fd_count(), before, "fd leak: {:#?}", fd_targets());
}

/// Waits until no process holds the lock of any of `dirs` (an engine's process directories):
/// an engine's threads may let go of its directory a moment after `shutdown` returned with
/// work left, and until then the next open takes the directory for a live engine's.
pub fn wait_unlocked(dirs: &[PathBuf]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for d in dirs {
        loop {
            let Ok(f) = std::fs::File::open(d) else { break }; // gone: nothing to wait for
            // SAFETY: flock on an fd this function owns; the lock goes with `f` (a lock of its
            // own open file description, so the engine's lock in this process conflicts).
            let free = unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            } == 0;
            if free {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} still locked 10 s after its engine was dropped",
                d.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Waits up to 20 s for `cond`, polling every 2 ms; fails naming `what`.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What each open fd of this process points at (for leak reports).
pub fn fd_targets() -> Vec<String> {
    let mut v: Vec<String> = fd_paths()
        .into_iter()
        .map(|(fd, t)| format!("{fd} -> {}", t.display()))
        .collect();
    v.sort();
    v
}

/// This process's open fds and what each points to (empty when it cannot be read).
pub fn fd_paths() -> Vec<(String, PathBuf)> {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .flatten()
        .map(|e| {
            let t = std::fs::read_link(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), t)
        })
        .collect()
}

/// Every regular file under `root`, recursively.
pub fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let t = e.file_type().expect("file type");
            if t.is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Number of segment files under `root`.
pub fn segment_files(root: &Path) -> usize {
    files_under(root)
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".bin"))
        .count()
}

/// Every directory under `root` (not `root` itself).
pub fn dirs_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().expect("file type").is_dir() {
                out.push(e.path());
                stack.push(e.path());
            }
        }
    }
    out
}

/// Settles the engine and asserts nothing is left: no file under the root, no ticket held,
/// no delete pending, only the engine's own (empty) process directory.
pub fn assert_clean(engine: &Engine, root: &Path) -> Metrics {
    // Pooled segments are the engine's files too: they go now, through the delete path.
    engine.trim_pool();
    assert!(
        engine.settle(Duration::from_secs(10)),
        "engine did not settle"
    );
    let m = engine.metrics();
    assert_eq!(
        files_under(root),
        Vec::<PathBuf>::new(),
        "files left under the root"
    );
    assert_eq!(m.tickets_used, 0, "tickets still held: {m:?}");
    assert_eq!(m.cleanup_pending, 0, "cleanup records pending: {m:?}");
    assert_eq!(m.spill_bytes_in_use, 0, "quota bytes still held: {m:?}");
    let dirs = dirs_under(root);
    assert!(
        dirs.iter().all(|d| engine.process_dirs().contains(d)),
        "task directories left: {dirs:?}"
    );
    m
}

/// [`assert_clean`], and no map of a segment file is left (a record a test still holds keeps
/// its map, so tests that hold none call this): a map left of a deleted segment would hold
/// its blocks and pages for good.
pub fn assert_clean_and_unmapped(engine: &Engine, root: &Path) -> Metrics {
    let m = assert_clean(engine, root);
    assert_eq!(
        mappings_under(root),
        Vec::<String>::new(),
        "maps of segment files left"
    );
    m
}

/// The lines of `/proc/self/maps` that map a file under `root` (a deleted file's line ends in
/// ` (deleted)`).
pub fn mappings_under(root: &Path) -> Vec<String> {
    let root = root.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .filter(|l| l.contains(&root))
        .map(str::to_owned)
        .collect()
}

/// How many maps of `path` (alive or deleted) the process has.
pub fn mappings_of(path: &Path) -> usize {
    let p = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .expect("read /proc/self/maps")
        .lines()
        .filter(|l| l.ends_with(&p) || l.ends_with(&format!("{p} (deleted)")))
        .count()
}

/// Deterministic pseudo-random bytes for record `i` of length `len`.
pub fn record(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn both_modes() -> [WriteMode; 2] {
    [WriteMode::Buffered, WriteMode::Direct]
}

/// Mounts a tmpfs of `size` on a fresh directory, in a mount namespace private to this thread
/// (and the threads it starts later, such as the engine's).
pub fn private_tmpfs(size: &str, read_only: bool) -> (tempfile::TempDir, PathBuf) {
    // SAFETY: plain syscalls with valid NUL-terminated arguments; results are checked.
    unsafe {
        assert_eq!(
            libc::unshare(libc::CLONE_NEWNS),
            0,
            "unshare(CLONE_NEWNS) failed: these tests need root (CAP_SYS_ADMIN): {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null()
            ),
            0,
            "make / private: {}",
            std::io::Error::last_os_error()
        );
    }
    let holder = tempfile::tempdir().unwrap();
    let mnt = holder.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let target = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
    let opts = std::ffi::CString::new(format!("size={size},mode=0755")).unwrap();
    let flags = if read_only { libc::MS_RDONLY } else { 0 };
    // SAFETY: valid NUL-terminated arguments; the result is checked.
    let r = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            flags,
            opts.as_ptr().cast(),
        )
    };
    assert_eq!(r, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
    (holder, mnt)
}

/// Log lines written while `f` runs on this thread.
pub fn logs_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_writer(move || out.clone())
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let r = tracing::subscriber::with_default(sub, f);
    let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    (r, text)
}
