//! The `run` child a crash series kills: its start and READY line, its log, and what it leaves
//! on disk.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::State;
use crate::args::Workload;
use crate::check::{self, FileId};

pub(super) fn spawn_child(
    exe: &Path,
    root: &Path,
    seed: u64,
    w: &Workload,
    log: &Path,
) -> Result<Child, String> {
    let log = std::fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
    Command::new(exe)
        .arg("run")
        .arg("--root")
        .arg(root)
        .args(["--seed", &seed.to_string()])
        .args([
            "--duration",
            "3600",
            "--progress",
            "none",
            "--stall-secs",
            "3600",
            "--crash-child",
        ])
        .args(w.child_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", exe.display()))
}

/// Waits for the child's READY line; returns its engine's process directories (one per root).
pub(super) fn wait_ready(child: &mut Child, timeout: Duration) -> Result<Vec<PathBuf>, String> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    if let Some(p) = line.trim().strip_prefix("LOADGEN-READY ") {
                        let _ = tx.send(Some(p.split('\t').map(PathBuf::from).collect()));
                        // Keep draining so the child never blocks on a full pipe.
                        let mut sink = String::new();
                        while r.read_line(&mut sink).is_ok_and(|n| n > 0) {
                            sink.clear();
                        }
                        return;
                    }
                }
            }
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err("the child exited before it was ready".into()),
        Err(_) => Err("the child did not get ready in time".into()),
    }
}

/// A child's log file, removed when the kill is done with it (or the series gave up).
pub(super) struct ChildLog(pub(super) PathBuf);

impl Drop for ChildLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(super) fn child_log_violations(log: &Path, st: &mut State, k: u32) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    for l in text
        .lines()
        .filter(|l| l.contains("VIOLATION") || l.contains("STALL") || l.contains("panicked"))
    {
        st.bad(
            "child",
            l.to_owned(),
            format!("child {k} ({})", log.display()),
        );
    }
}

pub(super) fn count_segments(dirs: &[PathBuf]) -> usize {
    dirs.iter()
        .map(|d| check::scan_root(d, &[], &[]).map_or(0, |s| s.segment_files.len()))
        .sum()
}

/// True if no segment file under `root` was written by engine `dead`, looking into every
/// directory except live bystanders'.
pub(super) fn nothing_of(root: &Path, dead: u64, ours: &[PathBuf], bystanders: &[PathBuf]) -> bool {
    let Ok(s) = check::scan_root(root, ours, bystanders) else {
        return false;
    };
    !s.segment_files
        .iter()
        .any(|f| check::segment_engine(f).is_none_or(|id| id == dead))
}

pub(super) fn snapshot(dir: &Path) -> Vec<(PathBuf, FileId)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let p = e.path();
            check::file_id(&p).ok().map(|id| (p, id))
        })
        .collect()
}
