//! What the engine's threads and handles share: the configuration, the counters, the I/O lanes
//! (with their buffers and reaper) and the store. Lower layers never see it; the cleanup path,
//! the spill stages and the engine facade do.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::EngineConfig;
use crate::fault::FaultPlan;
use crate::format::crypt::{BlockKey, KEY_LEN};
use crate::io::{IoHandle, ReadBufs};
use crate::metrics::Counters;
use crate::store::Store;
use crate::store::entry::SegmentEntry;

/// Spares (per-cycle objects) of a kind each [`SpareList`] keeps at most.
pub(crate) const SPARES_CAP: usize = 64;

/// A recycled spare of the spill layer, type-erased (the core layer does not name it).
pub(crate) type Spare = Arc<dyn std::any::Any + Send + Sync>;

/// A bounded free list of per-cycle spares (issue 10: a spill cycle allocates at most twice):
/// a writer's shared state, a state's, the file list of a writer. `put` keeps at most
/// [`SPARES_CAP`]; `close` (at shutdown) empties it and refuses later puts, so the spares'
/// references to the engine never keep it alive.
pub(crate) struct SpareList<T> {
    items: parking_lot::Mutex<(bool, Vec<T>)>,
}

impl<T> SpareList<T> {
    fn new() -> Self {
        SpareList {
            items: parking_lot::Mutex::new((false, Vec::with_capacity(SPARES_CAP))),
        }
    }

    /// A kept spare, if there is one.
    pub(crate) fn take(&self) -> Option<T> {
        self.items.lock().1.pop()
    }

    /// Keeps `t`; gives it back (for the caller to drop, outside the lock) when the spare list is
    /// full or closed.
    pub(crate) fn put(&self, t: T) -> std::result::Result<(), T> {
        let mut items = self.items.lock();
        if items.0 || items.1.len() >= SPARES_CAP {
            return Err(t);
        }
        items.1.push(t);
        Ok(())
    }

    /// Spares kept now.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn len(&self) -> usize {
        self.items.lock().1.len()
    }

    /// Empties the spare list for good (shutdown).
    fn close(&self) {
        let items = {
            let mut items = self.items.lock();
            items.0 = true;
            std::mem::take(&mut items.1)
        };
        drop(items);
    }
}

/// What the engine's threads and handles share.
pub(crate) struct EngineShared {
    pub(crate) cfg: EngineConfig,
    /// This engine's id (in its directory names and segment headers).
    pub(crate) id: u64,
    pub(crate) counters: Counters,
    /// The engine's fault plan (always `None` without the `fault-injection` feature).
    pub(crate) fault: Option<Arc<FaultPlan>>,
    pub(crate) io: IoHandle,
    pub(crate) store: Store,
    /// Kept buffers for readers' small-segment `pread`s (bounded: see `io/readbuf.rs`).
    pub(crate) read_bufs: Arc<ReadBufs>,
    /// Recycled writer spares (`spill/writer/hook.rs` `WriterShared`).
    pub(crate) writer_spares: SpareList<Spare>,
    /// Recycled state spares (`spill/grant.rs` `StateShared`).
    pub(crate) state_spares: SpareList<Spare>,
    /// Empty file lists with room for a segment, for the next writer.
    pub(crate) entry_lists: SpareList<Vec<SegmentEntry>>,
    /// The block key when `encryption(true)`: made at open, held only here, never written.
    pub(crate) key: Option<BlockKey>,
    /// Set once a shutdown began: admission of new tasks and writers stops.
    shut: AtomicBool,
}

impl std::fmt::Debug for EngineShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineShared")
            .field("id", &format_args!("{:016x}", self.id))
            .field("backend", &self.io.kind())
            .finish()
    }
}

impl EngineShared {
    pub(crate) fn new(
        cfg: EngineConfig,
        id: u64,
        io: IoHandle,
        store: Store,
        key: Option<BlockKey>,
    ) -> Self {
        EngineShared {
            key,
            fault: cfg.fault_plan.clone(),
            read_bufs: ReadBufs::new(cfg.read_buffer_max),
            writer_spares: SpareList::new(),
            state_spares: SpareList::new(),
            entry_lists: SpareList::new(),
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

    /// Empties the spare lists for good (shutdown): a spare holds the core, and the
    /// spare lists are the core's.
    pub(crate) fn close_spare_lists(&self) {
        self.writer_spares.close();
        self.state_spares.close();
        self.entry_lists.close();
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
    crate::sys::rand::fill(&mut raw[..])?;
    let mut id = [0u8; 8];
    let mut key_id = 0;
    while key_id == 0 {
        crate::sys::rand::fill(&mut id)?;
        key_id = u64::from_le_bytes(id);
    }
    BlockKey::new(raw, key_id).map_err(io::Error::other)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_spare_list_keeps_its_bound_and_nothing_once_closed() {
        let spares = SpareList::new();
        for i in 0..SPARES_CAP {
            assert!(spares.put(i).is_ok());
        }
        assert_eq!(spares.put(SPARES_CAP), Err(SPARES_CAP), "full: given back");
        assert_eq!(spares.len(), SPARES_CAP);
        assert_eq!(spares.take(), Some(SPARES_CAP - 1));
        spares.close();
        assert_eq!(spares.len(), 0, "closing empties it");
        assert_eq!(spares.put(1), Err(1), "closed: refused");
        assert_eq!(spares.take(), None);
    }
}
