//! Engine metrics: relaxed atomic counters updated on the paths they count, read as one
//! [`Metrics`] snapshot that also renders as Prometheus text.
//!
//! Each metric is said once, as a row of the [`metrics!`] table below: the snapshot's field
//! (its docs and type), where its value comes from (`counted`: an atomic of [`Counters`];
//! `sampled`: read by the engine when it takes the snapshot, a field of [`Sampled`]), and its
//! Prometheus row (type, name, help). The table's order is the exposition's.

mod latency;
mod prometheus;

use crate::config::{Backend, WriteMode};
use latency::Latencies;
pub use latency::{LATENCY_BUCKETS, LatencyHistogram, LatencyMetrics, latency_bucket_bound};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// Generates, from one table, [`Counters`] (an `AtomicU64` per `counted` row, then the
/// `counters` fields), [`Sampled`] (the `sampled` rows and the `snapshot` fields),
/// [`Metrics`] (the `snapshot` fields, then every row), `Metrics::collect` and
/// `Metrics::write_rows` (the rows' Prometheus text, in the table's order).
macro_rules! metrics {
    (
        counters { $($(#[$xm:meta])* $xf:ident: $xty:ty,)* }
        snapshot { $($(#[$em:meta])* $ef:ident: $ety:ty,)* }
        rows { $($rows:tt)* }
    ) => {
        metrics!(@split [$($(#[$xm])* $xf: $xty,)*] [$($(#[$em])* $ef: $ety,)*] [] [] [$($rows)*] $($rows)*);
    };
    (@split $x:tt $e:tt [$($c:tt)*] $s:tt $all:tt
        $(#[$m:meta])* $f:ident: $ty:ty = counted, $kind:ident $name:literal $help:literal; $($rest:tt)*) => {
        metrics!(@split $x $e [$($c)* $f,] $s $all $($rest)*);
    };
    (@split $x:tt $e:tt $c:tt [$($s:tt)*] $all:tt
        $(#[$m:meta])* $f:ident: $ty:ty = sampled, $kind:ident $name:literal $help:literal; $($rest:tt)*) => {
        metrics!(@split $x $e $c [$($s)* $f: $ty,] $all $($rest)*);
    };
    (@split [$($(#[$xm:meta])* $xf:ident: $xty:ty,)*] [$($(#[$em:meta])* $ef:ident: $ety:ty,)*]
        [$($cf:ident,)*] [$($sf:ident: $sty:ty,)*]
        [$($(#[$rm:meta])* $rf:ident: $rty:ty = $src:ident, $kind:ident $name:literal $help:literal;)*]) => {
        /// Live counters: an atomic per `counted` metric (a monotonic counter, or a gauge
        /// where the table says so), updated with [`Counters::add`].
        #[derive(Debug, Default)]
        pub(crate) struct Counters {
            $(pub $cf: AtomicU64,)*
            $($(#[$xm])* pub $xf: $xty,)*
        }

        /// The values the engine reads when it takes a snapshot (ledger, pool, buffers).
        pub(crate) struct Sampled {
            $(pub $sf: $sty,)*
            $(pub $ef: $ety,)*
        }

        /// A snapshot of the engine's metrics.
        #[derive(Debug, Clone, serde::Serialize)]
        #[non_exhaustive]
        pub struct Metrics {
            $($(#[$em])* pub $ef: $ety,)*
            $($(#[$rm])* pub $rf: $rty,)*
        }

        impl Metrics {
            /// The snapshot of `c` and `s`.
            pub(crate) fn collect(c: &Counters, s: Sampled) -> Metrics {
                Metrics {
                    $($ef: s.$ef,)*
                    $($rf: metrics!(@read $src c s $rf),)*
                }
            }

            /// Appends the table's rows in the Prometheus text format.
            fn write_rows(&self, out: &mut String) {
                $(prometheus::row(out, $name, stringify!($kind), $help, self.$rf as f64);)*
            }
        }
    };
    (@read counted $c:ident $s:ident $f:ident) => { Counters::get(&$c.$f) };
    (@read sampled $c:ident $s:ident $f:ident) => { $s.$f };
}

metrics! {
    counters {
        /// Errors returned to callers by writers and readers, by `SpillError::kind`
        /// (indexed as [`ERROR_KINDS`]).
        errors: [AtomicU64; ERROR_KINDS.len()],
        /// Latencies of the spill's stages (operators' view of where time goes).
        latency: Latencies,
    }
    snapshot {
        /// Which I/O backend runs (serialised as "io_uring" or "psync").
        backend: Backend,
        /// Buffered or direct (serialised as "buffered" or "direct").
        write_mode: WriteMode,
        /// Errors writers, readers and `SpilledState::reader` returned to their callers, by
        /// kind ([`crate::SpillError::kind`]), every kind in a fixed order;
        /// `spillring_errors_total{kind="..."}`.
        errors: Vec<(&'static str, u64)>,
        /// Latency histograms of the spill's stages.
        latency: LatencyMetrics,
        /// Per root in use (configuration order): the files the engine owns there and their bytes.
        roots: Vec<RootUsage>,
    }
    rows {
        /// Tickets held now: segment files on disk the engine must still delete.
        tickets_used: u64 = sampled, gauge "tickets_used"
            "Segment files on disk the engine must still delete.";
        /// Most tickets ever held at once.
        tickets_high_water: u64 = sampled, gauge "tickets_high_water" "Most tickets held at once.";
        /// Ledger capacity.
        ticket_capacity: u64 = sampled, gauge "ticket_capacity" "Ledger capacity.";
        /// Reservations refused because the ledger was full.
        admission_failures: u64 = sampled, counter "admission_failures_total"
            "Reservations refused: ledger full.";
        /// Reservations refused by the byte quota.
        quota_failures: u64 = sampled, counter "quota_failures_total"
            "Reservations refused: byte quota.";
        /// Bytes of disk held by live segments (rounded up to 4 KiB per segment).
        spill_bytes_in_use: u64 = sampled, gauge "spill_bytes_in_use"
            "Disk bytes held by live segments.";
        /// Segment files created.
        segments_created: u64 = counted, counter "segments_created_total" "Segment files created.";
        /// Rotations that found their segment opened ahead of need (`rotate.rs` `Ahead`): the
        /// producer's thread did not wait for a create or an allocation.
        rotations_ahead: u64 = counted, counter "rotations_ahead_total"
            "Rotations that found their segment opened ahead of need.";
        /// Record bytes accepted by writers (payload, without framing).
        bytes_written: u64 = counted, counter "bytes_written_total"
            "Record bytes accepted by writers.";
        /// Records accepted by writers.
        records_written: u64 = counted, counter "records_written_total"
            "Records accepted by writers.";
        /// Record bytes handed out by readers.
        bytes_read: u64 = counted, counter "bytes_read_total" "Record bytes handed out by readers.";
        /// Records handed out by readers.
        records_read: u64 = counted, counter "records_read_total" "Records handed out by readers.";
        /// Spills that ended in `Aborted` (writer or reader saw its scope closed).
        aborts_observed: u64 = counted, counter "aborts_observed_total"
            "Spills that ended in Aborted.";
        /// Files a writer created after its scope was closed, and deleted itself (the
        /// write-after-delete window, closed).
        late_files_deleted: u64 = counted, counter "late_files_deleted_total"
            "Files created after an abort and deleted by their writer.";
        /// Files whose delete was confirmed.
        files_deleted: u64 = counted, counter "files_deleted_total" "Confirmed deletes.";
        /// Deletes that found the file already absent (counted as confirmed).
        files_already_absent: u64 = counted, counter "files_already_absent_total"
            "Deletes that found the file absent.";
        /// Deletes that failed with an outcome other than success or "absent".
        delete_failures: u64 = counted, counter "delete_failures_total"
            "Deletes with an unknown outcome.";
        /// Writes that failed.
        write_failures: u64 = counted, counter "write_failures_total" "Writes that failed.";
        /// Deletes queued to an I/O thread and not yet completed.
        deletes_in_flight: u64 = counted, gauge "deletes_in_flight"
            "Deletes queued and not completed.";
        /// Name-only records waiting in the cleanup worker.
        cleanup_pending: u64 = sampled, gauge "cleanup_pending"
            "Name-only records waiting in the cleanup worker.";
        /// Age in seconds of the oldest pending cleanup record (sampled at most once a second).
        cleanup_oldest_age_secs: f64 = sampled, gauge "cleanup_oldest_age_seconds"
            "Age of the oldest pending cleanup record.";
        /// Cleanup attempts that failed and were rotated to the back of the queue.
        cleanup_retries: u64 = counted, counter "cleanup_retries_total" "Failed cleanup attempts.";
        /// Cleanup records whose delete was confirmed by the worker.
        cleanup_released: u64 = counted, counter "cleanup_released_total"
            "Cleanup records confirmed deleted.";
        /// Directories of dead processes swept at open.
        orphan_dirs_swept: u64 = counted, counter "orphan_dirs_swept_total"
            "Dead processes' directories swept.";
        /// Files found in swept directories and deleted.
        orphan_files_swept: u64 = counted, counter "orphan_files_swept_total"
            "Files deleted from swept directories.";
        /// Times a root was skipped after a failing create.
        root_skips: u64 = counted, counter "root_skips_total" "Times a failing root was skipped.";
        /// Configured roots that failed at open (read-only, no permission, a device error) and
        /// that this engine does not use (a warning was logged for each).
        roots_unusable: u64 = counted, gauge "roots_unusable"
            "Configured roots that failed at open and are not used.";
        /// Segment files handed to the caller by `SpilledState::publish`.
        files_published: u64 = counted, counter "files_published_total"
            "Segment files published to the caller.";
        /// Released segment files the pool holds for reuse (each holds a ticket).
        pool_segments: u64 = sampled, gauge "pool_segments" "Released segment files held for reuse.";
        /// Bytes those files hold on disk (counted in `spill_bytes_in_use`).
        pool_bytes: u64 = sampled, gauge "pool_bytes" "Bytes the pooled files hold on disk.";
        /// Bytes of staging buffers mapped now: held by writers, in flight, or free for reuse
        /// (within `max_buffer_memory`).
        staging_buffer_bytes: u64 = sampled, gauge "staging_buffer_bytes"
            "Bytes of staging buffers mapped (held, in flight or free).";
        /// Bytes of segment maps kept with pooled files now (within `max_read_memory`).
        kept_map_bytes: u64 = sampled, gauge "kept_map_bytes"
            "Bytes of segment maps kept with pooled files.";
        /// Segment fds the engine holds open now (within `max_open_files` and half the soft
        /// `RLIMIT_NOFILE`).
        open_fds: u64 = sampled, gauge "open_fds" "Segment fds the engine holds open.";
        /// Segments a writer took from the pool (no create, no allocation).
        pool_hits: u64 = counted, counter "pool_hits_total" "Segments reused from the pool.";
        /// Segments a writer created because the pool had none for its root.
        pool_misses: u64 = counted, counter "pool_misses_total"
            "Segments created because the pool had none.";
        /// Writes a blocking `finish` made on its caller's thread, which waits for them anyway:
        /// the segment's last staged write, or a queued write the writer took back before an I/O
        /// thread started it (two thread wake-ups saved each).
        writes_inline: u64 = counted, counter "writes_inline_total"
            "Writes a blocking finish made on its caller's thread.";
        /// Pooled files deleted: past the pool's bounds, under ledger or quota pressure, by
        /// `Engine::trim_pool`, or at shutdown.
        pool_trims: u64 = counted, counter "pool_trims_total" "Pooled files deleted.";
        /// Bytes of records and their frames sealed into blocks, before compression.
        logical_bytes_written: u64 = counted, counter "logical_bytes_written_total"
            "Bytes of records and their frames sealed into blocks, before compression.";
        /// Bytes of blocks as written (headers and stored bytes, after compression).
        physical_bytes_written: u64 = counted, counter "physical_bytes_written_total"
            "Bytes of blocks as written (headers and stored bytes, after compression).";
        /// Bytes of blocks' records once decoded by readers.
        logical_bytes_read: u64 = counted, counter "logical_bytes_read_total"
            "Bytes of blocks' records once decoded by readers.";
        /// Bytes of blocks as read by readers (headers and stored bytes).
        physical_bytes_read: u64 = counted, counter "physical_bytes_read_total"
            "Bytes of blocks as read by readers (headers and stored bytes).";
        /// Blocks stored raw.
        blocks_raw: u64 = counted, counter "blocks_raw_total" "Blocks stored raw.";
        /// Blocks stored with lz4.
        blocks_lz4: u64 = counted, counter "blocks_lz4_total" "Blocks stored with lz4.";
        /// Blocks stored with zstd.
        blocks_zstd: u64 = counted, counter "blocks_zstd_total" "Blocks stored with zstd.";
        /// Nanoseconds spent compressing (trials of Auto included).
        compress_nanos: u64 = counted, counter "compress_nanos_total"
            "Nanoseconds spent compressing (trials of Auto included).";
        /// Nanoseconds spent decompressing.
        decompress_nanos: u64 = counted, counter "decompress_nanos_total"
            "Nanoseconds spent decompressing.";
        /// Nanoseconds spent encrypting blocks (0 without `encryption`).
        encrypt_nanos: u64 = counted, counter "encrypt_nanos_total"
            "Nanoseconds spent encrypting blocks (0 without `encryption`).";
        /// Nanoseconds spent decrypting blocks (0 without `encryption`).
        decrypt_nanos: u64 = counted, counter "decrypt_nanos_total"
            "Nanoseconds spent decrypting blocks (0 without `encryption`).";
    }
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
