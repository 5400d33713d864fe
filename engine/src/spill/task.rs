//! A task's scope: its cleanup registry. Its segments live flat in the engine's process
//! directory under each root (no directory per task: no mkdir, rmdir or directory fd on the
//! hot path); the scope owns them through its registered writers and states. Closing the scope
//! (`close`, `cancel`, or dropping the last handle) closes everything registered, newest
//! first. Registering on a closed scope closes the resource on the spot and fails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::error::{Result, SpillError};
use crate::fault::FaultPlan;
use crate::shared::{EngineGuard, EngineShared};
use crate::spill::writer::SpillWriter;
use crate::store::entry::EntryView;
use crate::store::proc::ProcDir;

/// Something a scope closes when it closes.
pub(crate) trait Member: Send + Sync {
    /// Closes the resource: sets its abort flag and queues the deletion of its files. Never
    /// waits for I/O.
    fn close_by_scope(&self);

    /// The files the member holds now, and their bytes on disk (written or allocated).
    fn usage(&self) -> SpillUsage;

    /// Appends the files the member holds now, as operators see them.
    fn files(&self, out: &mut Vec<EntryView>);
}

/// What a task scope holds on disk now: see [`TaskSpill::usage`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpillUsage {
    /// Segment files held by the scope's open writers and live states.
    pub files: u64,
    /// Bytes those files hold on disk: written bytes of finished segments, and for segments
    /// allocated up front (direct mode, `preallocate`) the allocation until `finish` trims it.
    pub bytes: u64,
    /// Open writers registered with the scope.
    pub writers: u64,
    /// Live spilled states registered with the scope (made here or adopted).
    pub states: u64,
}

impl SpillUsage {
    /// A writer's usage: `files` files of `bytes` bytes.
    pub(crate) fn of_writer(files: u64, bytes: u64) -> Self {
        SpillUsage {
            files,
            bytes,
            writers: 1,
            states: 0,
        }
    }

    /// A state's usage: `files` files of `bytes` bytes.
    pub(crate) fn of_state(files: u64, bytes: u64) -> Self {
        SpillUsage {
            files,
            bytes,
            writers: 0,
            states: 1,
        }
    }
}

/// How many members a scope holds without a heap allocation: a writer, and its state while
/// the hand-off replaces it (the common scope holds one at a time).
const INLINE_MEMBERS: usize = 2;

/// A scope's members by id, newest last. The first [`INLINE_MEMBERS`] live in the registry
/// itself (a spill cycle's scope registers a writer, then its state, and allocates nothing for
/// them); more go to a map.
#[derive(Default)]
struct Members {
    inline: [Option<(u64, Arc<dyn Member>)>; INLINE_MEMBERS],
    more: BTreeMap<u64, Arc<dyn Member>>,
}

impl Members {
    fn insert(&mut self, id: u64, m: Arc<dyn Member>) {
        match self.inline.iter_mut().find(|s| s.is_none()) {
            Some(slot) => *slot = Some((id, m)),
            None => {
                self.more.insert(id, m);
            }
        }
    }

    fn remove(&mut self, id: u64) -> Option<Arc<dyn Member>> {
        for slot in &mut self.inline {
            if slot.as_ref().is_some_and(|(i, _)| *i == id) {
                return slot.take().map(|(_, m)| m);
            }
        }
        self.more.remove(&id)
    }

    #[cfg(all(test, not(loom)))]
    fn len(&self) -> usize {
        self.inline.iter().flatten().count() + self.more.len()
    }

    /// Every member, newest first.
    fn newest_first(&self) -> Vec<Arc<dyn Member>> {
        let mut v: Vec<(u64, Arc<dyn Member>)> = self
            .inline
            .iter()
            .flatten()
            .map(|(i, m)| (*i, m.clone()))
            .chain(self.more.iter().map(|(i, m)| (*i, m.clone())))
            .collect();
        v.sort_unstable_by_key(|m| std::cmp::Reverse(m.0));
        v.into_iter().map(|(_, m)| m).collect()
    }
}

#[derive(Default)]
struct Registry {
    closed: bool,
    next: u64,
    members: Members,
}

/// A task id, kept inline when short (an executor's ids are), so a scope allocates only itself.
pub(crate) enum TaskId {
    Inline { len: u8, buf: [u8; TaskId::INLINE] },
    Heap(Box<str>),
}

impl TaskId {
    const INLINE: usize = 40;

    fn new(id: &str) -> Self {
        if id.len() <= Self::INLINE {
            let mut buf = [0u8; Self::INLINE];
            buf[..id.len()].copy_from_slice(id.as_bytes());
            TaskId::Inline {
                len: id.len() as u8,
                buf,
            }
        } else {
            TaskId::Heap(id.into())
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // Copied from a `&str` whole, so the first `len` bytes are valid UTF-8.
            TaskId::Inline { len, buf } => {
                std::str::from_utf8(&buf[..*len as usize]).unwrap_or_default()
            }
            TaskId::Heap(s) => s,
        }
    }
}

impl std::fmt::Debug for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// Shared state of a task scope. Writers and states hold it to unregister; only
/// [`TaskSpill`] handles keep the scope open.
pub(crate) struct TaskShared {
    pub(crate) id: TaskId,
    /// Live [`TaskSpill`] handles: the last one to go closes the scope.
    handles: AtomicUsize,
    core: Arc<EngineShared>,
    /// Keeps the engine's threads alive while the scope lives.
    _engine: EngineGuard,
    registry: Mutex<Registry>,
    cancelled: AtomicBool,
    seq: u64,
    fault: Mutex<Option<Arc<FaultPlan>>>,
    /// The scope's `tracing` span (debug level): the parent of its writers' and states'.
    pub(crate) span: tracing::Span,
}

impl std::fmt::Debug for TaskShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskShared")
            .field("id", &self.id)
            .field("seq", &self.seq)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl TaskShared {
    pub(crate) fn core(&self) -> &Arc<EngineShared> {
        &self.core
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.registry.lock().closed
    }

    /// True once closed by `cancel` (or by the engine's shutdown, which cancels).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// What a new writer (or any call that needs an open scope) gets on a closed scope:
    /// `Aborted` if it was cancelled (the expected outcome of a cancel), `Closed` if it ended
    /// normally (asking a finished task for a new writer is a caller's bug).
    pub(crate) fn closed_error(&self) -> SpillError {
        if self.is_cancelled() {
            SpillError::Aborted
        } else {
            SpillError::Closed { what: "task scope" }
        }
    }

    /// The task's own fault plan, consulted before the engine's at the writer's points.
    pub(crate) fn fault_plan(&self) -> Option<Arc<FaultPlan>> {
        if !crate::fault::ENABLED {
            return None;
        }
        self.fault.lock().clone()
    }

    /// Registers `m`. On a closed scope, closes `m` at once and fails with `Aborted`.
    pub(crate) fn register(&self, m: Arc<dyn Member>) -> Result<u64> {
        // Ids start at 1: there is no member 0 to replace.
        self.replace(0, m)
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.registry.lock().members.remove(id);
    }

    /// Takes member `id` out of an open scope; false if the scope is closed (it closed the
    /// member) or `id` is not registered.
    pub(crate) fn take_member(&self, id: u64) -> bool {
        let mut r = self.registry.lock();
        !r.closed && r.members.remove(id).is_some()
    }

    /// Replaces member `old` by `new` in one step (the hand-off from writer to state). On a
    /// closed scope, closes `new` at once and fails with `Aborted`.
    pub(crate) fn replace(&self, old: u64, new: Arc<dyn Member>) -> Result<u64> {
        let mut r = self.registry.lock();
        if r.closed {
            drop(r);
            new.close_by_scope();
            return Err(SpillError::Aborted);
        }
        r.members.remove(old);
        r.next += 1;
        let id = r.next;
        r.members.insert(id, new);
        Ok(id)
    }

    /// The sum of the members' usage.
    pub(crate) fn usage(&self) -> SpillUsage {
        // Each member is asked outside the registry's lock (a member takes its own lock).
        let members = self.registry.lock().members.newest_first();
        let mut u = SpillUsage::default();
        for m in members {
            let m = m.usage();
            u.files += m.files;
            u.bytes += m.bytes;
            u.writers += m.writers;
            u.states += m.states;
        }
        u
    }

    /// The files of the scope's members now (each member asked outside the registry's lock).
    pub(crate) fn files(&self) -> Vec<EntryView> {
        let members = self.registry.lock().members.newest_first();
        let mut out = Vec::new();
        // Oldest first, as they were made.
        for m in members.iter().rev() {
            m.files(&mut out);
        }
        out
    }

    /// Closes the scope: every member, newest first. Idempotent.
    pub(crate) fn close(&self, cancel: bool) {
        if cancel {
            self.cancelled.store(true, Ordering::Release);
        }
        let members = {
            let mut r = self.registry.lock();
            if r.closed {
                return;
            }
            r.closed = true;
            std::mem::take(&mut r.members)
        };
        self.span
            .record("outcome", if cancel { "cancelled" } else { "closed" });
        for m in members.newest_first() {
            m.close_by_scope();
        }
    }

    /// Where this task's segments go under root `root`: the engine's process directory there
    /// (segments live flat in it; the scope owns its segments, not a directory).
    pub(crate) fn dir(&self, root: usize) -> Result<Arc<ProcDir>> {
        if self.is_closed() {
            return Err(SpillError::Aborted);
        }
        self.core.store.root_dir(root)
    }
}

/// A task's spill scope. Cheap to clone: clones share the scope, which closes when `close` or
/// `cancel` is called on any of them, or when the last one is dropped. `Send + Sync`, so an
/// executor can cancel from another thread than the one writing.
///
/// `cancel` never blocks: it sets flags and queues deletes. Call it from outside the pool
/// whose threads run the task's writers: a cancel queued as a job on a pool whose threads all
/// wait (for example a rayon pool of blocked writers) never runs. After a cancel, every call
/// on the scope, its writers, states and readers returns [`crate::SpillError::Aborted`].
///
/// ```
/// use spillring::{Bytes, Engine, EngineConfig, SpillError};
/// # fn main() -> spillring::Result<()> {
/// # let root = std::env::temp_dir().join(format!("spillring-doc-task-{}", std::process::id()));
/// let engine = Engine::open(EngineConfig::new(&root))?;
/// let task = engine.task("query-7")?;
/// let canceller = task.clone();
/// let worker = std::thread::spawn(move || -> spillring::Result<()> {
///     let mut w = task.writer()?;
///     loop {
///         w.write(Bytes::from(vec![7u8; 4096]))?; // Aborted once cancelled
///     }
/// });
/// std::thread::sleep(std::time::Duration::from_millis(20));
/// canceller.cancel(); // from another thread; never blocks
/// assert!(matches!(worker.join().unwrap(), Err(SpillError::Aborted)));
/// assert_eq!(canceller.usage().files, 0);
/// # drop((canceller, engine));
/// # let _ = std::fs::remove_dir(&root);
/// # Ok(()) }
/// ```
pub struct TaskSpill {
    /// Counted in `shared.handles`; writers and states hold the scope without counting.
    shared: Arc<TaskShared>,
}

impl Clone for TaskSpill {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Ordering::Relaxed);
        TaskSpill {
            shared: self.shared.clone(),
        }
    }
}

/// Closes the scope when the last handle goes.
impl Drop for TaskSpill {
    fn drop(&mut self) {
        if self.shared.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.close(false);
        }
    }
}

impl std::fmt::Debug for TaskSpill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl TaskSpill {
    pub(crate) fn new(core: Arc<EngineShared>, engine: EngineGuard, id: &str, seq: u64) -> Self {
        let shared = Arc::new(TaskShared {
            id: TaskId::new(id),
            handles: AtomicUsize::new(1),
            core,
            _engine: engine,
            registry: Mutex::new(Registry::default()),
            cancelled: AtomicBool::new(false),
            seq,
            fault: Mutex::new(None),
            span: tracing::debug_span!("spillring.task", task = %id, seq, outcome = tracing::field::Empty),
        });
        TaskSpill { shared }
    }

    pub(crate) fn shared(&self) -> &Arc<TaskShared> {
        &self.shared
    }

    /// The task id given to [`crate::Engine::task`].
    pub fn id(&self) -> &str {
        self.shared.id.as_str()
    }

    /// A new writer, registered with this scope (its abort hook).
    ///
    /// On a cancelled scope this fails with `Aborted`, like every other call on it: a cancel
    /// is an expected outcome, not a bug. On a scope closed normally (`close`, or its last
    /// handle dropped) it fails with `Closed { what: "task scope" }`: the task said it was
    /// done, so asking for another writer is a caller's bug. On a shut-down engine, `Closed
    /// { what: "engine" }`.
    ///
    /// ```no_run
    /// # fn f(engine: &spillring::Engine) -> spillring::Result<()> {
    /// use spillring::SpillError;
    /// let task = engine.task("t")?;
    /// task.cancel();
    /// assert!(matches!(task.writer(), Err(SpillError::Aborted)));
    /// let task = engine.task("u")?;
    /// task.close();
    /// assert!(matches!(task.writer(), Err(SpillError::Closed { .. })));
    /// # Ok(()) }
    /// ```
    pub fn writer(&self) -> Result<SpillWriter> {
        if self.shared.core.is_shut_down() {
            return Err(SpillError::Closed { what: "engine" });
        }
        if self.shared.is_closed() {
            return Err(self.shared.closed_error());
        }
        SpillWriter::new(self.shared.clone())
    }

    /// What the scope holds on disk now: segment files of its open writers and live states
    /// (its own and adopted ones; a state adopted elsewhere counts there), and their bytes.
    /// All zero once the scope is closed. A snapshot: it takes a lock per member, so call it
    /// for reporting, not per record.
    pub fn usage(&self) -> SpillUsage {
        self.shared.usage()
    }

    /// Aborts the task's spills: closes everything registered, newest first. Writers and
    /// readers see `Aborted`; every file is deleted. Idempotent.
    pub fn cancel(&self) {
        self.shared.close(true);
    }

    /// Closes the scope at the task's normal end: the same as `cancel` (everything still
    /// registered is closed and deleted). Idempotent.
    pub fn close(&self) {
        self.shared.close(false);
    }

    /// True once closed or cancelled.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    #[cfg(feature = "fault-injection")]
    /// Installs a fault plan for this task's writers only (`WriterCreate`,
    /// `WriterAfterCreate`), consulted before the engine's plan. A testing hook: it lets a test
    /// or a load generator pause one chosen task between a file creation and its abort check.
    pub fn set_fault_plan(&self, plan: Arc<FaultPlan>) {
        *self.shared.fault.lock() = Some(plan);
    }

    /// Makes this scope the backstop of `state`, made by another task's scope: from now on the
    /// state's files outlive the producing scope, and this scope's close (or cancel) deletes
    /// them if the state is still alive then. The stage-to-stage hand-off: the producer
    /// finishes, the consumer adopts, and the producer's scope may then close. `Aborted` if
    /// the producing scope closed first (the files are gone), or if this scope is closed (then
    /// the state is closed and its files deleted on the spot). Adopting a state twice into the
    /// same scope is a no-op.
    pub fn adopt(&self, state: &crate::SpilledState) -> Result<()> {
        state.inner().move_to(self.shared.clone())
    }

    /// True if closed by `cancel`.
    pub fn is_cancelled(&self) -> bool {
        self.shared.is_cancelled()
    }
}

/// What the scope's registry holds through a state's life (cargo-mutants: a state's last
/// release could skip its unregistration, leaving an entry per state in a long-lived scope,
/// and no test saw it: the registry is not visible from outside).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn members(t: &TaskSpill) -> usize {
        t.shared().registry.lock().members.len()
    }

    #[test]
    fn a_state_leaves_its_scope_with_its_last_grant() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::EngineConfig::new(dir.path()).backend(crate::BackendKind::Psync);
        let engine = crate::Engine::open(cfg).unwrap();
        let task = engine.task("registry").unwrap();
        let mut w = task.writer().unwrap();
        assert_eq!(members(&task), 1, "the writer");
        w.write(bytes::Bytes::from_static(b"record")).unwrap();
        let st = w.finish().unwrap();
        assert_eq!(members(&task), 1, "the state, in the writer's place");
        let r = st.reader().unwrap();
        let copy = st.clone();
        drop(st);
        drop(copy);
        assert_eq!(members(&task), 1, "a reader's grant keeps it registered");
        drop(r);
        assert_eq!(members(&task), 0, "the last grant unregisters it");
        let w = task.writer().unwrap();
        drop(w);
        assert_eq!(members(&task), 0, "a dropped writer unregisters too");
    }
}
