//! What a run counts: op outcomes, aborts by point, errors seen by stage and kind, latency
//! histograms, and the violations of the invariants.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use spillring::SpillError;

use crate::args::AbortPoint;
use crate::progress::Out;

/// Relaxed counters, updated by every worker.
#[derive(Debug, Default)]
pub struct Counters {
    pub ops_started: AtomicU64,
    pub ops_done: AtomicU64,
    pub ops_thread: AtomicU64,
    pub ops_async: AtomicU64,
    pub ops_normal: AtomicU64,
    pub ops_read_back: AtomicU64,
    pub ops_published: AtomicU64,
    pub published_files: AtomicU64,
    pub published_deleted_by_loadgen: AtomicU64,
    pub ops_failed_by_fault: AtomicU64,
    pub ops_gave_up_admission: AtomicU64,
    pub admission_retries: AtomicU64,
    pub bytes_written: AtomicU64,
    pub records_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub records_read: AtomicU64,
    pub windows_reached: AtomicU64,
    pub windows_missed: AtomicU64,
    pub cross_thread_cancels: AtomicU64,
    pub kept_records_checked: AtomicU64,
    pub handoff_reached: AtomicU64,
    pub handoff_missed: AtomicU64,
    pub aborts: [AtomicU64; 7],
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub fn aborts_total(&self) -> u64 {
        self.aborts.iter().map(Counters::get).sum()
    }
}

/// One broken invariant: what, where, and the op that saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub kind: &'static str,
    pub what: String,
    #[serde(rename = "where")]
    pub at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<u64>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VIOLATION [{}] {} at {}", self.kind, self.what, self.at)?;
        if let Some(op) = self.op {
            write!(f, " (op {op}, task op{op})")?;
        }
        Ok(())
    }
}

/// Latency histograms, in nanoseconds.
#[derive(Debug, Clone)]
pub struct Hists {
    pub write_enqueue: Histogram<u64>,
    pub segment_rotation: Histogram<u64>,
    pub finish: Histogram<u64>,
    pub read: Histogram<u64>,
}

pub fn new_hist() -> Histogram<u64> {
    // 1 ns to 10 minutes at three significant digits; values past the top are clamped.
    Histogram::new_with_bounds(1, 600_000_000_000, 3).unwrap_or_else(|_| {
        Histogram::new(3).unwrap_or_else(|_| unreachable!("three significant digits are valid"))
    })
}

pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_nanos() as u64).max(1));
}

impl Default for Hists {
    fn default() -> Self {
        Hists {
            write_enqueue: new_hist(),
            segment_rotation: new_hist(),
            finish: new_hist(),
            read: new_hist(),
        }
    }
}

impl Hists {
    pub fn merge(&mut self, o: &Hists) {
        let _ = self.write_enqueue.add(&o.write_enqueue);
        let _ = self.segment_rotation.add(&o.segment_rotation);
        let _ = self.finish.add(&o.finish);
        let _ = self.read.add(&o.read);
    }
}

/// A latency histogram's summary, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatSummary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

pub fn summarize(h: &Histogram<u64>) -> LatSummary {
    let us = |v: u64| v as f64 / 1000.0;
    if h.is_empty() {
        return LatSummary {
            count: 0,
            mean_us: 0.0,
            p50_us: 0.0,
            p90_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
        };
    }
    LatSummary {
        count: h.len(),
        mean_us: h.mean() / 1000.0,
        p50_us: us(h.value_at_quantile(0.50)),
        p90_us: us(h.value_at_quantile(0.90)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
    }
}

/// Everything a run counts, shared by its workers.
#[derive(Debug, Default)]
pub struct Stats {
    pub c: Counters,
    errors: Mutex<BTreeMap<String, BTreeMap<&'static str, u64>>>,
    violations: Mutex<Vec<Violation>>,
    violation_count: AtomicU64,
    fds_peak: AtomicU64,
    pub hists: Mutex<Hists>,
}

/// Most violations kept for the report (all are counted and printed).
const KEEP_VIOLATIONS: usize = 500;

/// The name of an error's variant, for tallies.
pub fn error_kind(e: &SpillError) -> &'static str {
    match e {
        SpillError::Aborted => "Aborted",
        SpillError::Closed { .. } => "Closed",
        SpillError::LedgerFull { .. } => "LedgerFull",
        SpillError::QuotaExceeded { .. } => "QuotaExceeded",
        SpillError::StorageFull { .. } => "StorageFull",
        SpillError::Corrupt { .. } => "Corrupt",
        SpillError::Io { .. } => "Io",
        SpillError::InvalidConfig { .. } => "InvalidConfig",
        SpillError::RecordTooLarge { .. } => "RecordTooLarge",
        SpillError::TooManyOpenFiles { .. } => "TooManyOpenFiles",
        SpillError::InvalidName { .. } => "InvalidName",
        SpillError::StateShared { .. } => "StateShared",
        SpillError::SegmentsExhausted { .. } => "SegmentsExhausted",
        SpillError::WriterFailed => "WriterFailed",
        SpillError::WriteFutureDropped => "WriteFutureDropped",
        SpillError::WriterCannotFit { .. } => "WriterCannotFit",
        SpillError::RootNotADirectory { .. } => "RootNotADirectory",
        _ => "Other",
    }
}

impl Stats {
    pub fn abort(&self, p: AbortPoint) {
        Counters::add(&self.c.aborts[p.index()], 1);
    }

    /// Tallies an error returned by the engine at `stage`.
    pub fn error(&self, stage: &str, e: &SpillError) {
        let mut m = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(stage.to_owned())
            .or_default()
            .entry(error_kind(e))
            .or_default() += 1;
    }

    pub fn errors(&self) -> BTreeMap<String, BTreeMap<&'static str, u64>> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records and prints a violation.
    pub fn violation(&self, out: &Out, v: Violation) {
        out.line(&v.to_string());
        self.violation_count.fetch_add(1, Ordering::Relaxed);
        let mut vs = self.violations.lock().unwrap_or_else(|p| p.into_inner());
        if vs.len() < KEEP_VIOLATIONS {
            vs.push(v);
        }
    }

    pub fn set_fds_peak(&self, n: u64) {
        self.fds_peak.fetch_max(n, Ordering::Relaxed);
    }

    pub fn fds_peak(&self) -> u64 {
        self.fds_peak.load(Ordering::Relaxed)
    }

    pub fn violation_count(&self) -> u64 {
        self.violation_count.load(Ordering::Relaxed)
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn merge_hists(&self, h: &Hists) {
        self.hists
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .merge(h);
    }
}
