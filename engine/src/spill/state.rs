//! Stage 2: the finished segments of a spill, shared by refcounted grants.
//!
//! A [`SpilledState`] is itself a grant, and so is every [`SpillReader`] made from it; clones
//! are grants too. The files are deleted when the last grant is released, or when the task
//! scope closes (then every reader sees `Aborted`). Either way the deletes are queued to an I/O
//! thread, never run on the caller's. The protocol is in [`crate::spill::grant`].

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::cleanup::delete_segments;
use crate::error::{Result, SpillError, errno};
use crate::fault::{FaultPlan, Injected, fault_point};
use crate::format::segment::SegmentFileName;
use crate::metrics::Counters;
use crate::shared::EngineShared;
use crate::spill::grant::{Grant, StateShared};
use crate::spill::reader::SpillReader;
use crate::spill::task::{Member, TaskShared};
use crate::store::entry::SegmentEntry;
use crate::sys::fs;

/// The spilled output of a finished writer: its segments, handed from stage to stage. A grant
/// on the files (see the module docs). `Clone` takes another grant (a clone of a state the
/// scope closed is closed too).
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
#[derive(Debug, Clone)]
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
        counts: (u64, u64),
        register: impl FnOnce(Arc<dyn Member>) -> Result<u64>,
    ) -> Result<Self> {
        let inner = StateShared::make(task, lane, entries, counts);
        // Until the id is stored, a release would unregister id 0, which is never used; the
        // caller holds the only grant here, so no release can run before the store below.
        let id = register(inner.clone())?;
        inner.set_scope_id(id);
        Ok(SpilledState {
            grant: Grant(inner),
        })
    }

    pub(crate) fn inner(&self) -> &Arc<StateShared> {
        &self.grant.0
    }

    /// A reader over the records, in write order. Takes a grant; fails with `Aborted` if the
    /// scope already closed the state.
    pub fn reader(&self) -> Result<SpillReader> {
        self.inner()
            .files
            .acquire()
            .map_err(|e| self.inner().refused_reader(e))?;
        Ok(SpillReader::new(Grant(self.inner().clone())))
    }

    /// Turns this grant into a reader (fails with `Aborted` after a cancel, `ScopeClosed`
    /// after its scope's normal close).
    pub fn into_reader(self) -> Result<SpillReader> {
        if self.inner().is_aborted() {
            return Err(self.inner().refused_reader(SpillError::Aborted));
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

    /// Moves the segment files into `dest`, named `<prefix>-NNNNNN.bin`, with the engine's
    /// private mode (0600): [`SpilledState::publish_with`] with the default
    /// [`PublishOptions`].
    pub fn publish(&self, dest: impl AsRef<Path>, prefix: &str) -> Result<Vec<PathBuf>> {
        self.publish_with(dest, prefix, PublishOptions::default())
    }

    /// Moves the segment files into `dest` (a directory the caller owns, on the same
    /// filesystem as the spill root), named `<prefix>-NNNNNN.bin` in write order, each trimmed
    /// to its written length (header and records, no padding) and with `opts.mode`, and
    /// returns their new paths. [`crate::SegmentReader`] reads them without an engine. The
    /// engine forgets them: their tickets are released and nothing of the engine will delete
    /// them; the state then holds no files (`reader` fails with `Closed`).
    ///
    /// All or nothing: every destination name is checked first, and each rename refuses to
    /// replace a name (`renameat2(RENAME_NOREPLACE)`), so a name taken meanwhile is refused
    /// too; if a rename fails, the files already moved are moved back before this returns.
    /// On any error the state is unchanged and still readable (unless its scope closed
    /// meanwhile: then its files went the way of an abort), and the call can be repeated with
    /// another destination or prefix. Errors:
    /// - [`SpillError::PublishFailed`]: a name is taken (`EEXIST`), or a rename or the
    ///   preparation of a file failed; it carries the paths involved.
    /// - [`SpillError::PublishCrossesFilesystems`]: `dest` is on another filesystem (`EXDEV`).
    /// - [`SpillError::PublishEncrypted`]: the engine encrypts (`EngineConfig::encryption`);
    ///   its files could not be read outside it. Nothing is moved.
    /// - [`SpillError::StateShared`]: a reader or a clone of the state is alive: publish needs
    ///   the only grant (drop them and call again).
    /// - [`SpillError::InvalidName`] (a bad prefix, or `dest` is the engine's own directory),
    ///   [`SpillError::InvalidConfig`] (a mode with bits outside 0o777), [`SpillError::Io`]
    ///   (`dest` cannot be opened as a directory): nothing was touched.
    /// - [`SpillError::Aborted`] after a cancel; [`SpillError::Closed`] once published.
    ///
    /// ```no_run
    /// # fn f(state: spillring::SpilledState) -> spillring::Result<()> {
    /// use spillring::{PublishOptions, SegmentReader, SpillError};
    /// let dir = std::path::Path::new("/mnt/spill/results");
    /// let paths = match state.publish_with(dir, "part-7", PublishOptions::default().mode(0o640)) {
    ///     Ok(paths) => paths,
    ///     // A name is taken: nothing moved, the state still reads; try another prefix.
    ///     Err(SpillError::PublishFailed { .. }) => state.publish(dir, "part-7-retry")?,
    ///     Err(e) => return Err(e),
    /// };
    /// for p in &paths {
    ///     for rec in SegmentReader::open(p)? {
    ///         let _rec = rec?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn publish_with(
        &self,
        dest: impl AsRef<Path>,
        prefix: &str,
        opts: PublishOptions,
    ) -> Result<Vec<PathBuf>> {
        let dest = dest.as_ref();
        let inner = self.inner();
        if inner.core().key.is_some() {
            return Err(SpillError::PublishEncrypted);
        }
        check_prefix(prefix)?;
        if opts.mode & !0o777 != 0 {
            return Err(SpillError::InvalidConfig {
                field: "PublishOptions::mode",
                need: "permission bits only (at most 0o777)".into(),
                got: format!("{:#o}", opts.mode),
            });
        }
        let dest_fd = fs::open_dir(dest).map_err(|e| SpillError::io("open", dest, e))?;
        let targets: Vec<Target> = (0..inner.segments)
            .map(|i| Target::new(dest, prefix, i))
            .collect::<Result<_>>()?;
        let mut entries = inner.files.begin_publish()?;
        // Files may leave our directories now: no engine path may use an fd or a map kept
        // with one after (a reader would read, and a pooled reuse write, a file the caller was
        // given). From here the state's files are opened by name (and mapped anew).
        for e in &mut entries {
            drop(e.file.take());
            drop(e.map.take());
        }
        let core = inner.core().clone();
        let task_plan = inner.task().and_then(|t| t.fault_plan());
        fault_point!(StatePublish, core.fault, task: task_plan.as_ref());
        let plan = Plan {
            dest,
            dest_fd: dest_fd.as_fd(),
            targets: &targets,
            task_plan: task_plan.as_ref(),
            core: &core,
        };
        if let Err(err) = plan.prepare(&entries, opts.mode) {
            plan.restore_mode(&entries, opts.mode);
            self.roll_back(entries);
            return Err(err);
        }
        let moved = plan.rename_all(&entries);
        if let Err((k, err)) = moved {
            let stranded = plan.move_back(&entries, k);
            for &j in &stranded {
                // A segment left at the destination never goes back to the segment pool: the
                // state deletes its (absent) name like a mapped segment's.
                if let Some(c) = inner.maps().get(j) {
                    c.fetch_add(1, Ordering::AcqRel);
                }
            }
            plan.restore_mode(&entries, opts.mode);
            let stranded: Vec<PathBuf> =
                stranded.iter().map(|&j| targets[j].path.clone()).collect();
            if !stranded.is_empty() {
                tracing::error!(?stranded, "publish: files moved could not be moved back");
            }
            let err = match err.raw_os_error() {
                Some(errno::EXDEV) if stranded.is_empty() => {
                    SpillError::PublishCrossesFilesystems {
                        dest: dest.to_path_buf(),
                        root: entries[k].dir.path.clone(),
                    }
                }
                _ => SpillError::PublishFailed {
                    path: targets[k].path.clone(),
                    targets: paths_of(&targets),
                    stranded,
                    source: err,
                },
            };
            self.roll_back(entries);
            return Err(err);
        }
        let out = forget_published(&core, &targets, entries);
        inner.files.end_publish();
        inner.span.record("outcome", "published");
        inner.unregister();
        Ok(out)
    }

    /// Ends a publish that published nothing: the state holds its files again, unless its
    /// scope closed meanwhile (then they are deleted, as the close would have).
    fn roll_back(&self, entries: Vec<SegmentEntry>) {
        let inner = self.inner();
        if let Some(entries) = inner.files.roll_back_publish(entries) {
            // The scope closed during the publish: the files go as its close would have.
            inner.span.record("outcome", "aborted");
            delete_segments(inner.core(), inner.lane, entries);
        }
    }
}

/// How [`SpilledState::publish_with`] publishes. `PublishOptions::default()` is what
/// [`SpilledState::publish`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishOptions {
    /// Permission bits of the published files, at most 0o777, set with `fchmod` before the
    /// file appears in the destination (so the umask does not apply). Default 0o600: the
    /// engine's private mode.
    pub mode: u32,
}

impl Default for PublishOptions {
    fn default() -> Self {
        PublishOptions { mode: 0o600 }
    }
}

impl PublishOptions {
    /// The published files' permission bits (at most 0o777; publish refuses others with
    /// `InvalidConfig`).
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = mode;
        self
    }
}

/// The engine's own file mode, restored on files a failed publish gave another one.
const PRIVATE_MODE: u32 = 0o600;

/// Longest file name most Linux filesystems take (`NAME_MAX`).
const NAME_MAX: usize = 255;

fn check_prefix(prefix: &str) -> Result<()> {
    let reason = if prefix.is_empty() || prefix.contains('/') || prefix.contains('\0') {
        "must be a plain, non-empty file name prefix"
    } else if prefix.len() + "-000000.bin".len() > NAME_MAX {
        "is too long: the file names would pass 255 bytes"
    } else {
        return Ok(());
    };
    Err(SpillError::InvalidName {
        what: "publish prefix",
        name: prefix.to_owned(),
        reason,
    })
}

/// One destination name.
struct Target {
    name: CString,
    path: PathBuf,
}

impl Target {
    fn new(dest: &Path, prefix: &str, i: usize) -> Result<Self> {
        let name = format!("{prefix}-{i:06}.bin");
        let path = dest.join(&name);
        let name = CString::new(name).map_err(|_| SpillError::InvalidName {
            what: "publish prefix",
            name: prefix.to_owned(),
            reason: "contains a NUL",
        })?;
        Ok(Target { name, path })
    }
}

fn paths_of(targets: &[Target]) -> Vec<PathBuf> {
    targets.iter().map(|t| t.path.clone()).collect()
}

/// What one publish works with.
struct Plan<'a> {
    dest: &'a Path,
    dest_fd: BorrowedFd<'a>,
    targets: &'a [Target],
    task_plan: Option<&'a Arc<FaultPlan>>,
    core: &'a Arc<EngineShared>,
}

impl Plan<'_> {
    /// Everything that can be checked before a file moves: the destination is on each
    /// segment's filesystem and is not the engine's own directory, every destination name is
    /// free, and each file is trimmed to its written length and given its mode.
    fn prepare(&self, entries: &[SegmentEntry], mode: u32) -> Result<()> {
        let (dev, ino) =
            fs::dev_ino(self.dest_fd).map_err(|e| SpillError::io("stat", self.dest, e))?;
        for e in entries {
            let (d_dev, d_ino) = fs::dev_ino(e.dir.as_fd())
                .map_err(|err| SpillError::io("stat", &e.dir.path, err))?;
            if d_dev != dev {
                return Err(SpillError::PublishCrossesFilesystems {
                    dest: self.dest.to_path_buf(),
                    root: e.dir.path.clone(),
                });
            }
            if d_ino == ino {
                return Err(SpillError::InvalidName {
                    what: "publish destination",
                    name: self.dest.display().to_string(),
                    reason: "is the engine's own directory, whose files the engine deletes",
                });
            }
        }
        for t in self.targets {
            let taken = fs::exists_at(self.dest_fd, &t.name);
            match taken {
                Ok(false) => {}
                Ok(true) => {
                    return Err(self.failed(t, io::Error::from_raw_os_error(errno::EEXIST)));
                }
                Err(err) => return Err(self.failed(t, err)),
            }
        }
        for (e, t) in entries.iter().zip(self.targets) {
            // The caller gets exactly header and records: no allocated tail or direct-mode
            // padding past the written length.
            prepare_file(e, e.len, mode).map_err(|err| self.failed(t, err))?;
        }
        Ok(())
    }

    fn failed(&self, t: &Target, source: io::Error) -> SpillError {
        SpillError::PublishFailed {
            path: t.path.clone(),
            targets: paths_of(self.targets),
            stranded: Vec::new(),
            source,
        }
    }

    /// One rename, through the `PublishRename` fault point.
    fn rename(
        &self,
        from_dir: BorrowedFd<'_>,
        from: &CStr,
        to_dir: BorrowedFd<'_>,
        to: &CStr,
    ) -> io::Result<()> {
        match fault_point!(PublishRename, self.core.fault, task: self.task_plan) {
            Injected::Fail(e) | Injected::FailAfter(e) => Err(io::Error::from_raw_os_error(e)),
            _ => fs::renameat_noreplace(from_dir, from, to_dir, to),
        }
    }

    /// Renames every file into the destination, never replacing a name; stops at the first
    /// failure and returns its index.
    fn rename_all(&self, entries: &[SegmentEntry]) -> std::result::Result<(), (usize, io::Error)> {
        for (i, (e, t)) in entries.iter().zip(self.targets).enumerate() {
            let from = SegmentFileName::new(e.seg);
            self.rename(e.dir.as_fd(), from.as_cstr(), self.dest_fd, &t.name)
                .map_err(|err| (i, err))?;
        }
        Ok(())
    }

    /// Moves files `0..k` back into their directories, newest first; returns the indices of
    /// those that could not be moved back (they stay at the destination).
    fn move_back(&self, entries: &[SegmentEntry], k: usize) -> Vec<usize> {
        let mut stranded = Vec::new();
        for j in (0..k).rev() {
            let (e, t) = (&entries[j], &self.targets[j]);
            let from = SegmentFileName::new(e.seg);
            if let Err(err) = self.rename(self.dest_fd, &t.name, e.dir.as_fd(), from.as_cstr()) {
                tracing::error!(path = %t.path.display(), error = %err, "publish: cannot move a file back");
                stranded.push(j);
            }
        }
        stranded.reverse();
        stranded
    }

    /// Gives the engine's private mode back to the files a failed publish changed (those left
    /// in the destination are not found in their directory and keep theirs). Best effort: the
    /// process directory is private (0700) anyway.
    fn restore_mode(&self, entries: &[SegmentEntry], mode: u32) {
        if mode == PRIVATE_MODE {
            return;
        }
        for e in entries {
            let name = SegmentFileName::new(e.seg);
            if let Ok(fd) = fs::open_file_at(e.dir.as_fd(), name.as_cstr(), true) {
                let _ = fs::fchmod(fd.as_fd(), PRIVATE_MODE);
            }
        }
    }
}

/// Truncates a segment to its written length if it is longer, and sets its mode.
fn prepare_file(e: &SegmentEntry, len: u64, mode: u32) -> io::Result<()> {
    let name = SegmentFileName::new(e.seg);
    let fd = fs::open_file_at(e.dir.as_fd(), name.as_cstr(), true)?;
    let f = std::fs::File::from(fd);
    if f.metadata()?.len() != len {
        f.set_len(len)?;
    }
    if mode != PRIVATE_MODE {
        fs::fchmod(f.as_fd(), mode)?;
    }
    Ok(())
}

/// Releases the tickets of files moved to the caller; returns their new paths.
fn forget_published(
    core: &Arc<EngineShared>,
    targets: &[Target],
    entries: Vec<SegmentEntry>,
) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(entries.len());
    for (e, t) in entries.into_iter().zip(targets) {
        Counters::add(&core.counters.files_published, 1);
        out.push(t.path.clone());
        drop(e.release());
    }
    out
}
