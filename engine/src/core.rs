//! What the engine's threads and handles share: the configuration, the counters, the I/O lanes
//! (with their buffers and reaper) and the store. Lower layers never see it; the cleanup path,
//! the spill stages and the engine facade do.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::EngineConfig;
use crate::fault::FaultPlan;
use crate::io::IoHandle;
use crate::metrics::Counters;
use crate::store::Store;

/// What the engine's threads and handles share.
pub(crate) struct Core {
    pub(crate) cfg: EngineConfig,
    /// This engine's id (in its directory names and segment headers).
    pub(crate) id: u64,
    pub(crate) counters: Counters,
    /// The engine's fault plan (always `None` without the `fault-injection` feature).
    pub(crate) fault: Option<Arc<FaultPlan>>,
    pub(crate) io: IoHandle,
    pub(crate) store: Store,
    /// Set once a shutdown began: admission of new tasks and writers stops.
    shut: AtomicBool,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("id", &format_args!("{:016x}", self.id))
            .field("backend", &self.io.kind())
            .finish()
    }
}

impl Core {
    pub(crate) fn new(cfg: EngineConfig, id: u64, io: IoHandle, store: Store) -> Self {
        Core {
            fault: cfg.fault_plan.clone(),
            cfg,
            id,
            counters: Counters::default(),
            io,
            store,
            shut: AtomicBool::new(false),
        }
    }

    /// Notes a failed create or write on `root`; true if it was a device error (the root is
    /// skipped for a while).
    pub(crate) fn root_failed(&self, root: usize, e: &io::Error) -> bool {
        self.store.roots.failed(root, e, &self.counters)
    }

    /// Marks the engine shut down; true if it already was.
    pub(crate) fn begin_shutdown(&self) -> bool {
        self.shut.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut.load(Ordering::Acquire)
    }
}

/// Keeps the engine (its threads) alive while a handle lives, without the handle's layer
/// naming the engine's type.
pub(crate) type EngineGuard = Arc<dyn Send + Sync>;
