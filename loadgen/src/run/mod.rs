//! `loadgen run`: opens an engine with a seeded fault plan, runs the workers (half plain
//! threads, half async tasks on a multi-thread tokio runtime) until the duration or op count is
//! reached, then drains the engine and checks the invariants against the filesystem and the
//! process: no segment file, directory or ticket left, every published file intact, no fd or
//! map leaked.
//!
//! [`execute`] runs the steps: [`setup`] (root, engine, watcher, workers' context, runtime),
//! [`drive`] (the workers under the watchdog), [`drain`] (drain and check, before and after
//! the engine is dropped) and [`report`] (the counters, the JSON report, the summary). The
//! engine's configuration and fault plan are in [`config`].

mod config;
mod drain;
mod drive;
mod report;
mod setup;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::args::{Backend, Progress, RunArgs, Workload};
use crate::check;
use crate::progress::{Goal, Out};

pub use config::{FAULT_POINTS, INJECTED_ERRNO, engine_config, fault_plan};
use report::RunReport;

pub fn main(a: RunArgs) -> i32 {
    if a.crash_child {
        die_with_parent();
    }
    let seed = a.workload.seed.unwrap_or_else(crate::report::clock_seed);
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
    finish_report(
        &rep,
        a.report.as_deref(),
        a.json,
        &report::print_summary(&rep),
    )
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

/// The backend that `Engine::backend` reports for `b`, or `None` for `auto`.
pub fn backend_wanted(b: Backend) -> Option<spillring::Backend> {
    match b {
        Backend::Auto => None,
        Backend::Uring => Some(spillring::Backend::IoUring),
        Backend::Psync => Some(spillring::Backend::Psync),
    }
}

/// Why the backend that runs is not the one asked for, if it is not.
pub fn backend_mismatch(asked: Backend, ran: spillring::Backend) -> Option<String> {
    let want = backend_wanted(asked)?;
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
        && let Err(e) = crate::report::write_json(p, rep)
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

/// A run: its steps, one after the other.
fn execute(
    a: &RunArgs,
    seed: u64,
    root: &Path,
    duration: Option<f64>,
    out: &Out,
    fds_before: &BTreeMap<i32, String>,
) -> Result<RunReport, String> {
    let (run, watcher) = setup::setup(a, seed, root, duration, out)?;
    let driven = drive::drive(&run, a, duration, out, fds_before)?;
    let mut checked = drain::drain_and_check(&run, watcher, &a.workload, root);
    let tally = report::Tally::take(&run, &checked.abort_to_clean, driven.elapsed);
    let after = drain::check_after_engine(run, &a.workload, root, fds_before, &mut checked.leaks)?;
    Ok(report::build(a, seed, root, tally, &driven, checked, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_asked_for_must_be_the_one_that_runs() {
        use spillring::Backend::{IoUring, Psync};
        assert_eq!(backend_mismatch(Backend::Auto, IoUring), None);
        assert_eq!(backend_mismatch(Backend::Auto, Psync), None);
        assert_eq!(backend_mismatch(Backend::Uring, IoUring), None);
        assert_eq!(backend_mismatch(Backend::Psync, Psync), None);
        let why = backend_mismatch(Backend::Uring, Psync).unwrap();
        assert!(why.contains("io_uring") && why.contains("psync"), "{why}");
        assert!(backend_mismatch(Backend::Psync, IoUring).is_some());
    }
}
