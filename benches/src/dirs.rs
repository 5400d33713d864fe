//! Where the benches write their results and their spill files.

use std::io;
use std::path::PathBuf;

/// Where the benches write their JSON: `SPILLRING_BENCH_OUT`, else `spillring-bench/` in the
/// cargo target directory the bench executable was built in. Created if missing.
pub fn out_dir() -> io::Result<PathBuf> {
    let dir = match std::env::var_os("SPILLRING_BENCH_OUT") {
        Some(d) => PathBuf::from(d),
        None => {
            // The executable is <target>/release/deps/<name>-<hash>.
            let exe = std::env::current_exe().unwrap_or_default();
            exe.ancestors()
                .nth(3)
                .map(|t| t.join("spillring-bench"))
                .unwrap_or_else(|| PathBuf::from("target/spillring-bench"))
        }
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A fresh directory for spill files under `SPILLRING_BENCH_ROOT` (default: the system temp
/// directory). Removed when dropped.
pub fn scratch(tag: &str) -> io::Result<tempfile::TempDir> {
    let root = std::env::var_os("SPILLRING_BENCH_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root)?;
    tempfile::Builder::new()
        .prefix(&format!("spillring-bench-{tag}-"))
        .tempdir_in(root)
}

/// A fresh directory for benches that count memory rather than time the disk: under
/// `SPILLRING_BENCH_META_ROOT`, else `/dev/shm` when it is a writable tmpfs, else as
/// [`scratch`]. File creation on a churned ext4 (inode bitmap scans) would only slow them down.
pub fn scratch_meta(tag: &str) -> io::Result<tempfile::TempDir> {
    let root = std::env::var_os("SPILLRING_BENCH_META_ROOT")
        .map(PathBuf::from)
        .or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            tempfile::tempdir_in(&shm).ok().map(|_| shm)
        });
    match root {
        Some(root) => tempfile::Builder::new()
            .prefix(&format!("spillring-bench-{tag}-"))
            .tempdir_in(root),
        None => scratch(tag),
    }
}
