//! The eventfd a sender writes to wake a ring thread sleeping in `io_uring_enter`
//! (see `io/uring/wake.rs`).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::event::EventfdFlags;

/// A new eventfd: counter 0, `EFD_CLOEXEC | EFD_NONBLOCK`.
pub(crate) fn eventfd_nonblocking() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
    )?)
}

/// Adds 1 to the eventfd's counter (an 8-byte `write`). On a non-blocking eventfd whose
/// counter is full this fails with `EAGAIN`: a wake is pending already.
pub(crate) fn eventfd_signal(fd: BorrowedFd<'_>) -> io::Result<()> {
    rustix::io::write(fd, &1u64.to_ne_bytes())?;
    Ok(())
}

/// Reads and resets the eventfd's counter (an 8-byte `read`); fails with `EAGAIN` on a
/// non-blocking eventfd whose counter is 0.
pub(crate) fn eventfd_drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v = [0u8; 8];
    rustix::io::read(fd, &mut v)?;
    Ok(u64::from_ne_bytes(v))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn signals_add_up_and_drain_resets() {
        let efd = eventfd_nonblocking().unwrap();
        let e = eventfd_drain(efd.as_fd()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        eventfd_signal(efd.as_fd()).unwrap();
        eventfd_signal(efd.as_fd()).unwrap();
        assert_eq!(eventfd_drain(efd.as_fd()).unwrap(), 2);
        assert!(eventfd_drain(efd.as_fd()).is_err());
    }
}
