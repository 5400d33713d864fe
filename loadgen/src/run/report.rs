//! The report of a run: the counters taken once the workers are done ([`Tally`]), the JSON
//! report built from them and from the checks ([`build`]), and the printed summary.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use spillring::{Metrics, ShutdownReport};

use super::drain::{AfterEngine, Checked};
use super::drive::Driven;
use super::setup::Setup;
use crate::args::{AbortPoint, Backend, RunArgs};
use crate::report::{self, Leaks, ReportHead, lat_cell, mib, table};
use crate::stats::{Counters, LatSummary, Violation, summarize};

/// The JSON report of a run.
#[derive(Debug, Serialize)]
pub struct RunReport {
    #[serde(flatten)]
    pub head: ReportHead,
    pub engine_id: String,
    /// `--backend`: `auto`, or the backend that had to run.
    pub backend_requested: Backend,
    /// The backend that ran: "io_uring" or "psync".
    pub backend: String,
    pub elapsed_secs: f64,
    pub ops: OpsReport,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub records_written: u64,
    pub records_read: u64,
    pub throughput: Throughput,
    pub aborts_total: u64,
    pub aborts_by_point: BTreeMap<&'static str, u64>,
    pub abort_windows: Windows,
    pub hand_off_windows: Windows,
    pub faults_total: u64,
    pub faults_injected: BTreeMap<&'static str, u64>,
    pub errors_seen: BTreeMap<String, BTreeMap<&'static str, u64>>,
    pub latency: BTreeMap<&'static str, LatSummary>,
    pub tickets_high_water: u64,
    /// Most fds open at once during the run (sampled every 200 ms, above the process's own).
    pub fds_peak: u64,
    /// When that peak was seen, seconds into the run.
    pub fds_peak_at_secs: f64,
    pub cleanup_retries: u64,
    pub late_files_deleted: u64,
    pub engine: Option<Metrics>,
    pub shutdown: Option<ShutdownReport>,
    pub leaks: Leaks,
    pub violation_count: u64,
    pub violations: Vec<Violation>,
    pub passed: bool,
}

#[derive(Debug, Serialize)]
pub struct OpsReport {
    pub done: u64,
    pub thread: u64,
    #[serde(rename = "async")]
    pub async_: u64,
    pub normal: u64,
    pub read_back: u64,
    pub published: u64,
    pub published_files: u64,
    pub failed_by_fault: u64,
    pub gave_up_admission: u64,
    pub admission_retries: u64,
    pub cross_thread_cancels: u64,
    pub kept_records_checked: u64,
    /// Records kept until after the engine was dropped, then checked.
    pub records_outliving_engine: u64,
}

#[derive(Debug, Serialize)]
pub struct Throughput {
    pub write_mib_s: f64,
    pub read_mib_s: f64,
    pub ops_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Windows {
    /// Aborts that landed exactly between a file creation and the abort check.
    pub reached: u64,
    /// After-create aborts whose writer failed (a fault) before reaching the window.
    pub missed: u64,
}

/// What the workers did, taken from the counters once the engine has shut down (before it is
/// dropped).
#[derive(Debug)]
pub(super) struct Tally {
    engine_id: String,
    backend: String,
    secs: f64,
    latency: BTreeMap<&'static str, LatSummary>,
    aborts_by_point: BTreeMap<&'static str, u64>,
    ops: OpsReport,
    bytes_written: u64,
    bytes_read: u64,
    records_written: u64,
    records_read: u64,
    throughput: Throughput,
    windows: Windows,
    hand_off_windows: Windows,
    aborts_total: u64,
    errors_seen: BTreeMap<String, BTreeMap<&'static str, u64>>,
}

impl Tally {
    pub(super) fn take(s: &Setup, abort_to_clean: &Histogram<u64>, elapsed: Duration) -> Tally {
        let (engine, ctx) = (&s.engine, &s.ctx);
        let stats = &ctx.stats;
        let engine_id = format!("{:016x}", engine.id());
        let backend = s.backend.to_owned();
        let c = &stats.c;
        let hists = stats
            .hists
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut latency = BTreeMap::new();
        latency.insert("write_enqueue", summarize(&hists.write_enqueue));
        latency.insert("segment_rotation", summarize(&hists.segment_rotation));
        latency.insert("finish", summarize(&hists.finish));
        latency.insert("read", summarize(&hists.read));
        latency.insert("abort_to_clean", summarize(abort_to_clean));
        let aborts_by_point: BTreeMap<&'static str, u64> = AbortPoint::ALL
            .iter()
            .filter(|p| ctx.points.contains(p))
            .map(|p| (p.name(), Counters::get(&c.aborts[p.index()])))
            .collect();
        let secs = elapsed.as_secs_f64().max(1e-9);
        let mibs = |b: u64| b as f64 / (1u64 << 20) as f64 / secs;
        let ops = OpsReport {
            done: Counters::get(&c.ops_done),
            thread: Counters::get(&c.ops_thread),
            async_: Counters::get(&c.ops_async),
            normal: Counters::get(&c.ops_normal),
            read_back: Counters::get(&c.ops_read_back),
            published: Counters::get(&c.ops_published),
            published_files: Counters::get(&c.published_files),
            failed_by_fault: Counters::get(&c.ops_failed_by_fault),
            gave_up_admission: Counters::get(&c.ops_gave_up_admission),
            admission_retries: Counters::get(&c.admission_retries),
            cross_thread_cancels: Counters::get(&c.cross_thread_cancels),
            kept_records_checked: Counters::get(&c.kept_records_checked),
            records_outliving_engine: 0,
        };
        let bytes_written = Counters::get(&c.bytes_written);
        let bytes_read = Counters::get(&c.bytes_read);
        let records_written = Counters::get(&c.records_written);
        let records_read = Counters::get(&c.records_read);
        let throughput = Throughput {
            write_mib_s: mibs(bytes_written),
            read_mib_s: mibs(bytes_read),
            ops_per_s: ops.done as f64 / secs,
        };
        let windows = Windows {
            reached: Counters::get(&c.windows_reached),
            missed: Counters::get(&c.windows_missed),
        };
        let hand_off_windows = Windows {
            reached: Counters::get(&c.handoff_reached),
            missed: Counters::get(&c.handoff_missed),
        };
        let aborts_total = c.aborts_total();
        let errors_seen = stats.errors();
        Tally {
            engine_id,
            backend,
            secs,
            latency,
            aborts_by_point,
            ops,
            bytes_written,
            bytes_read,
            records_written,
            records_read,
            throughput,
            windows,
            hand_off_windows,
            aborts_total,
            errors_seen,
        }
    }
}

/// The JSON report of a run, from its tally and its checks.
pub(super) fn build(
    a: &RunArgs,
    seed: u64,
    root: &Path,
    t: Tally,
    driven: &Driven,
    checked: Checked,
    after: AfterEngine,
) -> RunReport {
    let w = &a.workload;
    let Checked {
        faults_injected,
        leaks,
        metrics,
        shutdown,
        ..
    } = checked;
    let mut ops = t.ops;
    ops.records_outliving_engine = after.survivors_checked as u64;
    RunReport {
        head: report::ReportHead::new("run", &a.name, seed, root, w),
        engine_id: t.engine_id,
        backend_requested: w.backend,
        backend: t.backend,
        elapsed_secs: t.secs,
        ops,
        bytes_written: t.bytes_written,
        bytes_read: t.bytes_read,
        records_written: t.records_written,
        records_read: t.records_read,
        throughput: t.throughput,
        aborts_total: t.aborts_total,
        aborts_by_point: t.aborts_by_point,
        abort_windows: t.windows,
        hand_off_windows: t.hand_off_windows,
        faults_total: faults_injected.values().sum(),
        faults_injected,
        errors_seen: t.errors_seen,
        latency: t.latency,
        tickets_high_water: metrics.tickets_high_water,
        fds_peak: driven.fds_peak,
        fds_peak_at_secs: driven.fds_peak_at,
        cleanup_retries: metrics.cleanup_retries,
        late_files_deleted: metrics.late_files_deleted,
        engine: Some(metrics),
        shutdown: Some(shutdown),
        passed: after.violation_count == 0 && leaks.total() == 0,
        leaks,
        violation_count: after.violation_count,
        violations: after.violations,
    }
}

pub(super) fn print_summary(r: &RunReport) -> String {
    let mut rows: Vec<(String, String)> = vec![
        ("seed".into(), r.head.seed.to_string()),
        ("commit".into(), r.head.commit.clone()),
        (
            "backend / mode".into(),
            format!(
                "{} (--backend {}) / {}",
                r.backend,
                crate::args::value_name(r.backend_requested),
                serde_json::to_value(r.head.config.mode)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ),
        ),
        ("elapsed".into(), format!("{:.1} s", r.elapsed_secs)),
        (
            "ops".into(),
            format!(
                "{} ({} thread, {} async; {} normal, {} read back, {} published, {} failed by a fault, {} gave up on admission)",
                r.ops.done,
                r.ops.thread,
                r.ops.async_,
                r.ops.normal,
                r.ops.read_back,
                r.ops.published,
                r.ops.failed_by_fault,
                r.ops.gave_up_admission
            ),
        ),
        (
            "written / read".into(),
            format!(
                "{} / {} ({:.0} / {:.0} MiB/s)",
                mib(r.bytes_written),
                mib(r.bytes_read),
                r.throughput.write_mib_s,
                r.throughput.read_mib_s
            ),
        ),
        (
            "aborts".into(),
            format!(
                "{} ({})",
                r.aborts_total,
                r.aborts_by_point
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        (
            "create-window aborts".into(),
            format!(
                "{} reached, {} missed (writer failed first); late files deleted by their writer: {}",
                r.abort_windows.reached, r.abort_windows.missed, r.late_files_deleted
            ),
        ),
        (
            "hand-off-window aborts".into(),
            format!(
                "{} reached, {} missed",
                r.hand_off_windows.reached, r.hand_off_windows.missed
            ),
        ),
        (
            "faults injected".into(),
            format!(
                "{} ({})",
                r.faults_total,
                r.faults_injected
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        (
            "write enqueue".into(),
            lat_cell(&r.latency["write_enqueue"]),
        ),
        (
            "segment rotation".into(),
            lat_cell(&r.latency["segment_rotation"]),
        ),
        ("finish".into(), lat_cell(&r.latency["finish"])),
        ("read (per record)".into(), lat_cell(&r.latency["read"])),
        (
            "abort-to-clean".into(),
            lat_cell(&r.latency["abort_to_clean"]),
        ),
        (
            "tickets high-water".into(),
            r.tickets_high_water.to_string(),
        ),
        (
            "open fds peak".into(),
            format!("{} (at {:.1} s)", r.fds_peak, r.fds_peak_at_secs),
        ),
        ("cleanup retries".into(), r.cleanup_retries.to_string()),
        (
            "leaks".into(),
            format!(
                "files {}, tickets {}, dirs {}, fds {}, maps {}, published missing {}",
                r.leaks.files,
                r.leaks.tickets,
                r.leaks.dirs,
                r.leaks.fds,
                r.leaks.maps,
                r.leaks.published_missing
            ),
        ),
        ("violations".into(), r.violation_count.to_string()),
        (
            "result".into(),
            if r.passed {
                "PASSED".into()
            } else {
                "FAILED".into()
            },
        ),
    ];
    if !r.passed {
        for v in r.violations.iter().take(10) {
            rows.push(("violation".into(), v.to_string()));
        }
    }
    table(&format!("loadgen run `{}`", r.head.name), &rows)
}
