//! Engine metrics: relaxed atomic counters updated on the paths they count, read as one
//! [`Metrics`] snapshot that also renders as Prometheus text.

mod latency;
mod prometheus;

use crate::config::{Backend, WriteMode};
use latency::Latencies;
pub use latency::{LATENCY_BUCKETS, LatencyHistogram, LatencyMetrics, latency_bucket_bound};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters. Every field is a monotonic counter unless its comment says gauge.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub segments_created: AtomicU64,
    pub bytes_written: AtomicU64,
    pub records_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub records_read: AtomicU64,
    pub aborts_observed: AtomicU64,
    pub late_files_deleted: AtomicU64,
    pub files_deleted: AtomicU64,
    pub files_already_absent: AtomicU64,
    pub delete_failures: AtomicU64,
    pub write_failures: AtomicU64,
    /// Errors returned to callers by writers and readers, by `SpillError::kind`
    /// (indexed as [`ERROR_KINDS`]).
    pub errors: [AtomicU64; ERROR_KINDS.len()],
    pub cleanup_retries: AtomicU64,
    pub cleanup_released: AtomicU64,
    pub orphan_dirs_swept: AtomicU64,
    pub orphan_files_swept: AtomicU64,
    pub root_skips: AtomicU64,
    /// Gauge: configured roots skipped at open for an OS error (unused for the engine's life).
    pub roots_unusable: AtomicU64,
    pub files_published: AtomicU64,
    pub pool_hits: AtomicU64,
    pub pool_misses: AtomicU64,
    pub pool_trims: AtomicU64,
    pub writes_inline: AtomicU64,
    /// Gauge: deletes queued to an I/O thread and not yet completed.
    pub deletes_in_flight: AtomicU64,

    // Latency histograms (operators' view of where time goes; see `Histogram`).
    /// Latencies of the spill's stages.
    pub latency: Latencies,
    // Format v2 (issue 11): blocks, codecs, encryption.
    pub logical_bytes_written: AtomicU64,
    pub physical_bytes_written: AtomicU64,
    pub logical_bytes_read: AtomicU64,
    pub physical_bytes_read: AtomicU64,
    pub blocks_raw: AtomicU64,
    pub blocks_lz4: AtomicU64,
    pub blocks_zstd: AtomicU64,
    pub compress_nanos: AtomicU64,
    pub decompress_nanos: AtomicU64,
    pub encrypt_nanos: AtomicU64,
    pub decrypt_nanos: AtomicU64,
}

impl Counters {
    #[inline]
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// What the engine holds under one root, from the ticket ledger's accounting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RootUsage {
    /// The configured root.
    pub path: PathBuf,
    /// Files under it the engine must still delete (tickets: live, pooled, awaiting delete).
    pub files: u64,
    /// Disk bytes those files hold (whole 4 KiB pages, as the quota counts them).
    pub bytes: u64,
}

/// A snapshot of the engine's metrics.
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct Metrics {
    /// Which I/O backend runs (serialised as "io_uring" or "psync").
    pub backend: Backend,
    /// Buffered or direct (serialised as "buffered" or "direct").
    pub write_mode: WriteMode,
    /// Tickets held now: segment files on disk the engine must still delete.
    pub tickets_used: u64,
    /// Most tickets ever held at once.
    pub tickets_high_water: u64,
    /// Ledger capacity.
    pub ticket_capacity: u64,
    /// Reservations refused because the ledger was full.
    pub admission_failures: u64,
    /// Reservations refused by the byte quota.
    pub quota_failures: u64,
    /// Bytes of disk held by live segments (rounded up to 4 KiB per segment).
    pub spill_bytes_in_use: u64,
    /// Segment files created.
    pub segments_created: u64,
    /// Record bytes accepted by writers (payload, without framing).
    pub bytes_written: u64,
    /// Records accepted by writers.
    pub records_written: u64,
    /// Record bytes handed out by readers.
    pub bytes_read: u64,
    /// Records handed out by readers.
    pub records_read: u64,
    /// Spills that ended in `Aborted` (writer or reader saw its scope closed).
    pub aborts_observed: u64,
    /// Files a writer created after its scope was closed, and deleted itself (the
    /// write-after-delete window, closed).
    pub late_files_deleted: u64,
    /// Files whose delete was confirmed.
    pub files_deleted: u64,
    /// Deletes that found the file already absent (counted as confirmed).
    pub files_already_absent: u64,
    /// Deletes that failed with an outcome other than success or "absent".
    pub delete_failures: u64,
    /// Writes that failed.
    pub write_failures: u64,
    /// Errors writers, readers and `SpilledState::reader` returned to their callers, by
    /// kind ([`crate::SpillError::kind`]), every kind in a fixed order;
    /// `spillring_errors_total{kind="..."}`.
    pub errors: Vec<(&'static str, u64)>,
    /// Deletes queued to an I/O thread and not yet completed.
    pub deletes_in_flight: u64,
    /// Name-only records waiting in the cleanup worker.
    pub cleanup_pending: u64,
    /// Age in seconds of the oldest pending cleanup record (sampled at most once a second).
    pub cleanup_oldest_age_secs: f64,
    /// Cleanup attempts that failed and were rotated to the back of the queue.
    pub cleanup_retries: u64,
    /// Cleanup records whose delete was confirmed by the worker.
    pub cleanup_released: u64,
    /// Directories of dead processes swept at open.
    pub orphan_dirs_swept: u64,
    /// Files found in swept directories and deleted.
    pub orphan_files_swept: u64,
    /// Times a root was skipped after a failing create.
    pub root_skips: u64,
    /// Configured roots that failed at open (read-only, no permission, a device error) and
    /// that this engine does not use (a warning was logged for each).
    pub roots_unusable: u64,
    /// Segment files handed to the caller by `SpilledState::publish`.
    pub files_published: u64,
    /// Released segment files the pool holds for reuse (each holds a ticket).
    pub pool_segments: u64,
    /// Bytes those files hold on disk (counted in `spill_bytes_in_use`).
    pub pool_bytes: u64,
    /// Segments a writer took from the pool (no create, no allocation).
    pub pool_hits: u64,
    /// Bytes of staging buffers mapped now: held by writers, in flight, or free for reuse
    /// (within `max_buffer_memory`).
    pub staging_buffer_bytes: u64,
    /// Bytes of segment maps kept with pooled files now (within `max_read_memory`).
    pub kept_map_bytes: u64,
    /// Segment fds the engine holds open now (within `max_open_files` and half the soft
    /// `RLIMIT_NOFILE`).
    pub open_fds: u64,
    /// Segments a writer created because the pool had none for its root.
    pub pool_misses: u64,
    /// Pooled files deleted: past the pool's bounds, under ledger or quota pressure, by
    /// `Engine::trim_pool`, or at shutdown.
    pub pool_trims: u64,
    /// Writes a blocking `finish` made on its caller's thread, which waits for them anyway:
    /// the segment's last staged write, or a queued write the writer took back before an I/O
    /// thread started it (two thread wake-ups saved each).
    pub writes_inline: u64,
    /// Latency histograms of the spill's stages.
    pub latency: LatencyMetrics,
    /// Per root in use (configuration order): the files the engine owns there and their bytes.
    pub roots: Vec<RootUsage>,
    // Format v2 (issue 11): blocks, codecs, encryption.
    /// Bytes of records and their frames sealed into blocks, before compression.
    pub logical_bytes_written: u64,
    /// Bytes of blocks as written (headers and stored bytes, after compression).
    pub physical_bytes_written: u64,
    /// Bytes of blocks' records once decoded by readers.
    pub logical_bytes_read: u64,
    /// Bytes of blocks as read by readers (headers and stored bytes).
    pub physical_bytes_read: u64,
    /// Blocks stored raw.
    pub blocks_raw: u64,
    /// Blocks stored with lz4.
    pub blocks_lz4: u64,
    /// Blocks stored with zstd.
    pub blocks_zstd: u64,
    /// Nanoseconds spent compressing (trials of Auto included).
    pub compress_nanos: u64,
    /// Nanoseconds spent decompressing.
    pub decompress_nanos: u64,
    /// Nanoseconds spent encrypting blocks (0 without `encryption`).
    pub encrypt_nanos: u64,
    /// Nanoseconds spent decrypting blocks (0 without `encryption`).
    pub decrypt_nanos: u64,
}

/// The kinds [`crate::SpillError::kind`] sorts errors into, in the order of
/// [`Metrics::errors`].
pub const ERROR_KINDS: [&str; 8] = [
    "storage_full",
    "quota",
    "too_many_open_files",
    "corrupt",
    "io",
    "aborted",
    "misuse",
    "other",
];

impl Counters {
    /// Counts `e`, returned to a caller, under its kind.
    pub(crate) fn count_error(&self, e: &crate::SpillError) {
        let k = ERROR_KINDS
            .iter()
            .position(|k| *k == e.kind())
            .unwrap_or(ERROR_KINDS.len() - 1);
        self.errors[k].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The error counts, by kind.
    pub(crate) fn error_counts(&self) -> Vec<(&'static str, u64)> {
        ERROR_KINDS
            .iter()
            .zip(&self.errors)
            .map(|(k, c)| (*k, c.load(std::sync::atomic::Ordering::Relaxed)))
            .collect()
    }
}
