//! Random bytes from the kernel.

use std::io;

use rustix::rand::GetRandomFlags;

/// Fills `buf` with `getrandom(2)` (blocking until the kernel's pool is initialised), retried
/// after a short count or `EINTR`; a call that writes nothing is an error.
pub(crate) fn fill(buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::rand::getrandom(&mut buf[got..], GetRandomFlags::empty()) {
            Ok(0) => return Err(io::Error::other("getrandom returned no bytes")),
            Ok(n) => got += n,
            Err(e) if e == rustix::io::Errno::INTR => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
