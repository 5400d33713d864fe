//! A task's scope: its cleanup registry. Its segments live flat in the engine's process
//! directory under each root (no directory per task: no mkdir, rmdir or directory fd on the
//! hot path); the scope owns them through its registered writers and states. Closing the scope
//! (`close`, `cancel`, or dropping the last handle) closes everything registered, newest
//! first. Registering on a closed scope closes the resource on the spot and fails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::core::{Core, EngineGuard};
use crate::error::{Result, SpillError};
use crate::fault::FaultPlan;
use crate::spill::writer::SpillWriter;
use crate::store::dir::TaskDir;

/// Something a scope closes when it closes.
pub(crate) trait Member: Send + Sync {
    /// Closes the resource: sets its abort flag and queues the deletion of its files. Never
    /// waits for I/O.
    fn close_by_scope(&self);
}

#[derive(Default)]
struct Registry {
    closed: bool,
    next: u64,
    members: BTreeMap<u64, Arc<dyn Member>>,
}

/// Shared state of a task scope. Writers and states hold it to unregister; only
/// [`TaskSpill`] handles keep the scope open.
pub(crate) struct TaskShared {
    pub(crate) id: String,
    core: Arc<Core>,
    /// Keeps the engine's threads alive while the scope lives.
    _engine: EngineGuard,
    registry: Mutex<Registry>,
    cancelled: AtomicBool,
    seq: u64,
    fault: Mutex<Option<Arc<FaultPlan>>>,
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
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.registry.lock().closed
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
        let mut r = self.registry.lock();
        if r.closed {
            drop(r);
            m.close_by_scope();
            return Err(SpillError::Aborted);
        }
        r.next += 1;
        let id = r.next;
        r.members.insert(id, m);
        Ok(id)
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.registry.lock().members.remove(&id);
    }

    /// Takes member `id` out of an open scope; false if the scope is closed (it closed the
    /// member) or `id` is not registered.
    pub(crate) fn take_member(&self, id: u64) -> bool {
        let mut r = self.registry.lock();
        !r.closed && r.members.remove(&id).is_some()
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
        r.members.remove(&old);
        r.next += 1;
        let id = r.next;
        r.members.insert(id, new);
        Ok(id)
    }

    /// Closes the scope: every member, newest first. Idempotent.
    pub(crate) fn close(&self, cancel: bool) {
        if cancel {
            self.cancelled.store(true, Ordering::Relaxed);
        }
        let members = {
            let mut r = self.registry.lock();
            if r.closed {
                return;
            }
            r.closed = true;
            std::mem::take(&mut r.members)
        };
        for (_, m) in members.into_iter().rev() {
            m.close_by_scope();
        }
    }

    /// Where this task's segments go under root `root`: the engine's process directory there
    /// (segments live flat in it; the scope owns its segments, not a directory).
    pub(crate) fn dir(&self, root: usize) -> Result<Arc<TaskDir>> {
        if self.is_closed() {
            return Err(SpillError::Aborted);
        }
        self.core.store.root_dir(root)
    }
}

/// Closes the scope when the last [`TaskSpill`] handle goes.
struct CloseOnDrop(Arc<TaskShared>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close(false);
    }
}

/// A task's spill scope. Cheap to clone: clones share the scope, which closes when `close` or
/// `cancel` is called on any of them, or when the last one is dropped. `Send + Sync`, so an
/// executor can cancel from another thread than the one writing.
#[derive(Clone)]
pub struct TaskSpill {
    shared: Arc<TaskShared>,
    _guard: Arc<CloseOnDrop>,
}

impl std::fmt::Debug for TaskSpill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl TaskSpill {
    pub(crate) fn new(core: Arc<Core>, engine: EngineGuard, id: &str, seq: u64) -> Self {
        let shared = Arc::new(TaskShared {
            id: id.to_owned(),
            core,
            _engine: engine,
            registry: Mutex::new(Registry::default()),
            cancelled: AtomicBool::new(false),
            seq,
            fault: Mutex::new(None),
        });
        TaskSpill {
            _guard: Arc::new(CloseOnDrop(shared.clone())),
            shared,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<TaskShared> {
        &self.shared
    }

    /// The task id given to [`crate::Engine::task`].
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// A new writer, registered with this scope (its abort hook). Fails with `Closed` on a
    /// closed scope or a shut-down engine.
    pub fn writer(&self) -> Result<SpillWriter> {
        if self.shared.core.is_shut_down() {
            return Err(SpillError::Closed { what: "engine" });
        }
        if self.shared.is_closed() {
            return Err(SpillError::Closed { what: "task scope" });
        }
        SpillWriter::new(self.shared.clone())
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
        state.move_to(self.shared.clone())
    }

    /// True if closed by `cancel`.
    pub fn is_cancelled(&self) -> bool {
        self.shared.cancelled.load(Ordering::Relaxed)
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
