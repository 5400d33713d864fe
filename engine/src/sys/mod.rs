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
//! - [`rw`] `pwritev` for the psync backend.

pub(crate) mod event;
pub(crate) mod fs;
pub(crate) mod mem;
pub(crate) mod rand;
pub(crate) mod rw;

/// The errno values the engine classifies `io::Error`s by (compare with
/// [`std::io::Error::raw_os_error`]), from rustix's `Errno`, so no caller needs `libc` for them.
pub(crate) mod errno {
    use rustix::io::Errno;

    /// No such file or directory.
    pub(crate) const ENOENT: i32 = Errno::NOENT.raw_os_error();
    /// I/O error (a device error).
    pub(crate) const EIO: i32 = Errno::IO.raw_os_error();
    /// No space left on the device.
    pub(crate) const ENOSPC: i32 = Errno::NOSPC.raw_os_error();
    /// Disk quota exceeded.
    pub(crate) const EDQUOT: i32 = Errno::DQUOT.raw_os_error();
    /// Read-only filesystem.
    pub(crate) const EROFS: i32 = Errno::ROFS.raw_os_error();
    /// Invalid argument (e.g. `O_DIRECT` on a filesystem without it).
    pub(crate) const EINVAL: i32 = Errno::INVAL.raw_os_error();
    /// Operation cancelled: what an op that never started reports.
    pub(crate) const ECANCELED: i32 = Errno::CANCELED.raw_os_error();
    /// Not a directory.
    pub(crate) const ENOTDIR: i32 = Errno::NOTDIR.raw_os_error();
    /// Too many levels of symbolic links (`O_NOFOLLOW` met a symlink).
    pub(crate) const ELOOP: i32 = Errno::LOOP.raw_os_error();

    #[cfg(test)]
    mod tests {
        /// Each constant is the kernel's (and libc's) number, and an `io::Error` made from a
        /// rustix `Errno` reports that number as its `raw_os_error()`.
        #[test]
        fn errno_values_match_libc_and_survive_conversion() {
            use rustix::io::Errno;
            for (ours, libc, e) in [
                (super::ENOENT, libc::ENOENT, Errno::NOENT),
                (super::EIO, libc::EIO, Errno::IO),
                (super::ENOSPC, libc::ENOSPC, Errno::NOSPC),
                (super::EDQUOT, libc::EDQUOT, Errno::DQUOT),
                (super::EROFS, libc::EROFS, Errno::ROFS),
                (super::EINVAL, libc::EINVAL, Errno::INVAL),
                (super::ECANCELED, libc::ECANCELED, Errno::CANCELED),
                (super::ENOTDIR, libc::ENOTDIR, Errno::NOTDIR),
                (super::ELOOP, libc::ELOOP, Errno::LOOP),
                (libc::EWOULDBLOCK, libc::EWOULDBLOCK, Errno::WOULDBLOCK),
                (libc::EOPNOTSUPP, libc::EOPNOTSUPP, Errno::OPNOTSUPP),
                (libc::EINTR, libc::EINTR, Errno::INTR),
                (libc::EEXIST, libc::EEXIST, Errno::EXIST),
            ] {
                assert_eq!(ours, libc);
                let io = std::io::Error::from(e);
                assert_eq!(io.raw_os_error(), Some(libc));
                assert_eq!(io.kind(), std::io::Error::from_raw_os_error(libc).kind());
            }
        }
    }
}
