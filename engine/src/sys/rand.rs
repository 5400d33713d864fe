//! Random bytes from the kernel.

use std::io;

use rustix::rand::GetRandomFlags;

/// `getrandom(buf, 0)`: fills `buf` from the kernel's pool (blocking until it is initialised)
/// and returns how many bytes it wrote. Not retried: a short count or `EINTR` is the caller's.
pub(crate) fn getrandom(buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::rand::getrandom(buf, GetRandomFlags::empty())?)
}
