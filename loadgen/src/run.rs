//! `loadgen run`: opens an engine with a seeded fault plan, runs the workers (half plain
//! threads, half async tasks on a multi-thread tokio runtime) until the duration or op count is
//! reached, then drains the engine and checks the invariants against the filesystem and the
//! process: no segment file, directory or ticket left, every published file intact, no fd or
//! map leaked.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use spillring::{
    BackendKind, Engine, EngineConfig, FaultAction, FaultPlan, FaultPoint, Metrics, ShutdownReport,
    Trigger, WriteMode,
};

use crate::args::{AbortPoint, Backend, FaultPointArg, Mode, Progress, RunArgs, Workload};
use crate::check;
use crate::data::Pool;
use crate::progress::{Goal, Out, Ticker};
use crate::report::{self, Leaks, Machine, lat_cell, mib, table};
use crate::scenario::{self, Ctx, Flavor, Slot};
use crate::stats::{Counters, LatSummary, Stats, Violation, summarize};
use crate::watch::Watcher;

/// The JSON report of a run.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub kind: &'static str,
    pub name: String,
    pub loadgen_version: &'static str,
    pub seed: u64,
    pub commit: String,
    pub command: Vec<String>,
    pub machine: Machine,
    pub root: PathBuf,
    pub config: Workload,
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

pub fn main(a: RunArgs) -> i32 {
    if a.crash_child {
        die_with_parent();
    }
    let seed = a.workload.seed.unwrap_or_else(report::clock_seed);
    // Without it there is no fd leak check: a run that cannot check must not pass.
    let fds_before = match check::fds() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("loadgen run: {e}");
            return crate::EXIT_SETUP;
        }
    };
    let (root, own_root) = match &a.workload.root {
        Some(r) => (r.clone(), false),
        None => (fresh_root("loadgen", seed), true),
    };
    let duration = match (a.workload.duration, a.workload.ops) {
        (Some(d), _) => Some(d),
        (None, Some(_)) => None,
        (None, None) => Some(30.0),
    };
    let goal = match (duration, a.workload.ops) {
        (None, Some(n)) => Goal::Ops(n),
        (d, _) => Goal::Seconds(d.unwrap_or(30.0).ceil() as u64),
    };
    let progress = if a.crash_child {
        Progress::None
    } else {
        a.progress
    };
    let out = Out::new(progress, goal);
    if !a.crash_child {
        out.line(&format!(
            "loadgen run: seed {seed}, root {}, {} tasks, abort rate {}, fault rate {}",
            root.display(),
            a.workload.tasks,
            a.workload.abort_rate,
            a.workload.fault_rate
        ));
    }
    let rep = match execute(&a, seed, &root, duration, &out, &fds_before) {
        Ok(r) => r,
        Err(e) => {
            out.finish();
            eprintln!("loadgen run: {e}");
            if own_root {
                remove_fresh_root(&root, &a.workload, "loadgen run");
            }
            return crate::EXIT_SETUP;
        }
    };
    out.finish();
    if own_root && rep.leaks.total() == 0 {
        let _ = std::fs::remove_dir(&root);
    } else if rep.leaks.total() > 0 {
        eprintln!(
            "loadgen run: the root is kept for inspection: {}",
            root.display()
        );
    }
    finish_report(&rep, a.report.as_deref(), a.json, &print_summary(&rep))
}

/// A fresh root under the system temp dir for a run without `--root`:
/// `<tmp>/<prefix>-<pid>-<seed>`.
pub fn fresh_root(prefix: &str, seed: u64) -> PathBuf {
    std::env::temp_dir().join(format!(
        "{prefix}-{}-{:08x}",
        std::process::id(),
        seed as u32
    ))
}

/// Removes a root loadgen made itself (and what loadgen made in it: the published directory
/// and the sub-roots of `--roots`) after a run that could not start or finish, e.g. because
/// the engine refused the configuration. Directories only and never recursively: whatever
/// else is there is reported and kept. Waits a moment for an engine that is going away.
pub fn remove_fresh_root(root: &Path, w: &Workload, who: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let _ = std::fs::remove_dir(root.join("loadgen-published"));
        for r in w.spill_roots(root).iter().filter(|r| r.as_path() != root) {
            let _ = std::fs::remove_dir(r);
        }
        match std::fs::remove_dir(root) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(e) if Instant::now() > deadline => {
                eprintln!(
                    "{who}: could not remove the root it made, {}: {e}",
                    root.display()
                );
                return false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The name of the backend that `Engine::backend` reports for `b`, or `None` for `auto`.
pub fn backend_name(b: Backend) -> Option<&'static str> {
    match b {
        Backend::Auto => None,
        Backend::Uring => Some("io_uring"),
        Backend::Psync => Some("psync"),
    }
}

/// Why the backend that runs is not the one asked for, if it is not.
pub fn backend_mismatch(asked: Backend, ran: &str) -> Option<String> {
    let want = backend_name(asked)?;
    (ran != want).then(|| format!("--backend {want} was asked for, but the engine runs on {ran}"))
}

/// Prints the summary, writes the JSON report, and returns the exit code.
pub fn finish_report(rep: &impl Serialize, path: Option<&Path>, json: bool, summary: &str) -> i32 {
    let passed = serde_json::to_value(rep)
        .ok()
        .and_then(|v| v.get("passed").and_then(serde_json::Value::as_bool))
        .unwrap_or(false);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(summary.as_bytes());
    if json && let Ok(s) = serde_json::to_string_pretty(rep) {
        let _ = writeln!(stdout, "{s}");
    }
    let _ = stdout.flush();
    if let Some(p) = path
        && let Err(e) = report::write_json(p, rep)
    {
        eprintln!("loadgen: cannot write the report {}: {e}", p.display());
        return crate::EXIT_SETUP;
    }
    if passed { 0 } else { crate::EXIT_VIOLATION }
}

fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes plain integers and touches no memory of ours.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    // The parent may have died before the prctl: then we are reparented.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } == 1 {
        std::process::exit(crate::EXIT_SETUP);
    }
}

/// The fault points the engine-wide plan arms (the pause points are armed per task).
pub const FAULT_POINTS: [FaultPoint; 4] = [
    FaultPoint::WriterCreate,
    FaultPoint::IoWrite,
    FaultPoint::IoUnlink,
    FaultPoint::CleanupUnlink,
];

/// The errno of the I/O errors loadgen injects: one that real storage never returns for a
/// create, a write or an unlink (it belongs to robust mutexes), so that an I/O error is known to
/// be an injected fault only when it carries this errno. Any other I/O error (a bare `NotFound`
/// after a cancel above all) is the engine's or the storage's, and a violation.
pub const INJECTED_ERRNO: i32 = libc::ENOTRECOVERABLE;

/// The engine-wide fault plan of `--fault-rate p`: creates fail with [`INJECTED_ERRNO`] or
/// ENOSPC; writes fail with [`INJECTED_ERRNO`] or ENOSPC, or are done and then reported failed
/// (ambiguous); unlinks on the normal path and on the cleanup worker's fail, or are done and
/// reported failed (ambiguous). (ENOSPC is what makes the engine skip a root for a while.)
pub fn fault_plan(seed: u64, p: f64, only: &[FaultPointArg]) -> Arc<FaultPlan> {
    let plan = FaultPlan::new(crate::data::mix(seed ^ 0xFA17));
    let on = |x: FaultPointArg| only.is_empty() || only.contains(&x);
    // Rules of one point see the same random draw: later rules use cumulative thresholds.
    if on(FaultPointArg::WriterCreate) {
        plan.arm(
            FaultPoint::WriterCreate,
            FaultAction::Fail(INJECTED_ERRNO),
            Trigger::Probability(p / 2.0),
        );
        plan.arm(
            FaultPoint::WriterCreate,
            FaultAction::Fail(libc::ENOSPC),
            Trigger::Probability(p),
        );
    }
    if on(FaultPointArg::IoWrite) {
        plan.arm(
            FaultPoint::IoWrite,
            FaultAction::Fail(INJECTED_ERRNO),
            Trigger::Probability(p / 3.0),
        );
        plan.arm(
            FaultPoint::IoWrite,
            FaultAction::Fail(libc::ENOSPC),
            Trigger::Probability(p * 2.0 / 3.0),
        );
        plan.arm(
            FaultPoint::IoWrite,
            FaultAction::FailAfter(INJECTED_ERRNO),
            Trigger::Probability(p),
        );
    }
    for (arg, point) in [
        (FaultPointArg::IoUnlink, FaultPoint::IoUnlink),
        (FaultPointArg::CleanupUnlink, FaultPoint::CleanupUnlink),
    ] {
        if on(arg) {
            plan.arm(
                point,
                FaultAction::Fail(INJECTED_ERRNO),
                Trigger::Probability(p / 2.0),
            );
            plan.arm(
                point,
                FaultAction::FailAfter(INJECTED_ERRNO),
                Trigger::Probability(p),
            );
        }
    }
    plan
}

/// The engine configuration of a workload on `root` (its roots, see
/// [`Workload::spill_roots`]).
pub fn engine_config(w: &Workload, root: &Path) -> EngineConfig {
    let roots = w.spill_roots(root);
    let mut cfg = EngineConfig::new(&roots[0]);
    for r in &roots[1..] {
        cfg = cfg.add_root(r);
    }
    let mut cfg = cfg
        .mode(match w.mode {
            Mode::Buffered => WriteMode::Buffered,
            Mode::Direct => WriteMode::Direct,
        })
        .backend(match w.backend {
            Backend::Auto => BackendKind::Auto,
            Backend::Uring => BackendKind::Uring,
            Backend::Psync => BackendKind::Psync,
        })
        .segment_size(w.segment_size)
        .ticket_capacity(w.ticket_capacity)
        .io_buffer_size(w.io_buffer_size.min(w.segment_size) as usize)
        .cleanup_retry_delay(Duration::from_millis(w.cleanup_retry_ms.max(1)))
        .root_skip(Duration::from_millis(w.root_skip_ms))
        .preallocate(w.preallocate);
    if let Some(q) = w.max_spill_bytes {
        cfg = cfg.max_spill_bytes(q);
    }
    cfg
}

fn execute(
    a: &RunArgs,
    seed: u64,
    root: &Path,
    duration: Option<f64>,
    out: &Out,
    fds_before: &BTreeMap<i32, String>,
) -> Result<RunReport, String> {
    let w = &a.workload;
    std::fs::create_dir_all(root).map_err(|e| format!("create root {}: {e}", root.display()))?;
    let published_dir = root.join("loadgen-published");
    std::fs::create_dir_all(&published_dir)
        .map_err(|e| format!("create {}: {e}", published_dir.display()))?;
    let plan = (w.fault_rate > 0.0).then(|| fault_plan(seed, w.fault_rate, &w.fault_points));
    let mut cfg = engine_config(w, root);
    if let Some(p) = &plan {
        cfg = cfg.fault_plan(p.clone());
    }
    let engine = Engine::open(cfg).map_err(|e| format!("open engine: {e}"))?;
    let backend = engine.backend();
    let backend_wrong = backend_mismatch(w.backend, backend);
    if !a.crash_child {
        out.line(&format!(
            "loadgen run: backend {backend} (--backend {})",
            crate::args::value_name(w.backend)
        ));
    }
    let proc_dirs = engine.process_dirs();
    if a.crash_child {
        let dirs: Vec<String> = proc_dirs.iter().map(|d| d.display().to_string()).collect();
        println!("LOADGEN-READY {}", dirs.join("\t"));
        let _ = std::io::stdout().flush();
    }
    let watcher = Watcher::start(proc_dirs.clone()).map_err(|e| format!("start watcher: {e}"))?;
    let tasks = w.tasks as usize;
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        engine: engine.clone(),
        seed,
        points: w.points(),
        abort_rate: w.abort_rate,
        faults: plan.is_some(),
        read_rate: w.read_rate,
        publish_rate: w.publish_rate,
        max_task_bytes: w.max_task_bytes,
        max_record: w.max_record,
        segment_size: w.segment_size,
        io_buffer_size: w.io_buffer_size.min(w.segment_size),
        pool: Pool::new(
            seed,
            (w.max_record as usize).clamp(4 << 20, 256 << 20) + (1 << 20),
        ),
        stats: Stats::default(),
        out: out.clone(),
        watch: watcher.tx(),
        published_dir: published_dir.clone(),
        published: Mutex::new(Vec::new()),
        survivors: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        next_op: AtomicU64::new(0),
        ops_limit: w.ops,
        deadline: duration.map(|d| start + Duration::from_secs_f64(d)),
        slots: (0..tasks).map(|_| Slot::default()).collect(),
    });
    if let Some(why) = &backend_wrong {
        // Not the run that was asked for: no op runs; the checks and the report still do.
        ctx.violation(
            "backend",
            why.clone(),
            format!("engine {:016x}", engine.id()),
            None,
        );
        ctx.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(w.runtime_threads as usize)
        .enable_time()
        .thread_name("loadgen-async")
        .build()
        .map_err(|e| format!("start the tokio runtime: {e}"))?;
    // Half the tasks are plain threads, half async tasks (a single task is a thread).
    let n_threads = tasks.div_ceil(2);
    let mut threads = Vec::new();
    for wid in 0..n_threads {
        let c = ctx.clone();
        let h = std::thread::Builder::new()
            .name(format!("loadgen-task-{wid}"))
            .spawn(move || scenario::block_on(scenario::worker(c, wid, Flavor::Thread)))
            .map_err(|e| format!("spawn a task thread: {e}"))?;
        threads.push(h);
    }
    let asyncs: Vec<_> = (n_threads..tasks)
        .map(|wid| rt.spawn(scenario::worker(ctx.clone(), wid, Flavor::Async)))
        .collect();

    let every = Duration::from_secs_f64(a.progress_secs.max(0.2));
    let ticker = {
        let c = ctx.clone();
        let e = engine.clone();
        let plan = plan.clone();
        let by_ops = matches!((duration, w.ops), (None, Some(_)));
        Ticker::start(out, every, move || {
            status(&c, &e, plan.as_deref(), start, by_ops)
        })
    };

    // Watchdog: the run ends when every worker is done; no op completing for --stall-secs
    // means something hangs.
    let stall = Duration::from_secs_f64(a.stall_secs.max(1.0));
    let mut last_done = 0;
    let mut last_progress = Instant::now();
    // Open fds of the process, sampled: the engine must not hoard them (each is a segment
    // whose blocks stay allocated until it is closed, even once unlinked).
    let fds_base = fds_before.len() as u64;
    let mut fds_peak = 0u64;
    let mut fds_peak_at = 0.0f64;
    let mut fds_over_reported = false;
    let mut fds_unreadable_reported = false;
    let mut tick = 0u32;
    loop {
        let finished =
            threads.iter().all(|h| h.is_finished()) && asyncs.iter().all(|h| h.is_finished());
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        tick += 1;
        if tick.is_multiple_of(10) {
            let n = match check::fd_count() {
                Ok(n) => n.saturating_sub(fds_base),
                Err(e) => {
                    if !fds_unreadable_reported {
                        fds_unreadable_reported = true;
                        ctx.violation("check", e.to_string(), check::PROC_FDS.into(), None);
                    }
                    0
                }
            };
            if n > fds_peak {
                fds_peak = n;
                fds_peak_at = start.elapsed().as_secs_f64();
                ctx.stats.set_fds_peak(n);
            }
            if let Some(max) = w.max_fds
                && n > max
                && !fds_over_reported
            {
                fds_over_reported = true;
                ctx.violation(
                    "fds",
                    format!(
                        "{n} fds open during the run (limit --max-fds {max}); {} of unlinked files",
                        check::deleted_fds().map_or_else(|e| format!("? ({e})"), |n| n.to_string())
                    ),
                    "/proc/self/fd".into(),
                    None,
                );
            }
        }
        let d = Counters::get(&ctx.stats.c.ops_done);
        if d != last_done {
            last_done = d;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > stall {
            stalled(&ctx, &engine, stall);
        }
    }
    for h in threads {
        match h.join() {
            Ok(hists) => ctx.stats.merge_hists(&hists),
            Err(_) => return Err("a task thread panicked".into()),
        }
    }
    for h in asyncs {
        match rt.block_on(h) {
            Ok(hists) => ctx.stats.merge_hists(&hists),
            Err(e) => return Err(format!("an async task failed: {e}")),
        }
    }
    let elapsed = start.elapsed();
    ticker.stop();
    out.finish();

    // Drain: the storage "recovers" (faults off), the cleanup worker retries at once, and the
    // engine settles. Then the checks.
    if let Some(p) = &plan {
        p.clear_all();
    }
    let faults_injected: BTreeMap<&'static str, u64> = FAULT_POINTS
        .iter()
        .map(|p| (p.name(), plan.as_ref().map_or(0, |pl| pl.fired(*p))))
        .collect();
    engine.retry_cleanup_now();
    let settled = engine.settle(Duration::from_secs(60));
    let out_q = Out::quiet();
    let stats = &ctx.stats;
    let bad = |kind: &'static str, what: String, at: String| {
        stats.violation(
            &out_q,
            Violation {
                kind,
                what,
                at,
                op: None,
            },
        );
    };
    if !settled {
        bad(
            "settle",
            format!(
                "the engine did not settle within 60 s: {} deletes pending, {:?}",
                engine.pending_deletes(),
                engine.cleanup_report()
            ),
            format!("engine {:016x}", engine.id()),
        );
    }
    let wres = watcher.finish();
    let mut leaks = Leaks::default();
    for op in &wres.never_clean {
        bad(
            "leak",
            "files of a cancelled task still on disk after the engine settled".into(),
            format!("task op{op} under {proc_dirs:?}"),
        );
    }
    let m = engine.metrics();
    if m.tickets_used != 0 {
        leaks.tickets = m.tickets_used;
        bad(
            "leak",
            format!(
                "{} tickets still held after the run (spill bytes in use {})",
                m.tickets_used, m.spill_bytes_in_use
            ),
            format!("engine {:016x}", engine.id()),
        );
    }
    let own = engine.process_dirs();
    let spill_roots = w.spill_roots(root);
    match check::scan_root(root, &own, std::slice::from_ref(&published_dir)) {
        Ok(s) => {
            for f in &s.segment_files {
                leaks.files += 1;
                bad(
                    "leak",
                    format!(
                        "segment file left after the run (tickets held: {}, engine id in its header: {})",
                        m.tickets_used,
                        check::segment_engine(f)
                            .map_or_else(|| "unreadable".into(), |id| format!("{id:016x}"))
                    ),
                    f.display().to_string(),
                );
            }
            for f in &s.other_files {
                leaks.files += 1;
                bad(
                    "leak",
                    "stray file left after the run".into(),
                    f.display().to_string(),
                );
            }
            for d in s
                .dirs
                .iter()
                .filter(|d| !own.contains(d) && !spill_roots.contains(d))
            {
                leaks.dirs += 1;
                bad(
                    "leak",
                    "directory left after the run".into(),
                    d.display().to_string(),
                );
            }
            leaks.examples.extend(
                s.segment_files
                    .iter()
                    .chain(&s.other_files)
                    .take(8)
                    .map(|p| p.display().to_string()),
            );
        }
        Err(e) => bad(
            "check",
            format!("cannot scan the root: {e}"),
            root.display().to_string(),
        ),
    }
    // Every published file must still be the file published; then loadgen deletes them.
    let before = stats.violation_count();
    ctx.trim_published(0);
    leaks.published_missing = stats.violation_count() - before;
    let _ = std::fs::remove_dir(&published_dir);

    let shutdown = engine.shutdown(Duration::from_secs(30));
    if !shutdown.drained || shutdown.tickets_held != 0 || shutdown.cleanup_pending != 0 {
        bad(
            "leak",
            format!("shutdown left work behind: {shutdown:?}"),
            format!("engine {:016x}", engine.id()),
        );
    }
    let engine_id = format!("{:016x}", engine.id());
    let backend = backend.to_owned();
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
    latency.insert("abort_to_clean", summarize(&wres.abort_to_clean));
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

    // Everything of the engine goes now; then the process-level checks.
    drop(engine);
    let metrics = m;
    let stats_violations;
    {
        let ctx =
            Arc::try_unwrap(ctx).map_err(|_| "the run context is still shared".to_string())?;
        let Ctx {
            engine,
            stats,
            survivors,
            ..
        } = ctx;
        drop(engine);
        rt.shutdown_timeout(Duration::from_secs(5));
        // Zero-copy records outlive the engine: still the bytes written; their maps go with
        // the last of them.
        let survivors = survivors.into_inner().unwrap_or_else(|e| e.into_inner());
        let survivors_checked = survivors.len();
        for (op, b, e) in &survivors {
            if let Some(why) = e.mismatch(b) {
                stats.violation(
                    &out_q,
                    Violation {
                        kind: "data",
                        what: format!("a record kept past the engine's drop changed: {why}"),
                        at: format!("op{op} kept record"),
                        op: Some(*op),
                    },
                );
            }
        }
        drop(survivors);
        match check::scan_root(root, &[], &[]) {
            Ok(mut s) => {
                // The sub-roots loadgen asked for stay until the end; empty, they go now.
                s.dirs.retain(|d| !spill_roots.contains(d));
                if s.is_empty() {
                    for r in spill_roots.iter().filter(|r| r.as_path() != root) {
                        let _ = std::fs::remove_dir(r);
                    }
                }
                for p in s.segment_files.iter().chain(&s.other_files).chain(&s.dirs) {
                    // Counted once above if it was there already; a new one is a shutdown leak.
                    if !leaks.examples.contains(&p.display().to_string()) {
                        leaks.examples.push(p.display().to_string());
                    }
                }
                if !s.is_empty() && leaks.files + leaks.dirs == 0 {
                    leaks.dirs += s.dirs.len() as u64;
                    leaks.files += (s.segment_files.len() + s.other_files.len()) as u64;
                    stats.violation(
                        &out_q,
                        Violation {
                            kind: "leak",
                            what: format!(
                                "the root is not empty after shutdown: {:?}",
                                leaks.examples
                            ),
                            at: root.display().to_string(),
                            op: None,
                        },
                    );
                }
            }
            Err(e) => stats.violation(
                &out_q,
                Violation {
                    kind: "check",
                    what: format!("cannot scan the root after shutdown: {e}"),
                    at: root.display().to_string(),
                    op: None,
                },
            ),
        }
        // The reaper may close the last fds a moment after the engine is gone.
        let deadline = Instant::now() + Duration::from_secs(2);
        let fds = loop {
            match check::leaked_fds(fds_before) {
                Ok(f) if !f.is_empty() && Instant::now() <= deadline => {}
                Ok(f) => break f,
                Err(e) => {
                    stats.violation(
                        &out_q,
                        Violation {
                            kind: "check",
                            what: format!("the fd leak check cannot run: {e}"),
                            at: check::PROC_FDS.into(),
                            op: None,
                        },
                    );
                    break Vec::new();
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for f in &fds {
            leaks.fds += 1;
            stats.violation(
                &out_q,
                Violation {
                    kind: "leak",
                    what: format!("fd leaked: {f}"),
                    at: "/proc/self/fd".into(),
                    op: None,
                },
            );
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let maps = loop {
            match check::spill_maps(root) {
                Ok(m) if !m.is_empty() && Instant::now() <= deadline => {}
                Ok(m) => break m,
                Err(e) => {
                    stats.violation(
                        &out_q,
                        Violation {
                            kind: "check",
                            what: format!("the map leak check cannot run: {e}"),
                            at: check::PROC_MAPS.into(),
                            op: None,
                        },
                    );
                    break Vec::new();
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        for l in maps {
            leaks.maps += 1;
            stats.violation(
                &out_q,
                Violation {
                    kind: "leak",
                    what: format!("segment still mapped: {l}"),
                    at: "/proc/self/maps".into(),
                    op: None,
                },
            );
        }
        stats_violations = (
            stats.violation_count(),
            stats.violations(),
            survivors_checked,
        );
    }
    let (violation_count, violations, survivors_checked) = stats_violations;
    let mut ops = ops;
    ops.records_outliving_engine = survivors_checked as u64;
    Ok(RunReport {
        kind: "run",
        name: a.name.clone(),
        loadgen_version: env!("CARGO_PKG_VERSION"),
        seed,
        commit: report::commit().to_owned(),
        command: std::env::args().collect(),
        machine: report::machine(root.parent().unwrap_or(root)),
        root: root.to_path_buf(),
        config: w.clone(),
        engine_id,
        backend_requested: w.backend,
        backend,
        elapsed_secs: secs,
        ops,
        bytes_written,
        bytes_read,
        records_written,
        records_read,
        throughput,
        aborts_total,
        aborts_by_point,
        abort_windows: windows,
        hand_off_windows,
        faults_total: faults_injected.values().sum(),
        faults_injected,
        errors_seen,
        latency,
        tickets_high_water: metrics.tickets_high_water,
        fds_peak,
        fds_peak_at_secs: fds_peak_at,
        cleanup_retries: metrics.cleanup_retries,
        late_files_deleted: metrics.late_files_deleted,
        engine: Some(metrics),
        shutdown: Some(shutdown),
        passed: violation_count == 0 && leaks.total() == 0,
        leaks,
        violation_count,
        violations,
    })
}

fn status(
    ctx: &Ctx,
    engine: &Engine,
    plan: Option<&FaultPlan>,
    start: Instant,
    by_ops: bool,
) -> (u64, String, String) {
    let c = &ctx.stats.c;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let done = Counters::get(&c.ops_done);
    let written = Counters::get(&c.bytes_written);
    let faults: u64 = plan.map_or(0, |p| FAULT_POINTS.iter().map(|x| p.fired(*x)).sum());
    let m = engine.metrics();
    let msg = format!(
        "{:.0}s ops {done} ({:.0}/s) wrote {} ({:.0} MiB/s) read {} aborts {} faults {faults} tickets {} pending {} fds peak {} violations {}",
        secs,
        done as f64 / secs,
        mib(written),
        written as f64 / (1u64 << 20) as f64 / secs,
        mib(Counters::get(&c.bytes_read)),
        c.aborts_total(),
        m.tickets_used,
        m.cleanup_pending + m.deletes_in_flight,
        ctx.stats.fds_peak(),
        ctx.stats.violation_count(),
    );
    let short = format!(
        "{done} ops {:.0} MiB/s aborts {} faults {faults} tickets {} violations {}",
        written as f64 / (1u64 << 20) as f64 / secs,
        c.aborts_total(),
        m.tickets_used,
        ctx.stats.violation_count(),
    );
    (if by_ops { done } else { secs as u64 }, short, msg)
}

fn stalled(ctx: &Ctx, engine: &Engine, stall: Duration) -> ! {
    let mut s = format!(
        "loadgen: STALL: no op completed for {:.0} s. Workers:\n",
        stall.as_secs_f64()
    );
    for l in scenario::describe_slots(&ctx.slots) {
        s.push_str("  ");
        s.push_str(&l);
        s.push('\n');
    }
    s.push_str(&format!(
        "  engine metrics: {:?}\n  cleanup: {:?}\n",
        engine.metrics(),
        engine.cleanup_report()
    ));
    ctx.out.line(&s);
    ctx.out.finish();
    std::process::exit(crate::EXIT_STALL);
}

fn print_summary(r: &RunReport) -> String {
    let mut rows: Vec<(String, String)> = vec![
        ("seed".into(), r.seed.to_string()),
        ("commit".into(), r.commit.clone()),
        (
            "backend / mode".into(),
            format!(
                "{} (--backend {}) / {}",
                r.backend,
                crate::args::value_name(r.backend_requested),
                serde_json::to_value(r.config.mode)
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
    table(&format!("loadgen run `{}`", r.name), &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Verdict, is_injected, verdict};
    use spillring::SpillError;

    #[test]
    fn a_backend_asked_for_must_be_the_one_that_runs() {
        assert_eq!(backend_mismatch(Backend::Auto, "io_uring"), None);
        assert_eq!(backend_mismatch(Backend::Auto, "psync"), None);
        assert_eq!(backend_mismatch(Backend::Uring, "io_uring"), None);
        assert_eq!(backend_mismatch(Backend::Psync, "psync"), None);
        let why = backend_mismatch(Backend::Uring, "psync").unwrap();
        assert!(why.contains("io_uring") && why.contains("psync"), "{why}");
        assert!(backend_mismatch(Backend::Psync, "io_uring").is_some());
    }

    /// Every error loadgen's own fault plan causes is one its verdict tells from a cancel:
    /// the injected errno, or a full device.
    #[test]
    fn injected_faults_are_recognised() {
        for (point, backend) in [
            (FaultPointArg::WriterCreate, BackendKind::Auto),
            (FaultPointArg::IoWrite, BackendKind::Auto),
            (FaultPointArg::IoWrite, BackendKind::Psync),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let plan = fault_plan(7, 1.0, &[point]);
            let engine = Engine::open(
                EngineConfig::new(dir.path())
                    .backend(backend)
                    .segment_size(64 << 10)
                    .io_buffer_size(16 << 10)
                    .fault_plan(plan),
            )
            .unwrap();
            let (mut injected, mut full) = (0, 0);
            for i in 0..40 {
                let task = engine.task(&format!("t{i}")).unwrap();
                let mut w = task.writer().unwrap();
                let mut r = Ok(());
                for _ in 0..4 {
                    r = w.write(bytes::Bytes::from(vec![7u8; 20 << 10]));
                    if r.is_err() {
                        break;
                    }
                }
                let e = match r {
                    Err(e) => e,
                    Ok(()) => w.finish().map(drop).unwrap_err(),
                };
                match &e {
                    SpillError::StorageFull { .. } => full += 1,
                    e if is_injected(e) => injected += 1,
                    e => panic!("{point:?} on {backend:?}: not an injected fault: {e}"),
                }
                assert_eq!(verdict(&e, true, true), Verdict::Fault, "{e}");
                assert_eq!(verdict(&e, false, true), Verdict::Fault, "{e}");
                task.close();
            }
            assert!(
                injected > 0 && full > 0,
                "{point:?}: {injected} injected, {full} full"
            );
            drop(engine);
        }
    }
}
