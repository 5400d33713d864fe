//! The segment pool: released segment files kept for reuse, per root, so the steady-state spill
//! creates, allocates and unlinks nothing (and, on a filesystem mounted with `discard`, pays no
//! discard of freed blocks on the next spill's writes).
//!
//! A pooled file is still a file the engine must delete: its [`SegmentEntry`] keeps its ticket
//! (counted in the ledger and the byte quota), so everything the ownership rules say of a
//! segment holds for it. It leaves the pool by reuse (a writer takes it, with the next
//! generation), by trimming (past a bound, under ledger or quota pressure, at shutdown, or on
//! `Engine::trim_pool`), which hands it to the normal delete path, or by the crash sweep.
//!
//! Only a finished state's files come here, when its last grant goes and no `Bytes` still
//! points into a mapping of them: every write to them completed, and a record a caller holds
//! never changes under it.

use parking_lot::Mutex;

use crate::store::entry::SegmentEntry;

/// The pool's bounds and its files, per root.
#[derive(Debug)]
pub(crate) struct SegmentPool {
    max_segments: usize,
    max_bytes: u64,
    inner: Mutex<Pooled>,
}

#[derive(Debug, Default)]
struct Pooled {
    per_root: Vec<Vec<SegmentEntry>>,
    count: usize,
    bytes: u64,
    /// Set by [`SegmentPool::close`] (shutdown): nothing enters the pool any more.
    closed: bool,
}

/// Bytes a pooled file takes on disk (its written length: a buffered file is that long; a
/// direct one was trimmed to whole blocks past it).
fn size_of(e: &SegmentEntry) -> u64 {
    e.len.max(e.allocated)
}

impl SegmentPool {
    /// A pool of at most `max_segments` files and `max_bytes` bytes over `roots` roots. Zero
    /// of either turns it off.
    pub(crate) fn new(roots: usize, max_segments: usize, max_bytes: u64) -> Self {
        SegmentPool {
            max_segments,
            max_bytes,
            inner: Mutex::new(Pooled {
                per_root: (0..roots).map(|_| Vec::new()).collect(),
                count: 0,
                bytes: 0,
                closed: false,
            }),
        }
    }

    /// True when the pool keeps files at all.
    pub(crate) fn enabled(&self) -> bool {
        self.max_segments > 0 && self.max_bytes > 0
    }

    /// Keeps `e` for reuse if it fits the bounds; gives it back (to delete) otherwise.
    pub(crate) fn put(&self, mut e: SegmentEntry) -> Result<(), SegmentEntry> {
        let size = size_of(&e);
        let root = e.dir.root;
        let mut p = self.inner.lock();
        if p.closed
            || p.count >= self.max_segments
            || p.bytes.saturating_add(size) > self.max_bytes
            || root >= p.per_root.len()
        {
            return Err(e);
        }
        p.count += 1;
        p.bytes += size;
        // Its age in `Engine::list_files` counts from here.
        e.since = std::time::Instant::now();
        p.per_root[root].push(e);
        Ok(())
    }

    /// A pooled file under `root` (the most recently released: its blocks and pages are the
    /// warmest), if any.
    pub(crate) fn take(&self, root: usize) -> Option<SegmentEntry> {
        let mut p = self.inner.lock();
        let e = p.per_root.get_mut(root)?.pop()?;
        p.count -= 1;
        p.bytes -= size_of(&e);
        Some(e)
    }

    /// Any pooled file, from the root holding the most (to trim under pressure).
    pub(crate) fn take_any(&self) -> Option<SegmentEntry> {
        let root = {
            let p = self.inner.lock();
            (0..p.per_root.len()).max_by_key(|&r| p.per_root[r].len())?
        };
        self.take(root)
    }

    /// Every pooled file (to delete: shutdown, `Engine::trim_pool`).
    pub(crate) fn drain(&self) -> Vec<SegmentEntry> {
        let mut p = self.inner.lock();
        p.count = 0;
        p.bytes = 0;
        p.per_root.iter_mut().flat_map(std::mem::take).collect()
    }

    /// Every pooled file, and no file enters the pool from now on (shutdown: a state released
    /// after it deletes its files instead of pooling them where nobody would trim them).
    pub(crate) fn close(&self) -> Vec<SegmentEntry> {
        self.inner.lock().closed = true;
        self.drain()
    }

    /// The pooled files as operators see them (read-only; `Engine::list_files`).
    pub(crate) fn views(&self) -> Vec<crate::store::entry::EntryView> {
        let p = self.inner.lock();
        p.per_root
            .iter()
            .flatten()
            .map(SegmentEntry::view)
            .collect()
    }

    /// What the pool holds now: files and their bytes.
    pub(crate) fn level(&self) -> (u64, u64) {
        let p = self.inner.lock();
        (p.count as u64, p.bytes)
    }
}
