//! The grants on a finished spill's files: the protocol ([`Grants`]) by which they are deleted
//! exactly once, by the last grant's release or by the scope's close, whichever comes first,
//! and the shared state ([`StateShared`]) that [`crate::spill::state::SpilledState`] handles and
//! [`crate::spill::reader::SpillReader`]s hold through a [`Grant`].
//!
//! The grants, the scope's close and publish's life states are model-checked with loom
//! (`loom_grants_*` in `grant_loom.rs`, see `scripts/loom.sh`).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::cleanup::{delete_segments, recycle};
use crate::error::{Result, SpillError};
use crate::shared::EngineShared;
use crate::spill::task::{Member, TaskShared};
use crate::store::entry::SegmentEntry;
use crate::store::proc::ProcDir;
use crate::sync;

/// Where a state's files are in their life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// The state holds them.
    Held,
    /// `publish` is renaming them: grants wait for it to end (it rolls back to `Held` when it
    /// fails: it moves back whatever it had moved first).
    Publishing,
    /// They went to the caller by `publish`.
    Published,
    /// Deleted or queued for deletion (last grant released, or the scope closed the state).
    Gone,
}

#[derive(Debug)]
struct Owned<T> {
    entries: Vec<T>,
    grants: usize,
    life: Life,
}

/// The files of a state (a list of `T`), the grants on them and their [`Life`]: deleted
/// exactly once, by the last grant's release or by the scope's close, whichever comes first;
/// a grant taken after the close fails with `Aborted`; a publish under way holds them, and
/// settles them itself if the close came meanwhile. Each method that hands back files hands
/// them to its caller, who deletes (or publishes) them; no two callers ever get the same file.
#[derive(Debug)]
pub(crate) struct Grants<T> {
    owned: sync::Mutex<Owned<T>>,
    /// Wakes grants waiting for a publish to end.
    published_cv: sync::Condvar,
    /// Set when the scope closed the state: readers report `Aborted`.
    aborted: sync::AtomicBool,
}

impl<T> Grants<T> {
    /// Holds `entries`, with one grant.
    pub(crate) fn new(entries: Vec<T>) -> Self {
        Grants {
            owned: sync::Mutex::new(Owned {
                entries,
                grants: 1,
                life: Life::Held,
            }),
            published_cv: sync::Condvar::new(),
            aborted: sync::AtomicBool::new(false),
        }
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(sync::Ordering::Acquire)
    }

    /// Runs `f` on the files held (none once they are gone or published).
    pub(crate) fn with_entries<R>(&self, f: impl FnOnce(&[T]) -> R) -> R {
        f(&self.owned.lock().entries)
    }

    /// Runs `f` on the files held, to change one in place (none once they are gone or
    /// published).
    pub(crate) fn with_entries_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> R {
        f(&mut self.owned.lock().entries)
    }

    /// Takes a grant unless the files are already gone. Waits for a publish under way to end.
    pub(crate) fn acquire(&self) -> Result<()> {
        let mut o = self.owned.lock();
        loop {
            if self.is_aborted() {
                return Err(SpillError::Aborted);
            }
            match o.life {
                Life::Held => break,
                Life::Publishing => self.published_cv.wait(&mut o),
                Life::Published => {
                    return Err(SpillError::Closed {
                        what: "published state",
                    });
                }
                Life::Gone => return Err(SpillError::Aborted),
            }
        }
        o.grants += 1;
        Ok(())
    }

    /// Another grant from one held (a clone), whatever the files' life.
    pub(crate) fn add(&self) {
        self.owned.lock().grants += 1;
    }

    /// Releases a grant: the last one, while the files are held, takes them (to delete).
    pub(crate) fn release(&self) -> Option<Vec<T>> {
        let mut o = self.owned.lock();
        o.grants -= 1;
        if o.grants > 0 || o.life != Life::Held {
            return None;
        }
        o.life = Life::Gone;
        Some(std::mem::take(&mut o.entries))
    }

    /// The scope's close: sets the abort flag, and takes the files (to delete) if they are
    /// held. A publish under way settles its files itself: it sees the flag when it ends.
    pub(crate) fn close(&self) -> Option<Vec<T>> {
        let mut o = self.owned.lock();
        self.aborted.store(true, sync::Ordering::Release);
        if o.life != Life::Held {
            return None;
        }
        o.life = Life::Gone;
        Some(std::mem::take(&mut o.entries))
    }

    /// Starts a publish: takes the files (grants wait for it to end). Needs the only grant.
    pub(crate) fn begin_publish(&self) -> Result<Vec<T>> {
        let mut o = self.owned.lock();
        match o.life {
            Life::Published | Life::Publishing => {
                return Err(SpillError::Closed {
                    what: "published state",
                });
            }
            Life::Gone => return Err(SpillError::Aborted),
            Life::Held if self.is_aborted() => return Err(SpillError::Aborted),
            Life::Held => {}
        }
        if o.grants > 1 {
            return Err(SpillError::StateShared { grants: o.grants });
        }
        o.life = Life::Publishing;
        Ok(std::mem::take(&mut o.entries))
    }

    /// Ends a publish that failed (any file it moved was moved back first): the files are held
    /// again, unless the scope closed meanwhile: then they are handed back (to delete) and
    /// gone.
    pub(crate) fn roll_back_publish(&self, entries: Vec<T>) -> Option<Vec<T>> {
        let mut o = self.owned.lock();
        let back = if self.is_aborted() {
            o.life = Life::Gone;
            Some(entries)
        } else {
            o.entries = entries;
            o.life = Life::Held;
            None
        };
        self.published_cv.notify_all();
        back
    }

    /// Ends a publish that moved files: they are the caller's (or deleted by it) now.
    pub(crate) fn end_publish(&self) {
        let mut o = self.owned.lock();
        o.life = Life::Published;
        self.published_cv.notify_all();
    }
}

/// Where a state's segment is, for its reader.
pub(crate) struct SegmentAt {
    pub(crate) dir: Arc<ProcDir>,
    pub(crate) seg: u32,
    pub(crate) len: u64,
    pub(crate) generation: u32,
    /// The writer's fd, kept with the file (buffered mode), if still open.
    pub(crate) fd: Option<Arc<crate::io::FileHandle>>,
    /// The map a reader of the file's last use left with it (buffered mode).
    pub(crate) map: Option<crate::io::SharedMap>,
}

/// What a state's handles share: its files under their [`Grants`], and where to hand them back.
pub(crate) struct StateShared {
    core: Arc<EngineShared>,
    /// The scope the state is registered with (its backstop), and its id there. Changed only
    /// by [`StateShared::move_to`]; the lock orders a move against an unregistration. `None`
    /// only while the spare is kept for reuse (see [`StateShared::keep_spare`]), when no handle
    /// can reach it.
    scope: parking_lot::Mutex<Option<Arc<TaskShared>>>,
    /// The I/O lane the state's deletes go to (its writer's).
    pub(crate) lane: usize,
    pub(crate) segments: usize,
    pub(crate) files: Grants<SegmentEntry>,
    /// Its id in the scope's registry (stored right after registration).
    scope_id: AtomicU64,
    pub(crate) bytes: u64,
    /// Records in the state, and their payload bytes (the writer's counts at `finish`).
    pub(crate) records: u64,
    pub(crate) payload: u64,
    /// Live mappings per segment (a mapping lives while any `Bytes` into it does): a mapped
    /// segment never goes back to the pool. One allocation for all segments, made by the
    /// first mapping (a state read with `pread`s alone, the small-spill cycle, makes none).
    maps: std::sync::OnceLock<Arc<[AtomicUsize]>>,
    /// The state's `tracing` span (debug level, under its first scope's): segments, bytes,
    /// outcome (published, released, aborted).
    pub(crate) span: tracing::Span,
}

impl std::fmt::Debug for StateShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpilledState")
            .field("segments", &self.segments)
            .field("bytes", &self.bytes)
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

impl StateShared {
    pub(crate) fn core(&self) -> &Arc<EngineShared> {
        &self.core
    }

    /// The scope the state is registered with now.
    pub(crate) fn task(&self) -> Option<Arc<TaskShared>> {
        self.scope.lock().clone()
    }

    /// What a reader is told when the state is gone: `Aborted` stays `Aborted` after a cancel
    /// (or a shutdown); after its scope's normal close it is `ScopeClosed`, which says to
    /// adopt the state (issue 25: it read as a cancel). Any other error is returned as is.
    pub(crate) fn why_gone(&self, e: SpillError) -> SpillError {
        if !e.is_aborted() {
            return e;
        }
        match self.task() {
            Some(t) if t.is_closed() && !t.is_cancelled() => SpillError::ScopeClosed {
                task: t.id.as_str().to_string(),
            },
            _ => e,
        }
    }

    /// A reader refused by `SpilledState::reader` / `into_reader`: [`StateShared::why_gone`],
    /// counted in the metrics' errors by kind.
    pub(crate) fn refused_reader(&self, e: SpillError) -> SpillError {
        let e = self.why_gone(e);
        self.core().counters.count_error(&e);
        e
    }

    /// Records the id the state got in its scope's registry.
    pub(crate) fn set_scope_id(&self, id: u64) {
        self.scope_id.store(id, Ordering::Release);
    }

    /// Takes the state out of its scope's registry (its files went by release or publish).
    pub(crate) fn unregister(&self) {
        if let Some(scope) = self.scope.lock().as_ref() {
            scope.unregister(self.scope_id.load(Ordering::Acquire));
        }
    }

    /// Moves the state's registration to scope `to` in one step: `to` closes it from then on.
    /// `Aborted` if its scope already closed it (or `to` is closed: then `to` closed it).
    pub(crate) fn move_to(self: &Arc<Self>, to: Arc<TaskShared>) -> Result<()> {
        let mut scope = self.scope.lock();
        let Some(cur) = scope.as_ref() else {
            return Err(SpillError::Aborted);
        };
        if Arc::ptr_eq(cur, &to) {
            return if self.is_aborted() {
                Err(SpillError::Aborted)
            } else {
                Ok(())
            };
        }
        if !cur.take_member(self.scope_id.load(Ordering::Acquire)) {
            // The old scope closed (and so closed the state), or the files are gone.
            return Err(SpillError::Aborted);
        }
        let id = to.register(self.clone())?;
        self.scope_id.store(id, Ordering::Release);
        *scope = Some(to);
        Ok(())
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.files.is_aborted()
    }

    /// Segment `i`: where it is, its written length and generation, and the fd and map its
    /// last use left with it if still open and fit for plain reads (not `O_DIRECT`); `None`
    /// once the files are gone.
    pub(crate) fn segment(&self, i: usize) -> Option<SegmentAt> {
        let plain = self.core().cfg.mode != crate::config::WriteMode::Direct;
        self.files.with_entries(|es| {
            es.get(i).map(|e| SegmentAt {
                dir: e.dir.clone(),
                seg: e.seg,
                len: e.len,
                generation: e.generation,
                fd: if plain { e.kept_fd() } else { None },
                map: if plain { e.map.clone() } else { None },
            })
        })
    }

    /// Keeps `map`, just made of segment `i` (use `generation`), with its file for the
    /// readers of the file's next uses; a no-op once the files are gone.
    pub(crate) fn keep_map(&self, i: usize, generation: u32, map: crate::io::SharedMap) {
        self.files.with_entries_mut(|es| {
            if let Some(e) = es.get_mut(i)
                && e.generation == generation
            {
                e.map = Some(map);
            }
        });
    }

    /// Holds `entries` (of `records` records, `payload` bytes of them) with one grant, not yet
    /// registered.
    fn new(
        task: Arc<TaskShared>,
        lane: usize,
        entries: Vec<SegmentEntry>,
        (records, payload): (u64, u64),
    ) -> Self {
        let bytes = entries.iter().map(|e| e.len).sum();
        StateShared {
            span: tracing::debug_span!(parent: &task.span, "spillring.state",
                segments = entries.len() as u64, bytes, outcome = tracing::field::Empty),
            bytes,
            records,
            payload,
            segments: entries.len(),
            maps: std::sync::OnceLock::new(),
            files: Grants::new(entries),
            scope_id: AtomicU64::new(0),
            core: task.core().clone(),
            scope: parking_lot::Mutex::new(Some(task)),
            lane,
        }
    }

    /// [`StateShared::new`] in a recycled spare (`core.state_spares`) if there is one.
    pub(crate) fn make(
        task: Arc<TaskShared>,
        lane: usize,
        entries: Vec<SegmentEntry>,
        counts: (u64, u64),
    ) -> Arc<Self> {
        if let Some(spare) = task.core().state_spares.take()
            && let Ok(mut inner) = spare.downcast::<StateShared>()
            && let Some(s) = Arc::get_mut(&mut inner)
        {
            let maps = s.maps.take();
            *s = StateShared::new(task, lane, entries, counts);
            // The mapping counts of the last state, if no record of it holds them any more
            // and they fit (a mapped read allocates nothing for them then).
            if let Some(mut m) = maps
                && m.len() == s.segments
                && let Some(counts) = Arc::get_mut(&mut m)
            {
                for c in counts.iter_mut() {
                    *c.get_mut() = 0;
                }
                let _ = s.maps.set(m);
            }
            return inner;
        }
        Arc::new(StateShared::new(task, lane, entries, counts))
    }

    /// The last handle is going: if nobody else holds the state (its files went: released,
    /// closed or published, and it left its scope's registry), the spare is kept for the next
    /// state, holding neither a scope nor files.
    fn keep_spare(this: &mut Arc<Self>) {
        if Arc::weak_count(this) != 0 {
            return;
        }
        let Some(s) = Arc::get_mut(this) else { return };
        if s.files.with_entries(|es| !es.is_empty()) {
            return;
        }
        let scope = s.scope.get_mut().take();
        // The span ends with the state, not when the spare is reused.
        s.span = tracing::Span::none();
        let spare: crate::shared::Spare = this.clone();
        // A full or closed spare list gives the clone back; it drops here.
        let _ = this.core.state_spares.put(spare);
        drop(scope);
    }

    /// The live-mapping counts per segment, made on first use.
    pub(crate) fn maps(&self) -> &Arc<[AtomicUsize]> {
        self.maps
            .get_or_init(|| (0..self.segments).map(|_| AtomicUsize::new(0)).collect())
    }

    /// Releases a grant; the last one hands the files back: to the segment pool those no
    /// mapping points into any more, to the delete path the rest. (No reader can map one
    /// meanwhile: readers are grants.)
    pub(crate) fn release(&self) {
        let Some(entries) = self.files.release() else {
            return;
        };
        self.span.record("outcome", "released");
        self.unregister();
        let mapped = |i: usize| {
            self.maps
                .get()
                .and_then(|m| m.get(i))
                .is_some_and(|c| c.load(Ordering::Acquire) > 0)
        };
        recycle(self.core(), self.lane, entries, mapped);
    }
}

impl Member for StateShared {
    fn usage(&self) -> crate::spill::task::SpillUsage {
        let (files, bytes) = self.files.with_entries(|es| {
            (
                es.len() as u64,
                es.iter().map(|e| e.len.max(e.allocated)).sum(),
            )
        });
        crate::spill::task::SpillUsage::of_state(files, bytes)
    }

    fn files(&self, out: &mut Vec<crate::store::entry::EntryView>) {
        self.files
            .with_entries(|es| out.extend(es.iter().map(SegmentEntry::view)));
    }

    fn close_by_scope(&self) {
        let Some(entries) = self.files.close() else {
            return;
        };
        self.span.record("outcome", "aborted");
        delete_segments(self.core(), self.lane, entries);
    }
}

/// One grant on a state's files, released on drop.
#[derive(Debug)]
pub(crate) struct Grant(pub(crate) Arc<StateShared>);

/// Another grant on the same files, whatever their life (a grant of a state the scope closed
/// is closed too).
impl Clone for Grant {
    fn clone(&self) -> Self {
        self.0.files.add();
        Grant(self.0.clone())
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.0.release();
        StateShared::keep_spare(&mut self.0);
    }
}

/// Turns an `openat` failure of a state's segment into the error a reader reports: a file
/// missing because the scope aborted is `Aborted`, never a bare NotFound.
pub(crate) fn open_error(state: &StateShared, path: PathBuf, e: io::Error) -> SpillError {
    if state.is_aborted() {
        SpillError::Aborted
    } else {
        SpillError::io("open", path, e)
    }
}

/// The grant protocol step by step, on plain numbers (the loom models check the interleavings;
/// these pin each method's outcome, which cargo-mutants showed only the engine tests touched).
#[cfg(all(test, not(loom)))]
#[path = "grant_tests.rs"]
mod tests;

#[cfg(all(test, loom))]
#[path = "grant_loom.rs"]
mod loom_tests;
