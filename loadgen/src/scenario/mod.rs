//! One op: a task's whole spill life (writer, finish, read-back, publish, close), or the same
//! life cancelled at one of the abort points. The same code runs on plain threads (blocking
//! calls, driven by a tiny `block_on`) and as async tasks on the tokio runtime (`write_async`,
//! `finish_async`); [`Flavor`] picks the calls.
//!
//! Every engine result is judged by [`verdict::verdict`]: with no cancel issued, only admission
//! refusals, a full device and (with faults on) an I/O error carrying the errno loadgen injects
//! ([`crate::run::INJECTED_ERRNO`], which real storage never returns) are acceptable; after a
//! cancel, only `Aborted` (or an injected fault that won the race). Anything else, a bare
//! `NotFound` after a cancel above all, is a violation, printed with the op and the stage.
//!
//! The parts: [`mod@worker`] (the loop that runs ops), [`ops`] (one op: its writes, finish, reads
//! and publish, and the normal life), [`abort`] (one function per abort point), [`cancel`]
//! (cancels from this thread or a control thread), [`verdict`] (what an error means where it
//! happened) and [`phase`] (what each worker is doing, for the stall report).

mod abort;
mod cancel;
mod ops;
mod phase;
mod verdict;
mod worker;

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use spillring::Engine;

use crate::args::AbortPoint;
use crate::check::{self, FileId};
use crate::data::{Expect, Pool};
use crate::progress::Out;
use crate::stats::{Counters, Stats, Violation};
use crate::watch::WatchTx;

pub use phase::{Slot, describe_slots};
#[cfg(test)]
pub use verdict::{Verdict, is_injected, verdict};
pub use worker::{block_on, worker};

/// How a worker calls the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// A plain thread: `write`, `finish`, blocking waits.
    Thread,
    /// An async task on the multi-thread tokio runtime: `write_async`, `finish_async`.
    Async,
}

/// A published file loadgen now owns.
#[derive(Debug)]
pub struct Published {
    pub op: u64,
    pub path: PathBuf,
    pub id: FileId,
}

/// What the workers share.
#[derive(Debug)]
pub struct Ctx {
    pub engine: Engine,
    pub seed: u64,
    pub points: Vec<AbortPoint>,
    pub abort_rate: f64,
    pub faults: bool,
    pub read_rate: f64,
    pub publish_rate: f64,
    pub max_task_bytes: u64,
    pub max_record: u64,
    pub segment_size: u64,
    pub io_buffer_size: u64,
    pub pool: Pool,
    pub stats: Stats,
    pub out: Out,
    pub watch: WatchTx,
    pub published_dir: PathBuf,
    pub published: Mutex<Vec<Published>>,
    /// Records read before a cancel and kept (zero-copy, into maps of deleted files) until
    /// after the engine is dropped.
    pub survivors: Mutex<Vec<(u64, Bytes, Expect)>>,
    pub stop: AtomicBool,
    pub next_op: AtomicU64,
    pub ops_limit: Option<u64>,
    pub deadline: Option<Instant>,
    pub slots: Vec<Slot>,
}

impl Ctx {
    pub fn violation(&self, kind: &'static str, what: String, at: String, op: Option<u64>) {
        self.stats
            .violation(&self.out, Violation { kind, what, at, op });
    }

    /// Checks that the published files (all, or all but the newest `keep`) are still the files
    /// published, then deletes them: loadgen owns them.
    pub fn trim_published(&self, keep: usize) {
        let old: Vec<Published> = {
            let mut p = self.published.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() <= keep {
                return;
            }
            let n = p.len() - keep;
            p.drain(..n).collect()
        };
        for f in old {
            match check::file_id(&f.path) {
                Ok(id) if id == f.id => {}
                Ok(id) => self.violation(
                    "published",
                    format!("published file changed: was {:?}, now {id:?}", f.id),
                    f.path.display().to_string(),
                    Some(f.op),
                ),
                Err(e) => self.violation(
                    "published",
                    format!("published file deleted or unreadable: {e}"),
                    f.path.display().to_string(),
                    Some(f.op),
                ),
            }
            match std::fs::remove_file(&f.path) {
                Ok(()) => Counters::add(&self.stats.c.published_deleted_by_loadgen, 1),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => self.out.line(&format!(
                    "loadgen: could not delete published file {}: {e}",
                    f.path.display()
                )),
            }
        }
    }

    pub(super) fn done(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}
