//! Stage 2: the finished segments of a spill, shared by refcounted grants.
//!
//! A [`SpilledState`] is itself a grant, and so is every [`SpillReader`] made from it; clones
//! are grants too. The files are deleted when the last grant is released, or when the task
//! scope closes (then every reader sees `Aborted`). Either way the deletes are queued to an I/O
//! thread, never run on the caller's. `close` is idempotent.
//!
//! The grants, the scope's close and publish's life states are the protocol of [`Grants`],
//! model-checked with loom (`loom_grants_*` below, see `scripts/loom.sh`).

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cleanup::{SegmentEntry, delete_segments, remove_dir};
use crate::dir::{self, DirNext, TaskDir};
use crate::engine::Core;
use crate::error::{Result, SpillError};
use crate::metrics::Counters;
use crate::reader::SpillReader;
use crate::segment::SegmentFileName;
use crate::sync;
use crate::task::{Member, TaskShared};

/// Where a state's files are in their life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// The state holds them.
    Held,
    /// `publish` is renaming them: grants wait for it to end (it rolls back to `Held` when
    /// nothing moved).
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
            return Err(SpillError::InvalidConfig(
                "publish needs the only grant: drop readers and clones first".into(),
            ));
        }
        o.life = Life::Publishing;
        Ok(std::mem::take(&mut o.entries))
    }

    /// Ends a publish that moved nothing: the files are held again, unless the scope closed
    /// meanwhile: then they are handed back (to delete) and gone.
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

pub(crate) struct StateInner {
    pub(crate) task: Arc<TaskShared>,
    lane: usize,
    segments: usize,
    files: Grants<SegmentEntry>,
    scope_id: AtomicU64,
    bytes: u64,
}

impl std::fmt::Debug for StateInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpilledState")
            .field("segments", &self.segments)
            .field("bytes", &self.bytes)
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

impl StateInner {
    pub(crate) fn core(&self) -> &Arc<Core> {
        self.task.core()
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.files.is_aborted()
    }

    /// Where segment `i` is and its written length; `None` once the files are gone.
    pub(crate) fn segment(&self, i: usize) -> Option<(Arc<TaskDir>, u32, u64)> {
        self.files
            .with_entries(|es| es.get(i).map(|e| (e.dir.clone(), e.seg, e.len)))
    }

    pub(crate) fn segment_count(&self) -> usize {
        self.segments
    }

    /// Takes a grant unless the files are already gone. Waits for a publish under way to end.
    fn acquire(&self) -> Result<()> {
        self.files.acquire()
    }

    /// Releases a grant; the last one deletes the files.
    pub(crate) fn release(&self) {
        let Some(entries) = self.files.release() else {
            return;
        };
        self.task.unregister(self.scope_id.load(Ordering::Acquire));
        delete_segments(self.core(), self.lane, entries);
    }
}

impl Member for StateInner {
    fn close_by_scope(&self) {
        let Some(entries) = self.files.close() else {
            return;
        };
        delete_segments(self.core(), self.lane, entries);
    }
}

/// The spilled output of a finished writer: its segments, handed from stage to stage. A grant
/// on the files (see the module docs). `Clone` takes another grant.
#[derive(Debug)]
pub struct SpilledState {
    grant: Grant,
}

impl SpilledState {
    /// Builds the state holding `entries` with one grant, and registers it through `register`
    /// (the writer's atomic hand-off). If the scope is closed, `register` has already closed
    /// the state, and this returns the error.
    pub(crate) fn register(
        task: Arc<TaskShared>,
        lane: usize,
        entries: Vec<SegmentEntry>,
        register: impl FnOnce(Arc<dyn Member>) -> Result<u64>,
    ) -> Result<Self> {
        let bytes = entries.iter().map(|e| e.len).sum();
        let inner = Arc::new(StateInner {
            task,
            lane,
            segments: entries.len(),
            files: Grants::new(entries),
            scope_id: AtomicU64::new(0),
            bytes,
        });
        // Until the id is stored, a release would unregister id 0, which is never used; the
        // caller holds the only grant here, so no release can run before the store below.
        let id = register(inner.clone())?;
        inner.scope_id.store(id, Ordering::Release);
        Ok(SpilledState {
            grant: Grant(inner),
        })
    }

    fn inner(&self) -> &Arc<StateInner> {
        &self.grant.0
    }

    /// A reader over the records, in write order. Takes a grant; fails with `Aborted` if the
    /// scope already closed the state.
    pub fn reader(&self) -> Result<SpillReader> {
        self.inner().acquire()?;
        Ok(SpillReader::new(Grant(self.inner().clone())))
    }

    /// Turns this grant into a reader (fails with `Aborted` after a cancel).
    pub fn into_reader(self) -> Result<SpillReader> {
        if self.inner().is_aborted() {
            return Err(SpillError::Aborted);
        }
        Ok(SpillReader::new(self.grant))
    }

    /// Number of segment files.
    pub fn segments(&self) -> usize {
        self.inner().segments
    }

    /// Bytes in the segment files (headers and framing included, padding excluded).
    pub fn bytes(&self) -> u64 {
        self.inner().bytes
    }

    /// True once the scope closed the state (its files are deleted).
    pub fn is_aborted(&self) -> bool {
        self.inner().is_aborted()
    }

    /// Paths of the segment files, in order (empty once they are deleted).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.inner()
            .files
            .with_entries(|es| es.iter().map(SegmentEntry::path).collect())
    }

    /// Moves the segment files into `dest` (a directory the caller owns, on the same
    /// filesystem as the spill root), named `<prefix>-NNNNNN.bin`, and returns their new
    /// paths. The engine forgets them: their tickets are released and nothing of the engine
    /// will delete them; the state then holds no files (`reader` fails with `Closed`).
    /// Needs the only grant (no reader or clone alive); `Aborted` after a cancel.
    ///
    /// A bad destination or prefix changes nothing. If a rename fails after others succeeded,
    /// the files already moved stay with the caller (their paths are logged) and the rest
    /// are deleted.
    pub fn publish(&self, dest: &Path, prefix: &str) -> Result<Vec<PathBuf>> {
        let inner = self.inner();
        if prefix.is_empty() || prefix.contains('/') || prefix.contains('\0') {
            return Err(SpillError::InvalidConfig(format!(
                "publish prefix {prefix:?} must be a plain, non-empty file name prefix"
            )));
        }
        let dest_fd = dir::open_dir(dest).map_err(|e| SpillError::io("open", dest, e))?;
        let entries = inner.files.begin_publish()?;
        let core = inner.core().clone();
        let task_plan = inner.task.fault_plan();
        let _ = crate::fault::check2(
            task_plan.as_ref(),
            &core.fault,
            crate::fault::FaultPoint::StatePublish,
        );
        let mut moved = 0;
        let mut failure: Option<SpillError> = None;
        for (i, e) in entries.iter().enumerate() {
            let to_name = format!("{prefix}-{i:06}.bin");
            let from = SegmentFileName::new(e.seg);
            let res = CString::new(to_name.clone())
                .map_err(|_| SpillError::InvalidConfig("publish prefix contains a NUL".into()))
                .and_then(|to| {
                    // The caller gets exactly header and records: no allocated tail or
                    // direct-mode padding past the written length.
                    trim_to(&e.dir, &from, e.len)
                        .and_then(|()| {
                            dir::rename_at(e.dir.as_fd(), from.as_cstr(), dest_fd.as_fd(), &to)
                        })
                        .map_err(|err| SpillError::io("publish", dest.join(&to_name), err))
                });
            if let Err(err) = res {
                failure = Some(err);
                break;
            }
            moved += 1;
        }
        if let Some(err) = failure.take_if(|_| moved == 0) {
            // Nothing moved: the state keeps its files, as if publish had not been called
            // (unless the scope closed meanwhile: then they go the way of an abort).
            if let Some(entries) = inner.files.roll_back_publish(entries) {
                delete_segments(&core, inner.lane, entries);
            }
            return Err(err);
        } else if let Some(err) = failure {
            let mut rest = entries;
            let published: Vec<SegmentEntry> = rest.drain(..moved).collect();
            let out = forget_published(&core, dest, prefix, published);
            tracing::warn!(published = ?out, error = %err, "publish failed part way; the rest are deleted");
            delete_segments(&core, inner.lane, rest);
            inner.files.end_publish();
            inner
                .task
                .unregister(inner.scope_id.load(Ordering::Acquire));
            return Err(err);
        }
        let out = forget_published(&core, dest, prefix, entries);
        inner.files.end_publish();
        inner
            .task
            .unregister(inner.scope_id.load(Ordering::Acquire));
        Ok(out)
    }
}

/// Truncates a segment to its written length if it is longer.
fn trim_to(dir: &TaskDir, name: &SegmentFileName, len: u64) -> std::io::Result<()> {
    let fd = dir::open_write_at(dir.as_fd(), name.as_cstr())?;
    let f = std::fs::File::from(fd);
    if f.metadata()?.len() != len {
        f.set_len(len)?;
    }
    Ok(())
}

/// Releases the tickets of files moved to the caller; returns their new paths.
fn forget_published(
    core: &Arc<Core>,
    dest: &Path,
    prefix: &str,
    entries: Vec<SegmentEntry>,
) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        Counters::add(&core.counters.files_published, 1);
        out.push(dest.join(format!("{prefix}-{i:06}.bin")));
        let dir = e.release();
        if dir.file_gone() == DirNext::Remove {
            remove_dir(core, &dir.entry);
        }
    }
    out
}

impl Clone for SpilledState {
    /// Another grant on the same files. A clone of a state the scope closed is closed too.
    fn clone(&self) -> Self {
        self.inner().files.add();
        SpilledState {
            grant: Grant(self.inner().clone()),
        }
    }
}

/// One grant on a state's files, released on drop.
#[derive(Debug)]
pub(crate) struct Grant(pub(crate) Arc<StateInner>);

impl Drop for Grant {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Turns an `openat` failure of a state's segment into the error a reader reports: a file
/// missing because the scope aborted is `Aborted`, never a bare NotFound.
pub(crate) fn open_error(state: &StateInner, path: PathBuf, e: io::Error) -> SpillError {
    if state.is_aborted() {
        SpillError::Aborted
    } else {
        SpillError::io("open", path, e)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::{AtomicBool, AtomicUsize, Ordering};
    use loom::thread;

    /// The state's files in the models.
    const FILES: [u32; 2] = [0, 1];

    /// Files handed back by a `Grants` method: whoever gets them gets all of them.
    fn taken(v: Option<Vec<u32>>) -> Vec<u32> {
        if let Some(v) = &v {
            assert_eq!(v[..], FILES, "a taker got a partial or empty list");
        }
        v.unwrap_or_default()
    }

    /// Asserts that every file ended exactly once in `ended`.
    fn each_once(ended: &[u32]) {
        let mut e = ended.to_vec();
        e.sort_unstable();
        assert_eq!(e[..], FILES, "files must end exactly once");
    }

    /// The scope's close, as `close_by_scope` runs it; sets `closed` once it returned.
    fn close(g: &Grants<u32>, closed: &AtomicBool) -> Vec<u32> {
        let v = taken(g.close());
        assert!(g.is_aborted(), "readers must see the close");
        closed.store(true, Ordering::SeqCst);
        v
    }

    /// A reader: takes a grant (fails with `Aborted` if the close returned before), finds the
    /// files there while it holds it (unless the scope closed), and releases it.
    fn read(g: &Grants<u32>, closed: &AtomicBool, held: &AtomicUsize) -> Vec<u32> {
        let after_close = closed.load(Ordering::SeqCst);
        match g.acquire() {
            Ok(()) => {
                assert!(!after_close, "a grant was taken after the close");
                held.fetch_add(1, Ordering::SeqCst);
                let present = g.with_entries(|e| e.len()) == FILES.len();
                assert!(present || g.is_aborted(), "a grant holds no files");
                held.fetch_sub(1, Ordering::SeqCst);
                release(g, held)
            }
            Err(e) => {
                assert!(
                    matches!(e, SpillError::Aborted | SpillError::Closed { .. }),
                    "{e}"
                );
                Vec::new()
            }
        }
    }

    /// Releases a grant; the files go with the last one only.
    fn release(g: &Grants<u32>, held: &AtomicUsize) -> Vec<u32> {
        let v = taken(g.release());
        if !v.is_empty() {
            assert_eq!(
                held.load(Ordering::SeqCst),
                0,
                "deleted while a grant held them"
            );
        }
        v
    }

    /// A reader takes a grant and releases it, the scope closes the state, and the first grant
    /// is released, in any order. The files are deleted exactly once, by the last release
    /// (only when no grant is held) or by the close; a grant taken after the close returned
    /// fails with `Aborted`.
    #[test]
    fn loom_grants_release_against_close() {
        loom::model(|| {
            let g = Arc::new(Grants::new(FILES.to_vec()));
            // Grants held, as the model counts them (the first one not included).
            let held = Arc::new(AtomicUsize::new(0));
            let closed = Arc::new(AtomicBool::new(false));
            let reader = {
                let (g, held, closed) = (g.clone(), held.clone(), closed.clone());
                thread::spawn(move || read(&g, &closed, &held))
            };
            let closer = {
                let (g, closed) = (g.clone(), closed.clone());
                thread::spawn(move || close(&g, &closed))
            };
            let mut ended = release(&g, &held);
            ended.extend(reader.join().unwrap());
            ended.extend(closer.join().unwrap());
            each_once(&ended);
            assert!(g.acquire().is_err(), "a grant after the close");
        });
    }

    /// A publish that moves nothing (and rolls back) or everything races the scope's close and
    /// a reader (which waits while the publish is under way). Every file ends exactly once:
    /// deleted by the last release, the close or the roll-back, or published; a reader never
    /// holds a grant without the files (unless the scope closed), never gets one after the
    /// close, and is always woken (loom reports a reader left waiting as a deadlock).
    fn publish_races_close(moved: bool) {
        loom::model(move || {
            let g = Arc::new(Grants::new(FILES.to_vec()));
            let held = Arc::new(AtomicUsize::new(0));
            let closed = Arc::new(AtomicBool::new(false));
            let reader = {
                let (g, held, closed) = (g.clone(), held.clone(), closed.clone());
                thread::spawn(move || read(&g, &closed, &held))
            };
            let closer = {
                let (g, closed) = (g.clone(), closed.clone());
                thread::spawn(move || close(&g, &closed))
            };
            // The publisher holds the first grant.
            let mut ended = Vec::new();
            match g.begin_publish() {
                Ok(entries) if moved => {
                    assert_eq!(entries[..], FILES);
                    ended.extend(entries); // published: the caller's now
                    g.end_publish();
                }
                Ok(entries) => {
                    assert_eq!(entries[..], FILES);
                    ended.extend(taken(g.roll_back_publish(entries)));
                }
                Err(e) => assert!(
                    matches!(e, SpillError::Aborted | SpillError::InvalidConfig(_)),
                    "{e}"
                ),
            }
            // The publish ended: once the close returned, the state holds no files.
            if closed.load(Ordering::SeqCst) {
                assert!(
                    g.with_entries(|e| e.is_empty()),
                    "the close left the files held"
                );
            }
            ended.extend(release(&g, &held));
            ended.extend(reader.join().unwrap());
            ended.extend(closer.join().unwrap());
            each_once(&ended);
        });
    }

    #[test]
    fn loom_grants_publish_rolled_back_against_close() {
        publish_races_close(false);
    }

    #[test]
    fn loom_grants_publish_against_close() {
        publish_races_close(true);
    }
}
