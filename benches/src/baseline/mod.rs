//! The baselines the engine is measured against, in the same process and run:
//!
//! - [`std_fs`]: plain `std::fs` — a `write_all` loop into one file (throughput), one
//!   create + write + close + unlink cycle with and without a read-back (hot path), and
//!   `remove_file` of many files one by one (cleanup);
//! - [`tokio_uring`]: a tokio-uring `write_at` loop with a fixed number of writes in flight
//!   (throughput);
//! - [`codec`]: lz4_flex compressing and ring AES-256-GCM sealing the same blocks the
//!   engine's codecs see, alone on the calling thread (issue 11's codec bench).
//!
//! Each baseline does only what its doc says; the bench around it owns the clock, except where
//! a baseline's figures are taken inside it (the write loops return a [`Run`](crate::Run), with
//! the same instrumentation as the engine's loop). Errors are returned, not panicked on: a bench
//! decides what a failed baseline means.

pub mod codec;
pub mod std_fs;
pub mod tokio_uring;

use std::io;

/// Adds what was being done to an I/O error (`at("create")(e)`), for the bench's panic message.
fn at(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}
