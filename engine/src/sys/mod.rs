//! The syscall layer: every syscall the engine makes outside its io_uring backend, as safe
//! functions on [`rustix`] (and `memmap2` for the one file mapping), so that no module outside
//! `sys` and `io` needs `unsafe`, and none outside `io` needs `libc`.
//!
//! Every function returns [`std::io::Result`]. A failed syscall's `io::Error` carries the
//! kernel's errno as its `raw_os_error()` (rustix converts its `Errno` with
//! `io::Error::from_raw_os_error`), exactly as the `libc` calls it replaces reported it through
//! `io::Error::last_os_error()`: the engine classifies errors by that number (see [`errno`]).
//!
//! What stays outside: io_uring itself (`io/uring.rs`, and the iovecs and name pointers that
//! `io.rs` builds for it, with the `libc` types the `io-uring` crate's opcodes take), and
//! std's own file APIs (`std::fs`), which are safe already.
//!
//! - [`fs`] has `openat`, `mkdirat`, `unlinkat`, `renameat2`, `flock`, `fallocate`,
//!   `ftruncate`, `fstat`, and directory listing;
//! - [`mem`] the read-only mapping of a segment file;
//! - [`rand`] `getrandom`;
//! - [`event`] the eventfd that wakes a ring thread;
//! - [`rw`] `pwritev` for the psync backend;
//! - [`nofile_soft`] the soft `RLIMIT_NOFILE`.

pub(crate) mod event;
pub(crate) mod fs;
pub(crate) mod mem;
pub(crate) mod rand;
pub(crate) mod rw;

/// The errno values the engine classifies errors by (they live with the error type, a leaf,
/// so every layer may use them).
pub(crate) use crate::error::errno;

/// The process's soft `RLIMIT_NOFILE`, `None` when unlimited.
pub(crate) fn nofile_soft() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// The segment fds an engine may hold: `max_open_files`, and at most half of the soft
/// `RLIMIT_NOFILE` `soft` (the other half is the host's), at least 1.
pub(crate) fn fd_bound(max_open_files: usize, soft: Option<u64>) -> usize {
    match soft {
        Some(s) => max_open_files.min(usize::try_from(s / 2).unwrap_or(usize::MAX).max(1)),
        None => max_open_files,
    }
}

#[cfg(test)]
mod tests {
    use super::fd_bound;

    #[test]
    fn the_fd_bound_is_at_most_half_the_soft_limit() {
        assert_eq!(fd_bound(1024, Some(256)), 128);
        assert_eq!(fd_bound(1024, Some(1 << 20)), 1024);
        assert_eq!(fd_bound(1024, None), 1024);
        assert_eq!(fd_bound(3, Some(256)), 3);
        assert_eq!(fd_bound(1024, Some(1)), 1);
        assert_eq!(fd_bound(1024, Some(0)), 1);
    }
}
