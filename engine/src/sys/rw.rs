//! Positioned writes for the psync backend, and positioned reads.

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;

/// `pwritev(fd, bufs, offset)`: one vectored write at `offset`; returns the bytes written
/// (possibly short). Not retried on `EINTR`.
pub(crate) fn pwritev(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<usize> {
    Ok(rustix::io::pwritev(fd, bufs, offset)?)
}

/// `pread(fd, buf, offset)`: one positioned read; returns the bytes read (0 at the end of the
/// file, possibly short). Not retried on `EINTR`.
pub(crate) fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    Ok(rustix::io::pread(fd, buf, offset)?)
}
