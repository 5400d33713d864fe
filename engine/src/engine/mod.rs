//! The engine: spill roots and their locked process directories, the ticket ledger, the I/O
//! thread(s), the cleanup worker, the reaper, and the metrics.

mod open;
mod shutdown;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::cleanup::CleanupReport;
use crate::config::Backend;
use crate::error::{Result, SpillError};
use crate::io::ReaperThread;
use crate::metrics::{Metrics, RootUsage, Sampled};
use crate::shared::EngineShared;
use crate::spill::task::{TaskShared, TaskSpill};
use crate::store::entry::EntryView;

pub use shutdown::ShutdownReport;
use shutdown::wait_until;

/// The engine behind [`Engine`] handles; shut down when the last handle (engine, task,
/// writer, state or reader) is gone.
pub(crate) struct EngineInner {
    pub(crate) core: Arc<EngineShared>,
    task_seq: AtomicU64,
    tasks: Mutex<Vec<Weak<TaskShared>>>,
    cleanup_thread: Mutex<Option<JoinHandle<()>>>,
    reaper_thread: ReaperThread,
    last_report: Mutex<Option<ShutdownReport>>,
}

/// The spill engine. Cheap to clone (clones share one engine); `Send + Sync`. One per
/// process, shared by every worker. Dropping the last handle (engine, task, writer, state or
/// reader) runs a bounded shutdown (`EngineConfig::shutdown_budget`, 5 s by default): it
/// never hangs on a slow device, and what it could not delete the next open sweeps.
///
/// ```
/// use std::time::Duration;
/// use spillring::{Bytes, Engine, EngineConfig};
/// # fn main() -> spillring::Result<()> {
/// # let root = std::env::temp_dir().join(format!("spillring-doc-engine-{}", std::process::id()));
/// let engine = Engine::open(EngineConfig::new(&root))?;
/// let task = engine.task("job-1")?;
/// let mut w = task.writer()?;
/// w.write(Bytes::from_static(b"row batch"))?;
/// let state = w.finish()?;
/// assert_eq!(state.records(), 1);
/// drop(state);
/// task.close();
/// let m = engine.metrics();
/// assert_eq!(m.records_written, 1);
/// println!("{}", m.to_prometheus());
/// let report = engine.shutdown(Duration::from_secs(1));
/// assert!(report.drained);
/// # let _ = std::fs::remove_dir(&root);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.core.fmt(f)
    }
}

impl Engine {
    /// The engine's I/O handle (for `testing`'s probes).
    pub(crate) fn io(&self) -> &crate::io::IoHandle {
        &self.inner.core.io
    }

    /// A new task scope. `id` names it in paths and logs (characters other than
    /// `[A-Za-z0-9._-]` become `_`; ids need not be unique). Its directories are made on its
    /// first segment.
    pub fn task(&self, id: &str) -> Result<TaskSpill> {
        if self.inner.core.is_shut_down() {
            return Err(SpillError::Closed { what: "engine" });
        }
        let seq = self.inner.task_seq.fetch_add(1, Ordering::Relaxed);
        let t = TaskSpill::new(self.inner.core.clone(), self.inner.clone(), id, seq);
        let mut tasks = self.inner.tasks.lock();
        if tasks.len() >= 64 && tasks.len().is_power_of_two() {
            tasks.retain(|w| w.strong_count() > 0);
        }
        tasks.push(Arc::downgrade(t.shared()));
        Ok(t)
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> Metrics {
        metrics(&self.inner.core)
    }

    /// What the cleanup worker still holds, for operators.
    pub fn cleanup_report(&self) -> CleanupReport {
        crate::cleanup::report(&self.inner.core)
    }

    /// The backend that runs (`Backend::as_str` gives "io_uring" or "psync").
    pub fn backend(&self) -> Backend {
        self.inner.core.io.kind()
    }

    /// This engine's id (in its directory names and segment headers).
    pub fn id(&self) -> u64 {
        self.inner.core.id
    }

    /// This engine's locked process directory under each root.
    pub fn process_dirs(&self) -> Vec<PathBuf> {
        self.inner
            .core
            .store
            .roots
            .proc_dirs()
            .iter()
            .map(|p| p.path.clone())
            .collect()
    }

    /// Waits up to `timeout` until the offload pool ran every job it was given (an async
    /// call's rotation whose future was dropped deletes its own file there), every queued
    /// delete completed, the cleanup worker is idle and the reaper closed what it was given.
    /// True if that happened. For tests, load generators and orderly hand-overs; nothing
    /// requires calling it.
    pub fn settle(&self, timeout: Duration) -> bool {
        let core = &self.inner.core;
        let deadline = Instant::now() + timeout;
        // One counter of all delete work, which a unit moving between the I/O threads and
        // the cleanup worker never leaves at zero (see `CleanupQueue::outstanding`); a job
        // queues its deletes before it counts itself ended, so the order of the two reads
        // holds.
        let ok = wait_until(deadline, || shutdown::no_delete_work_left(core));
        core.io.reaper().flush();
        ok
    }

    /// Deletes queued to an I/O thread and not completed, cleanup records pending, and orphan
    /// sweeps not finished: zero when every file the engine was asked to delete is confirmed
    /// gone. One load.
    pub fn pending_deletes(&self) -> u64 {
        self.inner.core.store.cleanup.outstanding()
    }

    /// The cleanup queue in order, as (directory index, segment number). Not a stable API:
    /// for tests of the worker's rotation order.
    #[doc(hidden)]
    pub fn cleanup_queue_snapshot(&self) -> Vec<(u32, u32)> {
        let records = self.inner.core.store.cleanup.records();
        records.iter().map(|r| (r.dir, r.seg)).collect()
    }

    /// Deletes every file the segment pool holds (queued, like every delete) and returns how
    /// many. Spills after it create their files again until the pool refills. For operators
    /// who need the disk space back now, and for tests that check nothing is left.
    pub fn trim_pool(&self) -> usize {
        crate::cleanup::trim_pool(&self.inner.core)
    }

    /// Every segment file the engine owns now, for operators: the files of open writers and
    /// live states (with their task id), the segment pool's files, and the files whose delete
    /// failed and that the cleanup worker retries (each with its task's files first, then the
    /// pool, then the cleanup queue). Each holds one ticket of the ledger, so on a quiet
    /// engine the list has `Metrics::tickets_used` files and their `reserved` bytes add up
    /// to `Metrics::spill_bytes_in_use`.
    ///
    /// Not one atomic snapshot: a file moving between stages while the list is made (a writer
    /// handing its files to a state, a state's files going to the pool) may be missed or seen
    /// twice, and files whose unlink is on an I/O thread at that moment (`deletes_in_flight`)
    /// or in a retry batch the cleanup worker is running are not listed. Each file is `stat`ed
    /// for its size (one syscall per file, outside every lock of the engine).
    ///
    /// ```
    /// use spillring::{Bytes, Engine, EngineConfig, FileKind};
    /// # fn main() -> spillring::Result<()> {
    /// # let root = std::env::temp_dir().join(format!("spillring-doc-list-{}", std::process::id()));
    /// let engine = Engine::open(EngineConfig::new(&root))?;
    /// let task = engine.task("job-9")?;
    /// let mut w = task.writer()?;
    /// w.write(Bytes::from_static(b"row"))?;
    /// let files = engine.list_files();
    /// assert_eq!(files.len(), 1);
    /// assert_eq!(files[0].task.as_deref(), Some("job-9"));
    /// assert_eq!(files[0].kind, FileKind::Live);
    /// assert!(files[0].path.starts_with(&engine.process_dirs()[0]));
    /// # drop((w, task, engine));
    /// # let _ = std::fs::remove_dir(&root);
    /// # Ok(()) }
    /// ```
    pub fn list_files(&self) -> Vec<OwnedFile> {
        let core = &self.inner.core;
        let tasks: Vec<Arc<TaskShared>> = self
            .inner
            .tasks
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let roots = core.store.roots.paths();
        let root_of = |i: usize| roots.get(i).cloned().unwrap_or_default();
        let mut out = Vec::new();
        for t in &tasks {
            for v in t.files() {
                out.push(OwnedFile::of(
                    v,
                    FileKind::Live,
                    Some(t.id.as_str().to_owned()),
                    &root_of,
                ));
            }
        }
        for v in core.store.pool.views() {
            out.push(OwnedFile::of(v, FileKind::Pooled, None, &root_of));
        }
        for r in core.store.cleanup.records() {
            let Some(dir) = core.store.dir(r.dir as usize) else {
                continue;
            };
            let v = EntryView {
                root: dir.root,
                path: dir.segment_path(r.seg),
                reserved: u64::from(r.pages) * crate::store::ledger::PAGE,
                age: core.store.cleanup.age(&r),
            };
            out.push(OwnedFile::of(v, FileKind::AwaitingDelete, None, &root_of));
        }
        for f in &mut out {
            f.size = std::fs::symlink_metadata(&f.path).ok().map(|m| m.len());
        }
        out
    }

    /// Retries failed deletes now instead of after the cleanup worker's delay. When the worker
    /// is idle and at most 64 names wait, this thread deletes them itself (a batch of up to
    /// `cleanup_batch`) before it returns, without waking the worker; otherwise the worker
    /// retries them at once.
    pub fn retry_cleanup_now(&self) {
        crate::cleanup::retry_now(&self.inner.core);
    }

    /// Stops admission (new tasks and writers fail with `Closed`), aborts task scopes still
    /// open, drains queued deletes and the cleanup worker up to `budget`, stops the engine's
    /// threads, and reports what is left (which the next open on the same roots sweeps).
    /// Idempotent; dropping the last handle does the same with the configured budget.
    pub fn shutdown(&self, budget: Duration) -> ShutdownReport {
        self.inner.shutdown(budget)
    }
}

/// What stage an engine-owned file is in (see [`Engine::list_files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum FileKind {
    /// Held by an open writer or a live spilled state of a task.
    Live,
    /// Released and kept in the segment pool for reuse (it still holds a ticket).
    Pooled,
    /// Its delete failed; the cleanup worker retries it (ticket held).
    AwaitingDelete,
}

/// One segment file the engine owns (see [`Engine::list_files`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct OwnedFile {
    /// Where it is.
    pub path: PathBuf,
    /// The configured root it is under.
    pub root: PathBuf,
    /// The id of the task whose writer or state holds it (`Live` files only).
    pub task: Option<String>,
    /// Its stage.
    pub kind: FileKind,
    /// Its length as `stat` saw it while the list was made; `None` if the `stat` failed (the
    /// file is gone, or the device fails).
    pub size: Option<u64>,
    /// Bytes of disk quota its ticket holds in the ledger (whole 4 KiB pages; for a segment
    /// being written, the whole segment or its allocation).
    pub reserved: u64,
    /// How long it has been in its stage: since a writer created it or took it from the pool
    /// (`Live`), since it entered the pool (`Pooled`), since its failed delete went to the
    /// cleanup worker (`AwaitingDelete`, whole seconds; the queue keeps one time per 128 records,
    /// its oldest, so this may be older than the file's own).
    pub age: Duration,
}

impl OwnedFile {
    fn of(
        v: EntryView,
        kind: FileKind,
        task: Option<String>,
        root_of: &dyn Fn(usize) -> PathBuf,
    ) -> Self {
        OwnedFile {
            root: root_of(v.root),
            path: v.path,
            task,
            kind,
            size: None,
            reserved: v.reserved,
            age: v.age,
        }
    }
}

/// A snapshot of the metrics: the counters, and what the engine's parts hold now.
fn metrics(core: &EngineShared) -> Metrics {
    let (pool_segments, pool_bytes) = core.store.pool.level();
    let c = &core.counters;
    let ledger = &core.store.ledger;
    let roots = ledger.per_root().into_iter().zip(core.store.roots.paths());
    let s = Sampled {
        backend: core.io.kind(),
        write_mode: core.cfg.mode,
        errors: c.error_counts(),
        latency: c.latency.snapshot(),
        roots: roots
            .map(|((files, bytes), path)| RootUsage {
                path: path.clone(),
                files,
                bytes,
            })
            .collect(),
        tickets_used: ledger.used() as u64,
        tickets_high_water: ledger.high_water() as u64,
        ticket_capacity: ledger.capacity() as u64,
        admission_failures: ledger.admission_failures(),
        quota_failures: ledger.quota_failures(),
        spill_bytes_in_use: ledger.bytes_used(),
        cleanup_pending: core.store.cleanup.pending(),
        cleanup_oldest_age_secs: core.store.cleanup.oldest_age(),
        pool_segments,
        pool_bytes,
        staging_buffer_bytes: core.io.pool().stats().1 as u64,
        kept_map_bytes: core.io.kept_maps().held().1,
        open_fds: core.io.fds().open_count() as u64,
    };
    Metrics::collect(c, s)
}
