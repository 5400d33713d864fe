//! The third step of a run: drain and check. The storage "recovers" (faults off), the cleanup
//! worker retries at once and the engine settles; then the checks against the filesystem and
//! the engine (no segment file, directory or ticket left, every published file intact), the
//! shutdown, and once the engine is gone the process-level checks (records that outlived it, the
//! root, fds, maps).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use spillring::{Metrics, ShutdownReport};

use super::FAULT_POINTS;
use super::setup::Setup;
use crate::args::Workload;
use crate::check;
use crate::data::Expect;
use crate::progress::Out;
use crate::report::Leaks;
use crate::scenario::Ctx;
use crate::stats::{Stats, Violation};
use crate::watch::Watcher;

/// What the checks up to the engine's shutdown found.
#[derive(Debug)]
pub(super) struct Checked {
    pub(super) faults_injected: BTreeMap<&'static str, u64>,
    pub(super) abort_to_clean: Histogram<u64>,
    pub(super) leaks: Leaks,
    /// The engine's metrics once it settled (before its shutdown).
    pub(super) metrics: Metrics,
    pub(super) shutdown: ShutdownReport,
}

/// What the checks after the engine was dropped add up to.
#[derive(Debug)]
pub(super) struct AfterEngine {
    pub(super) violation_count: u64,
    pub(super) violations: Vec<Violation>,
    /// Records kept until after the engine was dropped, then checked.
    pub(super) survivors_checked: usize,
}

/// Records a violation found by a final check (quietly: the summary lists them).
fn bad(stats: &Stats, kind: &'static str, what: String, at: String) {
    stats.violation(
        &Out::quiet(),
        Violation {
            kind,
            what,
            at,
            op: None,
        },
    );
}

/// Drains the engine, checks what it left, and shuts it down.
pub(super) fn drain_and_check(s: &Setup, watcher: Watcher, w: &Workload, root: &Path) -> Checked {
    let faults_injected = drain(s);
    let stats = &s.ctx.stats;
    let wres = watcher.finish();
    let mut leaks = Leaks::default();
    for op in &wres.never_clean {
        bad(
            stats,
            "leak",
            "files of a cancelled task still on disk after the engine settled".into(),
            format!("task op{op} under {:?}", s.proc_dirs),
        );
    }
    let metrics = s.engine.metrics();
    if metrics.tickets_used != 0 {
        leaks.tickets = metrics.tickets_used;
        bad(
            stats,
            "leak",
            format!(
                "{} tickets still held after the run (spill bytes in use {})",
                metrics.tickets_used, metrics.spill_bytes_in_use
            ),
            format!("engine {:016x}", s.engine.id()),
        );
    }
    check_root(s, w, root, &metrics, &mut leaks);
    // Every published file must still be the file published; then loadgen deletes them.
    let before = stats.violation_count();
    s.ctx.trim_published(0);
    leaks.published_missing = stats.violation_count() - before;
    let _ = std::fs::remove_dir(&s.published_dir);

    let shutdown = s.engine.shutdown(Duration::from_secs(30));
    if !shutdown.drained || shutdown.tickets_held != 0 || shutdown.cleanup_pending != 0 {
        bad(
            stats,
            "leak",
            format!("shutdown left work behind: {shutdown:?}"),
            format!("engine {:016x}", s.engine.id()),
        );
    }
    Checked {
        faults_injected,
        abort_to_clean: wres.abort_to_clean,
        leaks,
        metrics,
        shutdown,
    }
}

/// Turns the faults off and lets the engine settle; returns the faults injected by point.
fn drain(s: &Setup) -> BTreeMap<&'static str, u64> {
    let (engine, plan) = (&s.engine, &s.plan);
    if let Some(p) = plan {
        p.clear_all();
    }
    let faults_injected: BTreeMap<&'static str, u64> = FAULT_POINTS
        .iter()
        .map(|p| (p.name(), plan.as_ref().map_or(0, |pl| pl.fired(*p))))
        .collect();
    engine.retry_cleanup_now();
    let mut settled = engine.settle(Duration::from_secs(60));
    // Every file left now is a pooled one, and each holds exactly one ticket. Then the pool is
    // trimmed through the delete path, so the checks that follow see nothing at all.
    let m = engine.metrics();
    if settled && m.tickets_used != m.pool_segments {
        bad(
            &s.ctx.stats,
            "leak",
            format!(
                "{} tickets held once settled, but the segment pool holds {} files",
                m.tickets_used, m.pool_segments
            ),
            format!("engine {:016x}", engine.id()),
        );
    }
    engine.trim_pool();
    settled = settled && engine.settle(Duration::from_secs(60));
    if !settled {
        bad(
            &s.ctx.stats,
            "settle",
            format!(
                "the engine did not settle within 60 s: {} deletes pending, {:?}",
                engine.pending_deletes(),
                engine.cleanup_report()
            ),
            format!("engine {:016x}", engine.id()),
        );
    }
    faults_injected
}

/// No segment file, stray file or directory may be left under the root but the engine's own
/// directories, the spill roots and the published directory.
fn check_root(s: &Setup, w: &Workload, root: &Path, m: &Metrics, leaks: &mut Leaks) {
    let stats = &s.ctx.stats;
    let own = s.engine.process_dirs();
    let spill_roots = w.spill_roots(root);
    match check::scan_root(root, &own, std::slice::from_ref(&s.published_dir)) {
        Ok(s) => {
            for f in &s.segment_files {
                leaks.files += 1;
                bad(
                    stats,
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
                    stats,
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
                    stats,
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
            stats,
            "check",
            format!("cannot scan the root: {e}"),
            root.display().to_string(),
        ),
    }
}

/// Everything of the engine goes now (its handles, the runtime); then the process-level
/// checks.
pub(super) fn check_after_engine(
    s: Setup,
    w: &Workload,
    root: &Path,
    fds_before: &BTreeMap<i32, String>,
    leaks: &mut Leaks,
) -> Result<AfterEngine, String> {
    let Setup {
        rt, ctx, engine, ..
    } = s;
    drop(engine);
    let ctx = Arc::try_unwrap(ctx).map_err(|_| "the run context is still shared".to_string())?;
    let Ctx {
        engine,
        stats,
        survivors,
        ..
    } = ctx;
    drop(engine);
    rt.shutdown_timeout(Duration::from_secs(5));
    let survivors = survivors.into_inner().unwrap_or_else(|e| e.into_inner());
    let survivors_checked = check_survivors(&stats, survivors);
    check_root_after_shutdown(&stats, w, root, leaks);
    check_fds(&stats, fds_before, leaks);
    check_maps(&stats, root, leaks);
    Ok(AfterEngine {
        violation_count: stats.violation_count(),
        violations: stats.violations(),
        survivors_checked,
    })
}

/// Zero-copy records outlive the engine: still the bytes written; their maps go with the last
/// of them (dropped here). Returns how many were checked.
fn check_survivors(stats: &Stats, survivors: Vec<(u64, Bytes, Expect)>) -> usize {
    for (op, b, e) in &survivors {
        if let Some(why) = e.mismatch(b) {
            stats.violation(
                &Out::quiet(),
                Violation {
                    kind: "data",
                    what: format!("a record kept past the engine's drop changed: {why}"),
                    at: format!("op{op} kept record"),
                    op: Some(*op),
                },
            );
        }
    }
    survivors.len()
}

/// Once the engine is gone the root must be empty (but for the spill roots loadgen asked for,
/// which go now if they are empty).
fn check_root_after_shutdown(stats: &Stats, w: &Workload, root: &Path, leaks: &mut Leaks) {
    let spill_roots = w.spill_roots(root);
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
                bad(
                    stats,
                    "leak",
                    format!("the root is not empty after shutdown: {:?}", leaks.examples),
                    root.display().to_string(),
                );
            }
        }
        Err(e) => bad(
            stats,
            "check",
            format!("cannot scan the root after shutdown: {e}"),
            root.display().to_string(),
        ),
    }
}

/// No fd the process did not have at start may be open (the reaper may close the last fds a
/// moment after the engine is gone).
fn check_fds(stats: &Stats, fds_before: &BTreeMap<i32, String>, leaks: &mut Leaks) {
    let fds =
        match check::poll_until_empty(Duration::from_secs(2), || check::leaked_fds(fds_before)) {
            Ok(f) => f,
            Err(e) => {
                bad(
                    stats,
                    "check",
                    format!("the fd leak check cannot run: {e}"),
                    check::PROC_FDS.into(),
                );
                Vec::new()
            }
        };
    for f in &fds {
        leaks.fds += 1;
        bad(
            stats,
            "leak",
            format!("fd leaked: {f}"),
            "/proc/self/fd".into(),
        );
    }
}

/// No segment under the root may still be mapped.
fn check_maps(stats: &Stats, root: &Path, leaks: &mut Leaks) {
    let maps = match check::poll_until_empty(Duration::from_secs(2), || check::spill_maps(root)) {
        Ok(m) => m,
        Err(e) => {
            bad(
                stats,
                "check",
                format!("the map leak check cannot run: {e}"),
                check::PROC_MAPS.into(),
            );
            Vec::new()
        }
    };
    for l in maps {
        leaks.maps += 1;
        bad(
            stats,
            "leak",
            format!("segment still mapped: {l}"),
            "/proc/self/maps".into(),
        );
    }
}
