//! What the engine's threads and handles share: the configuration, the counters, the I/O lanes
//! (with their buffers and reaper) and the store. Lower layers never see it; the cleanup path,
//! the spill stages and the engine facade do.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::EngineConfig;
use crate::fault::FaultPlan;
use crate::format::crypt::{BlockKey, KEY_LEN};
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
    /// The block key when `encryption(true)`: made at open, held only here, never written.
    pub(crate) key: Option<BlockKey>,
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
    pub(crate) fn new(
        cfg: EngineConfig,
        id: u64,
        io: IoHandle,
        store: Store,
        key: Option<BlockKey>,
    ) -> Self {
        Core {
            key,
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

    /// The key id written in segment headers (0: not encrypted).
    pub(crate) fn key_id(&self) -> u64 {
        self.key.as_ref().map_or(0, BlockKey::id)
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

/// A fresh block key: 32 bytes from `getrandom` (wiped once the cipher key is built) and a
/// random nonzero key id. A short or failed `getrandom` is an error, never a weaker key.
pub(crate) fn make_key() -> io::Result<BlockKey> {
    let mut raw = zeroize::Zeroizing::new([0u8; KEY_LEN]);
    fill_random(&mut raw[..])?;
    let mut id = [0u8; 8];
    let mut key_id = 0;
    while key_id == 0 {
        fill_random(&mut id)?;
        key_id = u64::from_le_bytes(id);
    }
    BlockKey::new(raw, key_id).map_err(io::Error::other)
}

fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match crate::sys::rand::getrandom(&mut buf[got..]) {
            Ok(0) => return Err(io::Error::other("getrandom returned no bytes")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
