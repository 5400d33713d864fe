//! Stage 2: the finished segments of a spill, shared by refcounted grants.
//!
//! A [`SpilledState`] is itself a grant, and so is every [`SpillReader`] made from it; clones
//! are grants too. The files are deleted when the last grant is released, or when the task
//! scope closes (then every reader sees `Aborted`). Either way the deletes are queued to an I/O
//! thread, never run on the caller's. `close` is idempotent. The protocol is in
//! [`crate::spill::grant`].

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cleanup::delete_segments;
use crate::core::Core;
use crate::error::{Result, SpillError};
use crate::format::segment::SegmentFileName;
use crate::metrics::Counters;
use crate::spill::grant::{Grant, StateInner};
use crate::spill::reader::SpillReader;
use crate::spill::task::{Member, TaskShared};
use crate::store::dir::{self, TaskDir};
use crate::store::entry::SegmentEntry;

/// The spilled output of a finished writer: its segments, handed from stage to stage. A grant
/// on the files (see the module docs). `Clone` takes another grant.
///
/// ```
/// use spillring::{Bytes, Engine, EngineConfig};
/// # fn main() -> spillring::Result<()> {
/// # let root = std::env::temp_dir().join(format!("spillring-doc-state-{}", std::process::id()));
/// let engine = Engine::open(EngineConfig::new(&root))?;
/// let producer = engine.task("map-3")?;
/// let mut w = producer.writer()?;
/// w.write_all((0..100u32).map(|i| Bytes::from(i.to_le_bytes().to_vec())))?;
/// let state = w.finish()?;
/// // Hand-off: the consuming task adopts the state; then the producer may close.
/// let consumer = engine.task("reduce-0")?;
/// consumer.adopt(&state)?;
/// producer.close();
/// assert!(!state.is_aborted());
/// let sum: u64 = state
///     .reader()?
///     .map(|r| r.map(|b| u64::from(u32::from_le_bytes(b[..4].try_into().unwrap()))))
///     .sum::<spillring::Result<u64>>()?;
/// assert_eq!(sum, (0..100).sum());
/// drop(state); // the last grant: the files go back to the pool or are deleted
/// # drop((consumer, engine));
/// # let _ = std::fs::remove_dir(&root);
/// # Ok(()) }
/// ```
///
/// Lifetime: a state is registered with the scope of the task that made it, which is its
/// backstop: when that scope closes (`close`, `cancel`, or its last `TaskSpill` dropped), the
/// state is aborted and its files deleted, even while grants are alive. To hand a state to a
/// stage that outlives the producing task, the consuming task calls
/// [`crate::TaskSpill::adopt`] before the producer's scope closes.
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
        (records, payload): (u64, u64),
        register: impl FnOnce(Arc<dyn Member>) -> Result<u64>,
    ) -> Result<Self> {
        let mut inner = StateInner::new(task, lane, entries);
        inner.records = records;
        inner.payload = payload;
        let inner = Arc::new(inner);
        // Until the id is stored, a release would unregister id 0, which is never used; the
        // caller holds the only grant here, so no release can run before the store below.
        let id = register(inner.clone())?;
        inner.set_scope_id(id);
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

    /// Moves the state's registration to `to` (see [`crate::TaskSpill::adopt`]).
    pub(crate) fn move_to(&self, to: Arc<TaskShared>) -> Result<()> {
        self.inner().move_to(to)
    }

    /// Number of segment files.
    pub fn segments(&self) -> usize {
        self.inner().segments
    }

    /// Bytes in the segment files (headers and framing included, padding excluded).
    pub fn bytes(&self) -> u64 {
        self.inner().bytes
    }

    /// Records in the state (what its writer accepted).
    pub fn records(&self) -> u64 {
        self.inner().records
    }

    /// Payload bytes of those records: what the writer's [`crate::SpillWriter::bytes_written`]
    /// said at `finish` (framing and segment headers excluded; [`SpilledState::bytes`] counts
    /// the files).
    pub fn bytes_written(&self) -> u64 {
        self.inner().payload
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
            return Err(SpillError::InvalidName {
                what: "publish prefix",
                name: prefix.to_owned(),
                reason: "must be a plain, non-empty file name prefix",
            });
        }
        let dest_fd = dir::open_dir(dest).map_err(|e| SpillError::io("open", dest, e))?;
        let entries = inner.files.begin_publish()?;
        let core = inner.core().clone();
        let task_plan = inner.task().fault_plan();
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
                .map_err(|_| SpillError::InvalidName {
                    what: "publish prefix",
                    name: prefix.to_owned(),
                    reason: "contains a NUL",
                })
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
            inner.unregister();
            return Err(err);
        }
        let out = forget_published(&core, dest, prefix, entries);
        inner.files.end_publish();
        inner.unregister();
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
        drop(e.release());
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
