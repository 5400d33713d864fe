//! Positioned writes for the psync backend.

use std::io::{self, IoSlice};
use std::os::fd::BorrowedFd;

/// `pwritev(fd, bufs, offset)`: one vectored write at `offset`; returns the bytes written
/// (possibly short). Not retried on `EINTR`.
pub(crate) fn pwritev(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], offset: u64) -> io::Result<usize> {
    Ok(rustix::io::pwritev(fd, bufs, offset)?)
}
