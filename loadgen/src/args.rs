//! The command line: `run`, `crash` and `summarize`, and the workload and engine flags that
//! `run` and `crash` share (a crash child gets them back as arguments).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

/// Stress, fault and crash load generator for the spillring engine.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Many concurrent task spills with aborts and faults, then the leak checks.
    Run(RunArgs),
    /// SIGKILLs `loadgen run` children at random moments and checks the next open sweeps
    /// everything they left.
    Crash(CrashArgs),
    /// Merges JSON reports into one JSON file and a Markdown page (used by scripts/stress.sh).
    Summarize(SummarizeArgs),
}

/// Where an aborted spill is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbortPoint {
    /// A writer exists, nothing written yet.
    BeforeFirstWrite,
    /// Records written and writes in flight (cancelled from this thread or another one).
    MidWrite,
    /// Exactly between a segment file's creation and the writer's abort check (the
    /// `WriterAfterCreate` pause point), at the first segment or at a rotation.
    AfterCreate,
    /// `finish` paused between taking the writer's files and registering the state with the
    /// scope (the `WriterHandOff` pause point).
    HandOff,
    /// The writer finished; the state was not read yet (or `finish` races the cancel).
    AfterFinish,
    /// Part of the records read back, more to come.
    MidRead,
    /// No cancel: the writer or state is dropped half way, or the task's last handle goes.
    Abandon,
}

impl AbortPoint {
    pub const ALL: [AbortPoint; 7] = [
        AbortPoint::BeforeFirstWrite,
        AbortPoint::MidWrite,
        AbortPoint::AfterCreate,
        AbortPoint::HandOff,
        AbortPoint::AfterFinish,
        AbortPoint::MidRead,
        AbortPoint::Abandon,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AbortPoint::BeforeFirstWrite => "before-first-write",
            AbortPoint::MidWrite => "mid-write",
            AbortPoint::AfterCreate => "after-create",
            AbortPoint::HandOff => "hand-off",
            AbortPoint::AfterFinish => "after-finish",
            AbortPoint::MidRead => "mid-read",
            AbortPoint::Abandon => "abandon",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A fault point the seeded plan arms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultPointArg {
    /// `writer::create`: the segment create fails with loadgen's injected errno
    /// (ENOTRECOVERABLE, which real storage never returns) or ENOSPC.
    WriterCreate,
    /// `io::write`: a write fails with the injected errno or ENOSPC, or is done and reported
    /// failed.
    IoWrite,
    /// `io::unlink`: a delete fails with the injected errno, or is done and reported failed.
    IoUnlink,
    /// `cleanup::unlink`: the cleanup worker's retry fails the same ways.
    CleanupUnlink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Buffered,
    Direct,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Auto,
    Uring,
    Psync,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Progress {
    /// A progress bar on a terminal, plain periodic lines otherwise.
    Auto,
    Bar,
    Plain,
    None,
}

/// What the tasks do. Shared by `run` and `crash` (which passes it to its children).
#[derive(Debug, Clone, Args, Serialize)]
pub struct Workload {
    /// Spill root. Default: a fresh directory under the system temp dir, removed when clean.
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Concurrent tasks: half of them plain threads, half async tasks on the tokio runtime.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub tasks: u32,
    /// Run for this many seconds (default 30 unless --ops is given).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop after this many task spills (ops).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Share of ops aborted at a random abort point.
    #[arg(long, default_value_t = 0.25, value_parser = parse_rate)]
    pub abort_rate: f64,
    /// Abort points to choose from (comma separated). Default: all of them.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub abort_points: Vec<AbortPoint>,
    /// Probability of a fault at each call of the create, write and unlink fault points
    /// (loadgen's own errno ENOTRECOVERABLE, which real storage never returns, so that an injected
    /// fault is told from the engine's errors; ENOSPC; and ambiguous "done, then failed"
    /// outcomes).
    #[arg(long, default_value_t = 0.01, value_parser = parse_rate)]
    pub fault_rate: f64,
    /// Fault points to arm (comma separated). Default: all of them.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub fault_points: Vec<FaultPointArg>,
    /// Seed of every random choice (record sizes, abort points, faults). Default: from the clock.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Most bytes one task spills (log-uniform from one record up to this).
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    pub max_task_bytes: u64,
    /// Largest record (sizes are mostly small, some medium, a few large).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub max_record: u64,
    /// Share of finished spills read back and verified.
    #[arg(long, default_value_t = 0.6, value_parser = parse_rate)]
    pub read_rate: f64,
    /// Share of finished spills published to a caller-owned directory.
    #[arg(long, default_value_t = 0.1, value_parser = parse_rate)]
    pub publish_rate: f64,
    /// Worker threads of the tokio runtime that runs the async tasks.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub runtime_threads: u32,

    /// Write mode.
    #[arg(long, value_enum, default_value_t = Mode::Buffered)]
    pub mode: Mode,
    /// I/O backend: `auto` (io_uring if it can be set up, else psync), or `uring` / `psync`,
    /// which the run then requires: it fails if the engine runs on another. The backend that
    /// ran is printed and in the report either way.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Segment size (small, so that spills rotate often).
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    pub segment_size: u64,
    /// Ticket ledger capacity.
    #[arg(long, default_value_t = 65_536)]
    pub ticket_capacity: usize,
    /// Byte quota of the engine. Default: none.
    #[arg(long, value_parser = parse_size)]
    pub max_spill_bytes: Option<u64>,
    /// Staging buffer size (one write each; small, so that writes are in flight).
    #[arg(long, default_value = "128KiB", value_parser = parse_size)]
    pub io_buffer_size: u64,
    /// Cleanup worker retry delay after a failed delete, in milliseconds.
    #[arg(long, default_value_t = 20)]
    pub cleanup_retry_ms: u64,
    /// Spill roots: with more than one, the engine gets `root-0`..`root-N` under `--root`
    /// (one filesystem, so publish still works) and spreads segments over them.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub roots: u32,
    /// How long a root whose create or write failed with a device error is skipped, in ms.
    #[arg(long, default_value_t = 100)]
    pub root_skip_ms: u64,
    /// Preallocate each segment (fallocate).
    #[arg(long)]
    pub preallocate: bool,
    /// Fail the run if the process ever has more than this many fds open (above those it
    /// had at start), e.g. 1024 for the common default soft RLIMIT_NOFILE. Default: no limit
    /// (the peak is reported either way).
    #[arg(long)]
    pub max_fds: Option<u64>,
}

impl Workload {
    /// The flags that reproduce this workload on a child's command line (without root, seed,
    /// duration and ops, which the caller sets).
    pub fn child_args(&self) -> Vec<String> {
        let mut a = vec![
            "--tasks".into(),
            self.tasks.to_string(),
            "--abort-rate".into(),
            self.abort_rate.to_string(),
            "--fault-rate".into(),
            self.fault_rate.to_string(),
            "--max-task-bytes".into(),
            self.max_task_bytes.to_string(),
            "--max-record".into(),
            self.max_record.to_string(),
            "--read-rate".into(),
            self.read_rate.to_string(),
            "--publish-rate".into(),
            self.publish_rate.to_string(),
            "--runtime-threads".into(),
            self.runtime_threads.to_string(),
            "--mode".into(),
            value_name(self.mode),
            "--backend".into(),
            value_name(self.backend),
            "--segment-size".into(),
            self.segment_size.to_string(),
            "--ticket-capacity".into(),
            self.ticket_capacity.to_string(),
            "--io-buffer-size".into(),
            self.io_buffer_size.to_string(),
            "--cleanup-retry-ms".into(),
            self.cleanup_retry_ms.to_string(),
            "--roots".into(),
            self.roots.to_string(),
            "--root-skip-ms".into(),
            self.root_skip_ms.to_string(),
        ];
        if self.preallocate {
            a.push("--preallocate".into());
        }
        if let Some(q) = self.max_spill_bytes {
            a.push("--max-spill-bytes".into());
            a.push(q.to_string());
        }
        if !self.fault_points.is_empty() {
            a.push("--fault-points".into());
            a.push(
                self.fault_points
                    .iter()
                    .map(|p| value_name(*p))
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        if !self.abort_points.is_empty() {
            a.push("--abort-points".into());
            a.push(
                self.abort_points
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        a
    }

    /// The spill roots under `root`: `root` itself, or `root-0`.. with `--roots` > 1.
    pub fn spill_roots(&self, root: &std::path::Path) -> Vec<PathBuf> {
        if self.roots <= 1 {
            vec![root.to_path_buf()]
        } else {
            (0..self.roots)
                .map(|i| root.join(format!("root-{i}")))
                .collect()
        }
    }

    /// The abort points in use (all of them when none was named).
    pub fn points(&self) -> Vec<AbortPoint> {
        if self.abort_points.is_empty() {
            AbortPoint::ALL.to_vec()
        } else {
            let mut p = self.abort_points.clone();
            p.sort();
            p.dedup();
            p
        }
    }
}

pub fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub workload: Workload,
    /// A label for the report.
    #[arg(long, default_value = "run")]
    pub name: String,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Progress display.
    #[arg(long, value_enum, default_value_t = Progress::Auto)]
    pub progress: Progress,
    /// Seconds between plain progress lines.
    #[arg(long, default_value_t = 5.0)]
    pub progress_secs: f64,
    /// Give up (exit 3) when no op completes for this many seconds.
    #[arg(long, default_value_t = 120.0)]
    pub stall_secs: f64,
    /// Print the JSON report on stdout too.
    #[arg(long)]
    pub json: bool,
    /// Crash child mode: print a READY line with the engine's directory once it is open, and
    /// die with the parent.
    #[arg(long, hide = true)]
    pub crash_child: bool,
}

#[derive(Debug, Clone, Args)]
pub struct CrashArgs {
    #[command(flatten)]
    pub workload: Workload,
    /// A label for the report.
    #[arg(long, default_value = "crash")]
    pub name: String,
    /// How many children to SIGKILL.
    #[arg(long, default_value_t = 5)]
    pub kills: u32,
    /// Shortest wait after a child has files on disk before it is killed, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub min_delay_ms: u64,
    /// Longest such wait, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    pub max_delay_ms: u64,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Print the JSON report on stdout too.
    #[arg(long)]
    pub json: bool,
    /// Progress display (one line per kill unless `none`).
    #[arg(long, value_enum, default_value_t = Progress::Auto)]
    pub progress: Progress,
}

#[derive(Debug, Clone, Args)]
pub struct SummarizeArgs {
    /// JSON reports written by `run --report` and `crash --report`.
    #[arg(required = true)]
    pub reports: Vec<PathBuf>,
    /// Merged JSON output.
    #[arg(long)]
    pub json: PathBuf,
    /// Markdown output.
    #[arg(long)]
    pub markdown: PathBuf,
    /// The command that produced the reports (written into both outputs).
    #[arg(long, default_value = "")]
    pub command: String,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is not in 0..=1"));
    }
    Ok(v)
}

/// Parses a size: a plain number of bytes, or a number with K/KiB, M/MiB, G/GiB (powers of 2).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?}")),
    };
    let v = n * mult as f64;
    if !(v >= 0.0 && v < u64::MAX as f64) {
        return Err(format!("size {s:?} out of range"));
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn child_args_round_trip() {
        let cli = Cli::parse_from([
            "loadgen",
            "run",
            "--tasks",
            "3",
            "--abort-points",
            "mid-write,after-create",
            "--max-spill-bytes",
            "64MiB",
            "--mode",
            "direct",
            "--roots",
            "3",
            "--preallocate",
        ]);
        let Cmd::Run(a) = cli.cmd else {
            panic!("not run")
        };
        let mut argv = vec!["loadgen".to_string(), "run".to_string()];
        argv.extend(a.workload.child_args());
        let Cmd::Run(b) = Cli::parse_from(argv).cmd else {
            panic!("not run")
        };
        assert_eq!(b.workload.tasks, 3);
        assert_eq!(b.workload.mode, Mode::Direct);
        assert_eq!(b.workload.max_spill_bytes, Some(64 << 20));
        assert_eq!(b.workload.roots, 3);
        assert!(b.workload.preallocate);
        assert_eq!(
            b.workload.points(),
            vec![AbortPoint::MidWrite, AbortPoint::AfterCreate]
        );
    }
}
