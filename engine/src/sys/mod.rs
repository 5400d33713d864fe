//! The syscall layer: every syscall the engine makes outside its io_uring backend, as safe
//! functions on [`rustix`]. This first part holds the filesystem calls.
//!
//! Every function returns [`std::io::Result`]. A failed syscall's `io::Error` carries the
//! kernel's errno as its `raw_os_error()` (rustix converts its `Errno` with
//! `io::Error::from_raw_os_error`), exactly as the `libc` calls it replaces reported it through
//! `io::Error::last_os_error()`: the engine classifies errors by that number.
//!
//! What stays outside: io_uring itself (`io/uring.rs`, and the iovecs and name pointers that
//! `io.rs` builds for it, with the `libc` types the `io-uring` crate's opcodes take), and
//! std's own file APIs (`std::fs`), which are safe already.
//!
//! - [`fs`] has `openat`, `mkdirat`, `unlinkat`, `renameat2`, `flock`, `fallocate`,
//!   `ftruncate`, `fstat`, and directory listing.

pub(crate) mod fs;
