//! Abort-to-clean timing, measured on the filesystem: from the `cancel()` call until the
//! task's directory holds no segment file (or is gone). One thread polls the engine's process
//! directory while aborts are pending.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::check::is_segment_name;
use crate::stats::{new_hist, record};

enum Msg {
    Watch { op: u64, t0: Instant },
    Finish,
}

/// Registers aborts with the watcher thread. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WatchTx(Sender<Msg>);

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl WatchTx {
    /// Op `op`'s task (`op{op}`) was cancelled at `t0` with files on disk.
    pub fn aborted(&self, op: u64, t0: Instant) {
        let _ = self.0.send(Msg::Watch { op, t0 });
    }
}

/// What the watcher measured.
#[derive(Debug)]
pub struct WatchResult {
    pub abort_to_clean: Histogram<u64>,
    /// Aborted ops whose files were still on disk at the final scan.
    pub never_clean: Vec<u64>,
}

#[derive(Debug)]
pub struct Watcher {
    tx: WatchTx,
    join: Option<JoinHandle<WatchResult>>,
}

struct Pending {
    op: u64,
    suffix: String,
    t0: Instant,
}

impl Watcher {
    /// Watches task directories under the engine's process directories (one per root).
    pub fn start(proc_dirs: Vec<PathBuf>) -> std::io::Result<Watcher> {
        let (tx, rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("loadgen-watch".into())
            .spawn(move || watch_loop(&proc_dirs, &rx))?;
        Ok(Watcher {
            tx: WatchTx(tx),
            join: Some(join),
        })
    }

    pub fn tx(&self) -> WatchTx {
        self.tx.clone()
    }

    /// Makes one last scan (call it once the engine has settled) and returns the figures.
    pub fn finish(mut self) -> WatchResult {
        let _ = self.tx.0.send(Msg::Finish);
        match self.join.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => WatchResult {
                abort_to_clean: new_hist(),
                never_clean: Vec::new(),
            },
        }
    }
}

fn watch_loop(proc_dirs: &[PathBuf], rx: &Receiver<Msg>) -> WatchResult {
    let mut hist = new_hist();
    let mut pending: Vec<Pending> = Vec::new();
    let mut finishing = false;
    loop {
        // Take what arrived; block briefly only when there is nothing to poll.
        loop {
            let msg = if pending.is_empty() && !finishing {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Msg::Finish),
                }
            } else {
                rx.try_recv().ok()
            };
            match msg {
                Some(Msg::Watch { op, t0 }) => pending.push(Pending {
                    op,
                    suffix: format!("-op{op}"),
                    t0,
                }),
                Some(Msg::Finish) => finishing = true,
                None => break,
            }
        }
        if !pending.is_empty() {
            scan(proc_dirs, &mut pending, &mut hist);
        }
        if finishing {
            return WatchResult {
                abort_to_clean: hist,
                never_clean: pending.iter().map(|p| p.op).collect(),
            };
        }
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

fn scan(proc_dirs: &[PathBuf], pending: &mut Vec<Pending>, hist: &mut Histogram<u64>) {
    // Task directories of every root: the task's files may be under any of them.
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    for pd in proc_dirs {
        if let Ok(rd) = std::fs::read_dir(pd) {
            for e in rd.flatten() {
                dirs.push((e.file_name().to_string_lossy().into_owned(), e.path()));
            }
        }
    }
    let now = Instant::now();
    pending.retain(|p| {
        let dirty = dirs
            .iter()
            .filter(|(n, _)| n.ends_with(&p.suffix))
            .any(|(_, d)| holds_segment(d));
        if !dirty {
            record(hist, now.saturating_duration_since(p.t0));
        }
        dirty
    });
}

fn holds_segment(dir: &std::path::Path) -> bool {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .any(|e| is_segment_name(&e.file_name().to_string_lossy())),
        Err(_) => false,
    }
}
