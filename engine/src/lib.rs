//! spillring: an embeddable Linux io_uring spill engine for task executors.
//!
//! A task that runs out of memory hands the engine byte records; the engine writes them into
//! rotating segment files without blocking the task, hands the spilled state from stage to
//! stage, reads it back zero-copy, and deletes every file exactly once on every path: success,
//! error, cancel, abort in the middle of a rotation, failed deletes, and a killed process.
//!
//! Linux only (io_uring, or plain syscalls on the engine's threads where io_uring is not
//! available); the minimum Rust version is in `Cargo.toml` (`rust-version`).
//!
//! ```
//! use spillring::{Engine, EngineConfig, WriteMode};
//! # fn main() -> spillring::Result<()> {
//! # let root = std::env::temp_dir().join(format!("spillring-doc-crate-{}", std::process::id()));
//! let engine = Engine::open(EngineConfig::new(&root).mode(WriteMode::Buffered))?;
//! let task = engine.task("task-42")?;
//! let mut w = task.writer()?;
//! w.write(spillring::Bytes::from_static(b"a record"))?;
//! let state = w.finish()?;
//! let mut r = state.reader()?;
//! while let Some(rec) = r.next_record()? {
//!     assert_eq!(&rec[..], b"a record");
//! }
//! drop((r, state)); // the last grant: the files are deleted (on an engine thread)
//! task.close();
//! # drop(engine);
//! # let _ = std::fs::remove_dir(&root);
//! # Ok(()) }
//! ```
//!
//! # The three stages
//!
//! A spill goes through three stages, each a type, all under a task's scope ([`TaskSpill`],
//! from [`Engine::task`]), which owns every file of the task and deletes them when it closes
//! or is cancelled:
//!
//! 1. **Write** ([`SpillWriter`], from [`TaskSpill::writer`]): [`SpillWriter::write`] queues a
//!    record and returns (it blocks only while `queue_depth` writes are in flight);
//!    [`SpillWriter::record`] gives a [`RecordSlot`] to serialise into the engine's buffer
//!    with no copy. Segments rotate as they fill. [`SpillWriter::finish`] waits for the writes
//!    and hands the files to a state; any error deletes them.
//! 2. **Hand off** ([`SpilledState`]): `Send + Sync`, clone is another grant on the files.
//!    It lives as long as the scope that made it; another task takes it over with
//!    [`TaskSpill::adopt`]. [`SpilledState::publish`] moves the files out of the engine's care
//!    for good (read them with [`SegmentReader`]).
//! 3. **Read** ([`SpillReader`], from [`SpilledState::reader`]): each record is a [`Bytes`]
//!    (CRC checked) into a buffer or a map of the segment; the last grant to go (state,
//!    clones, readers) deletes the files, or keeps them in the segment pool for reuse.
//!
//! ```
//! use spillring::{Bytes, Engine, EngineConfig, SpillError};
//! # fn main() -> spillring::Result<()> {
//! # let root = std::env::temp_dir().join(format!("spillring-doc-stages-{}", std::process::id()));
//! let engine = Engine::open(EngineConfig::new(&root))?;
//! let producer = engine.task("producer")?;
//! let consumer = engine.task("consumer")?;
//! // 1. Write.
//! let mut w = producer.writer()?;
//! for i in 0..3u32 {
//!     w.write(Bytes::from(i.to_le_bytes().to_vec()))?;
//! }
//! let mut slot = w.record(4)?; // serialised in place
//! slot.copy_from_slice(&3u32.to_le_bytes());
//! slot.commit()?;
//! let state = w.finish()?;
//! // 2. Hand off: the consumer's scope owns the files now; the producer may end.
//! consumer.adopt(&state)?;
//! producer.close();
//! // 3. Read.
//! let got: Vec<Bytes> = state.reader()?.collect::<spillring::Result<_>>()?;
//! assert_eq!(got.len(), 4);
//! drop(state); // the last grant: the files go (to the pool, or deleted)
//! consumer.cancel();
//! assert!(matches!(consumer.writer(), Err(SpillError::Aborted)));
//! # drop((consumer, producer, engine));
//! # let _ = std::fs::remove_dir(&root);
//! # Ok(()) }
//! ```
//!
//! # Operating it
//!
//! [`Engine::metrics`] is a snapshot of counters, gauges, latency histograms of each stage
//! ([`LatencyMetrics`]: write, rotation, finish, read open, delete) and each root's disk
//! usage ([`RootUsage`]); [`Metrics::to_prometheus`] renders it in the Prometheus text
//! format. [`Engine::list_files`] lists every file the engine owns ([`OwnedFile`]: task,
//! stage, size, age). At debug level the engine opens a `tracing` span per task scope
//! (`spillring.task`), writer (`spillring.writer`: segments, records, bytes, outcome) and
//! state (`spillring.state`: segments, bytes, outcome).
//!
//! ```
//! use spillring::{Bytes, Engine, EngineConfig, FileKind};
//! # fn main() -> spillring::Result<()> {
//! # let root = std::env::temp_dir().join(format!("spillring-doc-ops-{}", std::process::id()));
//! let engine = Engine::open(EngineConfig::new(&root))?;
//! let task = engine.task("query-1")?;
//! let mut w = task.writer()?;
//! w.write(Bytes::from_static(b"row"))?;
//! let m = engine.metrics();
//! assert_eq!(m.latency.write.count, 1);
//! assert_eq!(m.roots[0].files, 1);
//! assert!(m.to_prometheus().contains("spillring_write_latency_seconds_bucket{le=\"+Inf\"} 1"));
//! let files = engine.list_files();
//! assert_eq!((files[0].kind, files[0].task.as_deref()), (FileKind::Live, Some("query-1")));
//! # drop((w, task, engine));
//! # let _ = std::fs::remove_dir(&root);
//! # Ok(()) }
//! ```
//!
//! The engine reports what it does not return as an error through [`tracing`]: the fallback
//! from io_uring to psync, a root skipped at open or at runtime, a delete that failed and
//! was handed to the cleanup worker, a shutdown that left work. Install a `tracing`
//! subscriber in the embedding program to see them.
//!
//! The crate is a stack of layers, each importing only from those below it (ARCHITECTURE.md in
//! the repository draws it): leaves (`error`, `config`, `metrics`, `fault`, `sync`), `format`
//! (the on-disk bytes), `sys` (every syscall outside io_uring, as safe functions on rustix),
//! `io` (lanes, staging buffers, the reaper, the psync and io_uring backends), `store` (the
//! ticket ledger, roots, directories, the cleanup queue), `shared` (what the threads share),
//! `cleanup` (the delete path, the retry worker, the crash sweep), `spill` ([`TaskSpill`],
//! [`SpillWriter`], [`SpilledState`], [`SpillReader`], and [`SegmentReader`] for a file
//! [`SpilledState::publish`] handed to the caller) and `engine` ([`Engine`]).
//!
//! `unsafe` is denied everywhere but in `io` (the io_uring backend) and `sys`.

#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// The layers, lowest first (ARCHITECTURE.md; `scripts/check-layers.py` checks that each
// imports only from its own layer and those below it).
mod config;
mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(not(feature = "fault-injection"))]
#[allow(dead_code, unreachable_pub)]
mod fault;
mod metrics;
mod sync;

mod format;
#[allow(unsafe_code)]
mod sys;
// The io_uring backend and its buffers are raw code; every other syscall goes through `sys`.
#[allow(unsafe_code)]
mod io;
mod store;

mod shared;

mod cleanup;
mod spill;

mod engine;
#[doc(hidden)]
pub mod testing;

pub use bytes::Bytes;
pub use cleanup::CleanupReport;
pub use config::{
    Backend, BackendKind, Compression, DIRECT_ALIGN, EngineConfig, MAX_OPEN_FILES,
    MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE, WriteMode,
};
pub use engine::{Engine, FileKind, OwnedFile, ShutdownReport};
pub use error::{Result, SpillError};
#[cfg(feature = "fault-injection")]
pub use fault::{FaultAction, FaultPlan, FaultPoint, PauseHandle, Trigger};
pub use format::names::{PROC_PREFIX, proc_dir_name};
pub use format::segment;
pub use metrics::{
    LATENCY_BUCKETS, LatencyHistogram, LatencyMetrics, Metrics, RootUsage, latency_bucket_bound,
};
pub use spill::reader::SpillReader;
pub use spill::segment_reader::SegmentReader;
pub use spill::state::{PublishOptions, SpilledState};
pub use spill::task::{SpillUsage, TaskSpill};
pub use spill::writer::{RecordSlot, SpillWriter};
