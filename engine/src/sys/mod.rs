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

/// The errno values the engine classifies errors by (they live with the error type, a leaf,
/// so every layer may use them).
pub(crate) use crate::error::errno;
