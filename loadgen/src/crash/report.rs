//! The report of a crash series: the JSON report and the printed summary.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::args::Backend;
use crate::report::{Leaks, ReportHead, lat_cell, table};
use crate::stats::{LatSummary, Violation};

#[derive(Debug, Serialize)]
pub struct CrashReport {
    #[serde(flatten)]
    pub head: ReportHead,
    /// `--backend`: `auto`, or the backend that had to run.
    pub backend_requested: Backend,
    /// The backend the engines that swept after each kill ran on ("io_uring" or "psync").
    pub backend: String,
    pub elapsed_secs: f64,
    pub kills: u64,
    /// Segment files of the killed children on disk right after their deaths.
    pub orphan_files_total: u64,
    pub orphan_files_swept: u64,
    pub kill_reports: Vec<KillReport>,
    pub latency: BTreeMap<&'static str, LatSummary>,
    pub bystander_ok: bool,
    pub leaks: Leaks,
    pub violation_count: u64,
    pub violations: Vec<Violation>,
    pub passed: bool,
}

#[derive(Debug, Serialize)]
pub struct KillReport {
    pub kill: u32,
    pub child_pid: u32,
    pub dead_engine: String,
    /// How long the child ran after its first segment file appeared.
    pub delay_ms: u64,
    pub segment_files_at_kill: u64,
    pub task_dirs_at_kill: u64,
    pub published_files_at_kill: u64,
    /// Orphan files the next engine's sweep deleted (its metric).
    pub orphan_files_swept: u64,
    /// From the next engine's open until the root held nothing of the dead process.
    pub sweep_ms: f64,
    pub child_status: String,
}

pub(super) fn summary(r: &CrashReport) -> String {
    let rows = vec![
        ("seed".to_string(), r.head.seed.to_string()),
        ("commit".into(), r.head.commit.clone()),
        (
            "backend".into(),
            format!(
                "{} (--backend {})",
                r.backend,
                crate::args::value_name(r.backend_requested)
            ),
        ),
        ("elapsed".into(), format!("{:.1} s", r.elapsed_secs)),
        ("kills".into(), r.kills.to_string()),
        (
            "segment files at the kills".into(),
            format!(
                "{} (swept by the next open: {})",
                r.orphan_files_total, r.orphan_files_swept
            ),
        ),
        ("open-to-clean sweep".into(), lat_cell(&r.latency["sweep"])),
        ("bystander spill intact".into(), r.bystander_ok.to_string()),
        (
            "leaks".into(),
            format!(
                "files {}, dirs {}, fds {}, maps {}",
                r.leaks.files, r.leaks.dirs, r.leaks.fds, r.leaks.maps
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
    table(&format!("loadgen crash `{}`", r.head.name), &rows)
}
