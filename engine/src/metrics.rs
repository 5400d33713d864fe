//! Engine metrics: relaxed atomic counters updated on the paths they count, read as one
//! [`Metrics`] snapshot that also renders as Prometheus text.

use crate::config::{Backend, WriteMode};
use std::fmt::Write as _;
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
    /// Gauge: deletes queued to an I/O thread and not yet completed.
    pub deletes_in_flight: AtomicU64,
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
    /// Segments a writer created because the pool had none for its root.
    pub pool_misses: u64,
    /// Pooled files deleted: past the pool's bounds, under ledger or quota pressure, by
    /// `Engine::trim_pool`, or at shutdown.
    pub pool_trims: u64,
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

impl Metrics {
    /// Renders the snapshot in the Prometheus text exposition format, names prefixed
    /// `spillring_`.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::with_capacity(4096);
        let _ = writeln!(
            out,
            "# HELP spillring_info Which backend and write mode run.\n# TYPE spillring_info gauge\nspillring_info{{backend=\"{}\",write_mode=\"{}\"}} 1",
            self.backend, self.write_mode
        );
        let rows: [(&str, &str, &str, f64); 44] = [
            (
                "tickets_used",
                "gauge",
                "Segment files on disk the engine must still delete.",
                self.tickets_used as f64,
            ),
            (
                "tickets_high_water",
                "gauge",
                "Most tickets held at once.",
                self.tickets_high_water as f64,
            ),
            (
                "ticket_capacity",
                "gauge",
                "Ledger capacity.",
                self.ticket_capacity as f64,
            ),
            (
                "admission_failures_total",
                "counter",
                "Reservations refused: ledger full.",
                self.admission_failures as f64,
            ),
            (
                "quota_failures_total",
                "counter",
                "Reservations refused: byte quota.",
                self.quota_failures as f64,
            ),
            (
                "spill_bytes_in_use",
                "gauge",
                "Disk bytes held by live segments.",
                self.spill_bytes_in_use as f64,
            ),
            (
                "segments_created_total",
                "counter",
                "Segment files created.",
                self.segments_created as f64,
            ),
            (
                "bytes_written_total",
                "counter",
                "Record bytes accepted by writers.",
                self.bytes_written as f64,
            ),
            (
                "records_written_total",
                "counter",
                "Records accepted by writers.",
                self.records_written as f64,
            ),
            (
                "bytes_read_total",
                "counter",
                "Record bytes handed out by readers.",
                self.bytes_read as f64,
            ),
            (
                "records_read_total",
                "counter",
                "Records handed out by readers.",
                self.records_read as f64,
            ),
            (
                "aborts_observed_total",
                "counter",
                "Spills that ended in Aborted.",
                self.aborts_observed as f64,
            ),
            (
                "late_files_deleted_total",
                "counter",
                "Files created after an abort and deleted by their writer.",
                self.late_files_deleted as f64,
            ),
            (
                "files_deleted_total",
                "counter",
                "Confirmed deletes.",
                self.files_deleted as f64,
            ),
            (
                "files_already_absent_total",
                "counter",
                "Deletes that found the file absent.",
                self.files_already_absent as f64,
            ),
            (
                "delete_failures_total",
                "counter",
                "Deletes with an unknown outcome.",
                self.delete_failures as f64,
            ),
            (
                "write_failures_total",
                "counter",
                "Writes that failed.",
                self.write_failures as f64,
            ),
            (
                "deletes_in_flight",
                "gauge",
                "Deletes queued and not completed.",
                self.deletes_in_flight as f64,
            ),
            (
                "cleanup_pending",
                "gauge",
                "Name-only records waiting in the cleanup worker.",
                self.cleanup_pending as f64,
            ),
            (
                "cleanup_oldest_age_seconds",
                "gauge",
                "Age of the oldest pending cleanup record.",
                self.cleanup_oldest_age_secs,
            ),
            (
                "cleanup_retries_total",
                "counter",
                "Failed cleanup attempts.",
                self.cleanup_retries as f64,
            ),
            (
                "cleanup_released_total",
                "counter",
                "Cleanup records confirmed deleted.",
                self.cleanup_released as f64,
            ),
            (
                "orphan_dirs_swept_total",
                "counter",
                "Dead processes' directories swept.",
                self.orphan_dirs_swept as f64,
            ),
            (
                "orphan_files_swept_total",
                "counter",
                "Files deleted from swept directories.",
                self.orphan_files_swept as f64,
            ),
            (
                "root_skips_total",
                "counter",
                "Times a failing root was skipped.",
                self.root_skips as f64,
            ),
            (
                "roots_unusable",
                "gauge",
                "Configured roots that failed at open and are not used.",
                self.roots_unusable as f64,
            ),
            (
                "files_published_total",
                "counter",
                "Segment files published to the caller.",
                self.files_published as f64,
            ),
            (
                "pool_segments",
                "gauge",
                "Released segment files held for reuse.",
                self.pool_segments as f64,
            ),
            (
                "pool_bytes",
                "gauge",
                "Bytes the pooled files hold on disk.",
                self.pool_bytes as f64,
            ),
            (
                "pool_hits_total",
                "counter",
                "Segments reused from the pool.",
                self.pool_hits as f64,
            ),
            (
                "pool_misses_total",
                "counter",
                "Segments created because the pool had none.",
                self.pool_misses as f64,
            ),
            (
                "pool_trims_total",
                "counter",
                "Pooled files deleted.",
                self.pool_trims as f64,
            ),
            (
                "logical_bytes_written_total",
                "counter",
                "Bytes of records and their frames sealed into blocks, before compression.",
                self.logical_bytes_written as f64,
            ),
            (
                "physical_bytes_written_total",
                "counter",
                "Bytes of blocks as written (headers and stored bytes, after compression).",
                self.physical_bytes_written as f64,
            ),
            (
                "logical_bytes_read_total",
                "counter",
                "Bytes of blocks' records once decoded by readers.",
                self.logical_bytes_read as f64,
            ),
            (
                "physical_bytes_read_total",
                "counter",
                "Bytes of blocks as read by readers (headers and stored bytes).",
                self.physical_bytes_read as f64,
            ),
            (
                "blocks_raw_total",
                "counter",
                "Blocks stored raw.",
                self.blocks_raw as f64,
            ),
            (
                "blocks_lz4_total",
                "counter",
                "Blocks stored with lz4.",
                self.blocks_lz4 as f64,
            ),
            (
                "blocks_zstd_total",
                "counter",
                "Blocks stored with zstd.",
                self.blocks_zstd as f64,
            ),
            (
                "compress_nanos_total",
                "counter",
                "Nanoseconds spent compressing (trials of Auto included).",
                self.compress_nanos as f64,
            ),
            (
                "decompress_nanos_total",
                "counter",
                "Nanoseconds spent decompressing.",
                self.decompress_nanos as f64,
            ),
            (
                "encrypt_nanos_total",
                "counter",
                "Nanoseconds spent encrypting blocks (0 without `encryption`).",
                self.encrypt_nanos as f64,
            ),
            (
                "decrypt_nanos_total",
                "counter",
                "Nanoseconds spent decrypting blocks (0 without `encryption`).",
                self.decrypt_nanos as f64,
            ),
            (
                "tickets_free",
                "gauge",
                "Tickets that can still be reserved.",
                (self.ticket_capacity - self.tickets_used.min(self.ticket_capacity)) as f64,
            ),
        ];
        for (name, kind, help, v) in rows {
            let _ = writeln!(
                out,
                "# HELP spillring_{name} {help}\n# TYPE spillring_{name} {kind}\nspillring_{name} {v}"
            );
        }
        out
    }
}
