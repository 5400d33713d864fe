//! The Prometheus text of a [`Metrics`] snapshot.

use super::Metrics;
use super::latency::{LATENCY_BUCKETS, latency_bucket_bound};
use std::fmt::Write as _;

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
        let rows: [(&str, &str, &str, f64); 48] = [
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
                "staging_buffer_bytes",
                "gauge",
                "Bytes of staging buffers mapped (held, in flight or free).",
                self.staging_buffer_bytes as f64,
            ),
            (
                "kept_map_bytes",
                "gauge",
                "Bytes of segment maps kept with pooled files.",
                self.kept_map_bytes as f64,
            ),
            (
                "open_fds",
                "gauge",
                "Segment fds the engine holds open.",
                self.open_fds as f64,
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
                "writes_inline_total",
                "counter",
                "Writes a blocking finish made on its caller's thread.",
                self.writes_inline as f64,
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
        "# HELP spillring_errors_total Errors writers and readers returned, by kind.\n# TYPE spillring_errors_total counter"
    );
    for (kind, n) in &m.errors {
        let _ = writeln!(out, "spillring_errors_total{{kind=\"{kind}\"}} {n}");
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("/a\"b\\c\nd"), "/a\\\"b\\\\c\\nd");
    }
}
