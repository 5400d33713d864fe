//! Engine metrics: relaxed atomic counters updated on the paths they count, read as one
//! [`Metrics`] snapshot that also renders as Prometheus text.

use crate::config::{Backend, WriteMode};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

// ---- Latency histograms and per-root usage (operators' view). Kept in one block of its own.

/// Finite buckets of every latency histogram: upper bounds of 2^i microseconds, i = 0..=23
/// (1 µs to about 8.4 s), then `+Inf`.
pub const LATENCY_BUCKETS: usize = 24;

/// The upper bound of finite bucket `i` (`i < LATENCY_BUCKETS`) in seconds: 2^i µs.
pub fn latency_bucket_bound(i: usize) -> f64 {
    (1u64 << i.min(63)) as f64 * 1e-6
}

/// A latency histogram of fixed buckets: one relaxed atomic add per bucket and one for the
/// sum, no lock, no allocation.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Per bucket (not cumulative): `LATENCY_BUCKETS` finite ones, then the overflow.
    counts: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
}

/// The bucket a latency of `ns` nanoseconds falls in: the first `i` with `ns <= 2^i µs`, or
/// `LATENCY_BUCKETS` (the overflow) past the last.
#[inline]
fn bucket_of(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    if us <= 1 {
        return 0;
    }
    // ceil(log2(us)) for us >= 2.
    let i = (64 - (us - 1).leading_zeros()) as usize;
    i.min(LATENCY_BUCKETS)
}

impl Histogram {
    /// Counts one latency.
    #[inline]
    pub(crate) fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts the time since `start`.
    #[inline]
    pub(crate) fn record_since(&self, start: Instant) {
        self.record(start.elapsed());
    }

    /// The histogram now: cumulative counts (each bucket read once, so `count` is their sum).
    pub(crate) fn snapshot(&self) -> LatencyHistogram {
        let mut cumulative = [0u64; LATENCY_BUCKETS + 1];
        let mut acc = 0u64;
        for (c, out) in self.counts.iter().zip(cumulative.iter_mut()) {
            acc += c.load(Ordering::Relaxed);
            *out = acc;
        }
        LatencyHistogram {
            cumulative,
            count: acc,
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

/// The engine's latency histograms, one per stage.
#[derive(Debug, Default)]
pub(crate) struct Latencies {
    /// The caller's time in `SpillWriter::write`, `write_slice` and `write_async`, and in a
    /// slot's `record` plus its `commit`.
    pub write: Histogram,
    /// Opening a segment (a rotation): ticket, create or pooled reuse, allocation, abort check.
    pub rotate: Histogram,
    /// `SpillWriter::finish` / `finish_async`, start to hand-off.
    pub finish: Histogram,
    /// A reader opening a segment: open, `pread` or map, header check.
    pub read: Histogram,
    /// One unlink, from its batch's submission to its completion.
    pub delete: Histogram,
}

impl Latencies {
    pub(crate) fn snapshot(&self) -> LatencyMetrics {
        LatencyMetrics {
            write: self.write.snapshot(),
            rotate: self.rotate.snapshot(),
            finish: self.finish.snapshot(),
            read: self.read.snapshot(),
            delete: self.delete.snapshot(),
        }
    }
}

/// A snapshot of one latency histogram, with Prometheus's cumulative buckets.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LatencyHistogram {
    /// `cumulative[i]`: observations of at most [`latency_bucket_bound`]`(i)` seconds for
    /// `i < LATENCY_BUCKETS`; the last entry counts every observation (`le="+Inf"`).
    pub cumulative: [u64; LATENCY_BUCKETS + 1],
    /// Observations.
    pub count: u64,
    /// Sum of the observed latencies, in seconds.
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    /// An upper bound of the `q` quantile (`0.0..=1.0`): the bound of the first bucket that
    /// holds it, `f64::INFINITY` in the overflow, `None` with no observation.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let i = self.cumulative.iter().position(|&c| c >= rank)?;
        Some(if i < LATENCY_BUCKETS {
            latency_bucket_bound(i)
        } else {
            f64::INFINITY
        })
    }
}

/// Latency histograms of a spill's stages.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LatencyMetrics {
    /// The caller's time in each `SpillWriter::write`, `write_slice` and `write_async`, and
    /// for a [`RecordSlot`](crate::RecordSlot) in its `record` call plus its `commit` (not the
    /// time the caller spends filling it): a copy into the staging buffer, a submission of a
    /// full buffer, a wait for in-flight budget, a rotation. A slot dropped uncommitted counts
    /// nothing.
    pub write: LatencyHistogram,
    /// Each segment rotation: ticket, create or pooled reuse, allocation and the abort check
    /// (on the caller's thread, or the offload pool for an async writer).
    pub rotate: LatencyHistogram,
    /// Each `SpillWriter::finish` / `finish_async` that got as far as its seal: draining the
    /// writes in flight, sealing, trimming, the hand-off.
    pub finish: LatencyHistogram,
    /// Each segment a reader opened: `open`, one `pread` or a map, the header check (the
    /// `next_record` calls that do no I/O are not counted: they cost a CRC check of memory).
    pub read: LatencyHistogram,
    /// Each unlink of a segment, from its batch's submission to an I/O thread (or to the
    /// cleanup worker's retry) to its completion, failed or not.
    pub delete: LatencyHistogram,
}

impl LatencyMetrics {
    /// The five histograms with their Prometheus names and help texts.
    pub fn named(&self) -> [(&'static str, &'static str, &LatencyHistogram); 5] {
        [
            (
                "write_latency_seconds",
                "Caller's time in SpillWriter::write.",
                &self.write,
            ),
            (
                "rotate_latency_seconds",
                "Segment rotations (open_segment).",
                &self.rotate,
            ),
            (
                "finish_latency_seconds",
                "SpillWriter::finish.",
                &self.finish,
            ),
            (
                "read_open_latency_seconds",
                "Reader segment opens (open, pread or map, header check).",
                &self.read,
            ),
            (
                "delete_latency_seconds",
                "Segment unlinks, submission to completion.",
                &self.delete,
            ),
        ]
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

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Appends the histograms and the per-root rows to a Prometheus text.
fn write_operator_rows(m: &Metrics, out: &mut String) {
    for (name, help, h) in m.latency.named() {
        let _ = writeln!(
            out,
            "# HELP spillring_{name} {help}\n# TYPE spillring_{name} histogram"
        );
        for (i, c) in h.cumulative.iter().enumerate() {
            if i < LATENCY_BUCKETS {
                let le = latency_bucket_bound(i);
                let _ = writeln!(out, "spillring_{name}_bucket{{le=\"{le}\"}} {c}");
            } else {
                let _ = writeln!(out, "spillring_{name}_bucket{{le=\"+Inf\"}} {c}");
            }
        }
        let _ = writeln!(
            out,
            "spillring_{name}_sum {}\nspillring_{name}_count {}",
            h.sum_seconds, h.count
        );
    }
    let _ = writeln!(
        out,
        "# HELP spillring_root_bytes Disk bytes of the files the engine owns under a root.\n# TYPE spillring_root_bytes gauge"
    );
    for r in &m.roots {
        let _ = writeln!(
            out,
            "spillring_root_bytes{{root=\"{}\"}} {}",
            label_value(&r.path.to_string_lossy()),
            r.bytes
        );
    }
    let _ = writeln!(
        out,
        "# HELP spillring_root_files Files the engine owns under a root.\n# TYPE spillring_root_files gauge"
    );
    for r in &m.roots {
        let _ = writeln!(
            out,
            "spillring_root_files{{root=\"{}\"}} {}",
            label_value(&r.path.to_string_lossy()),
            r.files
        );
    }
}

// ---- End of the latency histograms and per-root usage block.

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

impl Metrics {
    /// Renders the snapshot in the Prometheus text exposition format, names prefixed
    /// `spillring_`.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::with_capacity(16384);
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
        write_operator_rows(self, &mut out);
        out
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_latency_lands_in_the_first_bucket_that_holds_it() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_000), 0); // 1 µs: le 1 µs
        assert_eq!(bucket_of(1_001), 1); // just over: le 2 µs
        assert_eq!(bucket_of(2_000), 1);
        assert_eq!(bucket_of(2_001), 2);
        assert_eq!(bucket_of(1_000_000), 10); // 1 ms: le 1.024 ms
        assert_eq!(bucket_of(8_388_608_000), 23); // the last finite bound, 8.39 s
        assert_eq!(bucket_of(8_388_608_001), LATENCY_BUCKETS); // overflow
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS);
        for i in 0..LATENCY_BUCKETS {
            let bound_ns = (latency_bucket_bound(i) * 1e9).round() as u64;
            assert_eq!(
                bucket_of(bound_ns),
                i,
                "bound {i} belongs to its own bucket"
            );
            assert_eq!(
                bucket_of(bound_ns + 1),
                i + 1,
                "past bound {i} is the next one"
            );
        }
    }

    #[test]
    fn a_histogram_counts_sums_and_cumulates() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().count, 0);
        assert_eq!(h.snapshot().quantile_bound(0.5), None);
        h.record(Duration::from_nanos(500)); // bucket 0
        h.record(Duration::from_micros(3)); // bucket 2 (le 4 µs)
        h.record(Duration::from_micros(3));
        h.record(Duration::from_secs(20)); // overflow
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[1], 1);
        assert_eq!(s.cumulative[2], 3);
        assert_eq!(s.cumulative[LATENCY_BUCKETS - 1], 3);
        assert_eq!(s.cumulative[LATENCY_BUCKETS], 4);
        assert!((s.sum_seconds - (20.0 + 6e-6 + 5e-7)).abs() < 1e-9);
        assert_eq!(s.quantile_bound(0.25), Some(1e-6));
        assert_eq!(s.quantile_bound(0.5), Some(4e-6));
        assert_eq!(s.quantile_bound(1.0), Some(f64::INFINITY));
    }

    #[test]
    fn concurrent_records_lose_nothing() {
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        h.record(Duration::from_nanos(i * 997 + t));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = h.snapshot();
        assert_eq!(s.count, 40_000);
        assert_eq!(s.cumulative[LATENCY_BUCKETS], 40_000);
        assert!(s.cumulative.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("/a\"b\\c\nd"), "/a\\\"b\\\\c\\nd");
    }
}
