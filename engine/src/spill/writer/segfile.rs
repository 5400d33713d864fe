//! A segment's file: made for a rotation (`Ctx::open`: a root and its process directory, a
//! ticket, the file created or a pooled one reused, its first allocation, the abort check that
//! records it), deleted at once when nobody else knows of it, and its disk allocation (direct
//! mode, `preallocate`): a writer's first segment grows in steps as its writes reach them,
//! later ones are allocated whole at creation; `finish` gives back what was allocated past
//! the written length. When to rotate is `rotate.rs`'s.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::hook::WriterShared;
use super::{Ctx, SpillWriter};
use crate::cleanup::{Unlinked, delete_segments};
use crate::config::DIRECT_ALIGN;
use crate::error::{Result, SpillError};
use crate::fault::{Injected, fault_point};
use crate::format::segment::{HEADER_LEN, SegmentFileName};
use crate::io::{CachedFile, FdPermit, FileHandle, NameBuf, SharedMap};
use crate::metrics::Counters;
use crate::shared::EngineShared;
use crate::store::entry::SegmentEntry;
use crate::store::ledger::Ticket;
use crate::store::proc::ProcDir;
use crate::store::roots::RootUse;
use crate::sys::fs;

impl SpillWriter {
    /// What a new segment allocates at its creation: a writer's first segment starts small
    /// ([`first_step`]) and grows in steps, so a small spill holds disk in proportion to what
    /// it wrote; a writer that already filled a segment is a long spill, and its next segments
    /// are allocated whole, once, as before the steps (an extending `fallocate` takes the inode
    /// lock that the segment's O_DIRECT writes in flight share).
    pub(super) fn first_allocation(&self, need: u64, reserve: u64) -> u64 {
        if self.segments() > 0 {
            reserve
        } else {
            first_step(need, reserve)
        }
    }
}

/// The first allocation step of a segment: room for its header and first record, at least
/// [`ALLOC_STEP_MIN`], whole blocks, at most the segment's reservation.
pub(super) fn first_step(need: u64, reserve: u64) -> u64 {
    (HEADER_LEN as u64 + need)
        .max(ALLOC_STEP_MIN)
        .next_multiple_of(DIRECT_ALIGN as u64)
        .min(reserve)
}

/// The smallest allocation step (direct mode, `preallocate`).
pub(super) const ALLOC_STEP_MIN: u64 = 1 << 20;

/// The next allocation of a segment holding `allocated` bytes whose writes reach `end`: double
/// what it has, at least to `end`, at most its reservation (or `end` past that).
pub(super) fn next_step(allocated: u64, end: u64, reserve: u64) -> u64 {
    (allocated * 2)
        .max(ALLOC_STEP_MIN)
        .min(reserve)
        .max(end.next_multiple_of(DIRECT_ALIGN as u64))
}

/// `fallocate`s the first `len` bytes of a segment: growing the file (direct mode: O_DIRECT
/// writes inside the file size run in parallel under a shared inode lock, where extending
/// writes serialise) or keeping its size (`preallocate`: a full disk fails here rather than
/// mid-record). The bytes allocated: `len`, or 0 if the mode allocates nothing or the
/// filesystem cannot.
pub(super) fn allocate_step(
    fd: BorrowedFd<'_>,
    direct: bool,
    preallocate: bool,
    len: u64,
) -> io::Result<u64> {
    let done = if direct {
        fs::fallocate(fd, false, len)?
    } else if preallocate {
        fs::fallocate(fd, true, len)?
    } else {
        false
    };
    Ok(if done { len } else { 0 })
}

/// What a segment of `len` written bytes keeps on disk after its trim: whole 4 KiB blocks
/// (direct mode pads its last write to them).
pub(super) fn trimmed_len(len: u64) -> u64 {
    len.next_multiple_of(DIRECT_ALIGN as u64)
}

/// Gives back the unused tails of segments allocated up front (direct mode, `preallocate`),
/// then shrinks each ticket to the written length. Runs after every write of the writer completed, so it never waits for
/// one, and outside the file-list lock, so a cancel never waits for it. A segment whose
/// trim fails keeps its whole ticket: the quota still counts what is allocated.
pub(super) fn trim_allocations(core: &EngineShared, shared: &WriterShared, direct: bool) {
    if !needs_trim(shared) {
        return;
    }
    for i in 0.. {
        let target = {
            let f = shared.files.lock();
            let Some(e) = f.entries.get(i) else { break };
            (e.allocated > 0).then(|| (e.dir.clone(), e.seg, e.len, e.allocated, e.kept_fd()))
        };
        let Some((dir, seg, len, allocated, kept)) = target else {
            continue;
        };
        // Direct mode padded the last write to whole blocks; a buffered file is exactly
        // `len` long. Truncating to the size it has frees the blocks allocated past it
        // (ext4 and tmpfs truncate preallocated blocks even when the size does not change;
        // punching a hole past the end is a no-op on ext4).
        let keep = if direct { trimmed_len(len) } else { len };
        let name = SegmentFileName::new(seg);
        let r = match kept {
            // The writer's fd, kept with the file: no open.
            Some(h) => fs::ftruncate(h.as_fd(), keep.min(allocated)),
            None => core
                .io
                .fds()
                .open_with(|| fs::open_file_at(dir.as_fd(), name.as_cstr(), true))
                .and_then(|fd| fs::ftruncate(fd.as_fd(), keep.min(allocated))),
        };
        match r {
            Ok(()) => {
                let mut f = shared.files.lock();
                if let Some(e) = f.entries.get_mut(i) {
                    e.allocated = 0;
                    e.shrink_to(len);
                }
            }
            // Only disk space is at stake: the reader uses the written length.
            Err(e) => {
                tracing::debug!(error = %e, "trimming a segment failed; keeping its ticket")
            }
        }
    }
}

/// True if a segment of the writer still holds an allocation past its written length.
pub(super) fn needs_trim(shared: &WriterShared) -> bool {
    shared.files.lock().entries.iter().any(|e| e.allocated > 0)
}

/// A failed attempt to create a segment on one root.
struct Failed {
    err: SpillError,
    /// The attempt marked its root failed: the next healthy root gets a try.
    next_root: bool,
}

impl From<SpillError> for Failed {
    fn from(err: SpillError) -> Self {
        Failed {
            err,
            next_root: false,
        }
    }
}

/// A segment number reserved in a task directory (whose count of files coming includes it),
/// with its ticket: what a file creation needs.
struct Reserved {
    root: usize,
    dir: Arc<ProcDir>,
    seg: u32,
    ticket: Ticket,
}

/// A segment's fd as a rotation got it.
pub(super) enum SegFile {
    /// Opened by this rotation (created, or a pooled file reopened by name), counted under
    /// its permit.
    Opened(OwnedFd, FdPermit),
    /// The fd a pooled file kept from its last use (already counted), a handle that keeps the
    /// fd bound from closing it until the writer starts, and its last reader's map (same inode).
    Kept(CachedFile, Arc<FileHandle>, Option<SharedMap>),
}

impl SegFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            SegFile::Opened(fd, _) => fd.as_fd(),
            SegFile::Kept(_, h, _) => h.as_fd(),
        }
    }
}

/// A segment file created and allocated, not yet recorded in the file list.
struct Created {
    r: Reserved,
    fd: SegFile,
    /// Bytes allocated to the file at creation (direct mode, `preallocate`), 0 if none.
    allocated: u64,
    /// This use of the file: 0 for a new file.
    generation: u32,
}

/// A segment created (or reused), allocated and recorded in the file list: ready to write.
pub(super) struct Opened {
    pub(super) fd: SegFile,
    pub(super) seg: u32,
    pub(super) entry_index: usize,
    /// Bytes allocated to the file (direct mode, `preallocate`), 0 if none.
    pub(super) allocated: u64,
    /// Bytes of quota its ticket holds.
    pub(super) reserve: u64,
    pub(super) generation: u32,
    /// How full its root is of spills (`Store::root_fill`), for `Auto`'s space pressure.
    pub(super) root_fill: f64,
    /// Counts the segment as being written on its root, for the placement of the next ones.
    pub(super) root_use: RootUse,
}

impl Ctx {
    /// Creates the next segment: ticket first, then the file, then the abort check under the
    /// file-list lock (invariant 2 in ARCHITECTURE.md). Tries the next healthy root when a
    /// root's create fails with a device error.
    pub(super) fn open(&self, reserve: u64, step: u64) -> Result<Opened> {
        let started = std::time::Instant::now();
        let opened = self.open_timed(reserve, step);
        self.core.counters.latency.rotate.record_since(started);
        opened
    }

    fn open_timed(&self, reserve: u64, step: u64) -> Result<Opened> {
        let attempts = self.core.cfg.roots.len();
        let mut attempt = 0;
        let made = loop {
            attempt += 1;
            match self.create_segment(reserve, step) {
                Ok(made) => break made,
                Err(f) if f.next_root && attempt < attempts => continue,
                Err(f) => return Err(f.err),
            }
        };
        let (seg, allocated, generation) = (made.r.seg, made.allocated, made.generation);
        // Off the caller's poll (an async rotation runs here on the offload pool): a statvfs.
        let root_fill = self.core.store.root_fill(made.r.root);
        let root_use = self.core.store.roots.writing_on(made.r.root);
        let (entry_index, fd) = self.record_segment(made)?;
        Ok(Opened {
            fd,
            seg,
            entry_index,
            allocated,
            reserve,
            generation,
            root_fill,
            root_use,
        })
    }

    /// One attempt, on the root `EngineShared::pick_root` gives: the directory, the ticket and segment
    /// number, the file, its allocation.
    fn create_segment(&self, reserve: u64, step: u64) -> std::result::Result<Created, Failed> {
        let (root, dir) = self.segment_dir()?;
        if let Some(made) = self.reuse_segment(root, reserve, step)? {
            return Ok(made);
        }
        // The new file's fd counts in the engine's bound: the permit comes first (waits at the
        // bound; an async rotation waits on the offload thread).
        let permit = self.core.io.fds().permit();
        let r = self.reserve_segment(root, dir, reserve)?;
        let (r, fd) = self.create_file(r)?;
        self.allocate(r, SegFile::Opened(fd, permit), step)
    }

    /// A pooled file under `root`, reopened for this use with the next generation and its
    /// ticket grown to `reserve`; `None` (a miss) when the pool has none or the reuse fails,
    /// in which case the pooled file is deleted and its ticket released once.
    fn reuse_segment(
        &self,
        root: usize,
        reserve: u64,
        step: u64,
    ) -> std::result::Result<Option<Created>, Failed> {
        let core = &self.core;
        if !core.store.pool.enabled() {
            return Ok(None);
        }
        if self.shared.files.is_aborted() {
            return Err(SpillError::Aborted.into());
        }
        let Some(mut e) = core.store.pool.take(root) else {
            Counters::add(&core.counters.pool_misses, 1);
            return Ok(None);
        };
        fault_point!(WriterReserve, core.fault, task: self.task.fault_plan());
        // What the file holds on disk from its last use: trimmed at `finish` if longer than
        // this use writes (the quota bounds blocks on disk).
        let on_disk = e.len.max(e.allocated);
        let generation = e.generation.wrapping_add(1);
        let name = SegmentFileName::new(e.seg);
        let reopened = e.grow_to(reserve).and_then(|()| {
            // The fd the file kept from its last use, if the fd bound has not closed it: no
            // open and no close. A file unlinked behind the engine's back (its fd still open)
            // is of no use: one `fstat` tells, and the reopen by name below then fails, which
            // deletes the entry once (its name found absent). Only a kept fd carries the map on.
            if let Some(h) = e.kept_fd()
                && fs::link_count(h.as_fd()).is_ok_and(|n| n > 0)
                && let Some(file) = e.file.take()
            {
                return Ok(SegFile::Kept(file, h, e.map.take()));
            }
            drop(e.file.take());
            let fds = core.io.fds();
            // Counted in the engine's bound: the permit comes first (waits at the bound).
            let permit = fds.permit();
            fds.open_with(|| fs::open_segment_at(e.dir.as_fd(), name.as_cstr(), false, self.direct))
                .map(|fd| SegFile::Opened(fd, permit))
                .map_err(|err| SpillError::io("reopen", e.path(), err))
        });
        let fd = match reopened {
            Ok(fd) => fd,
            Err(err) => {
                tracing::debug!(error = %err, "reusing a pooled segment failed; deleting it");
                Counters::add(&core.counters.pool_trims, 1);
                delete_segments(core, self.lane, vec![e]);
                return Ok(None);
            }
        };
        // The file keeps the blocks of its last use: only a first step larger than those is
        // allocated.
        let prealloc = if self.allocates() && on_disk >= step {
            Ok(on_disk)
        } else {
            self.preallocate(fd.as_fd(), step)
        };
        let allocated = match prealloc {
            Ok(a) => a.max(on_disk),
            Err(err) => {
                drop(fd);
                Counters::add(&core.counters.pool_trims, 1);
                let next_root = core.root_failed(root, &err);
                let path = e.path();
                delete_segments(core, self.lane, vec![e]);
                return Err(Failed {
                    err: SpillError::io("preallocate", path, err),
                    next_root,
                });
            }
        };
        let Some((dir, seg, ticket)) = e.into_reuse() else {
            return Ok(None);
        };
        Counters::add(&core.counters.pool_hits, 1);
        Ok(Some(Created {
            r: Reserved {
                root,
                dir,
                seg,
                ticket,
            },
            fd,
            allocated,
            generation,
        }))
    }

    /// A ticket for `reserve` bytes. A full ledger or quota first trims the segment pool (its
    /// files hold tickets): pooled files are deleted here, on the caller's thread, until the
    /// reservation fits or the pool is empty.
    fn reserve_ticket(&self, root: usize, reserve: u64) -> Result<Ticket> {
        let core = &self.core;
        loop {
            match core.store.ledger.reserve_on(root, reserve) {
                Ok(t) => return Ok(t),
                Err(err @ (SpillError::LedgerFull { .. } | SpillError::QuotaExceeded { .. })) => {
                    let Some(e) = core.store.pool.take_any() else {
                        return Err(err);
                    };
                    Counters::add(&core.counters.pool_trims, 1);
                    let name = NameBuf::segment(e.seg);
                    let res = fs::unlinkat(e.dir.as_fd(), name.as_cstr(), false);
                    if Unlinked::of(&res).count(&core.counters) {
                        drop(e.release());
                    } else {
                        tracing::warn!(path = %e.path().display(), error = ?res.err(),
                            "deleting a pooled segment failed; handing it to the cleanup worker");
                        e.retain(&core.store.cleanup);
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Picks a root and this task's directory in it; a device error marks the root failed.
    fn segment_dir(&self) -> std::result::Result<(usize, Arc<ProcDir>), Failed> {
        let root = self.core.store.roots.pick();
        match self.task.dir(root) {
            Ok(d) => Ok((root, d)),
            Err(e) => {
                let skipped = e
                    .os_error()
                    .is_some_and(|os| self.core.root_failed(root, os));
                Err(Failed {
                    err: e,
                    next_root: skipped,
                })
            }
        }
    }

    /// The early abort check, then a ticket for `reserve` bytes, the next segment number, and
    /// the directory's count of files coming (refused once the scope closed the directory).
    fn reserve_segment(&self, root: usize, dir: Arc<ProcDir>, reserve: u64) -> Result<Reserved> {
        if self.shared.files.is_aborted() {
            return Err(SpillError::Aborted);
        }
        fault_point!(WriterReserve, self.core.fault, task: self.task.fault_plan());
        let ticket = self.reserve_ticket(root, reserve)?;
        let Some(seg) = dir.next_segment() else {
            return Err(SpillError::SegmentsExhausted {
                path: dir.path.clone(),
            });
        };
        Ok(Reserved {
            root,
            dir,
            seg,
            ticket,
        })
    }

    /// Creates the segment file (fault point `writer::create`). A failed create gives back the
    /// ticket and the directory's file count, and marks the root failed on a device error.
    fn create_file(&self, r: Reserved) -> std::result::Result<(Reserved, OwnedFd), Failed> {
        let name = SegmentFileName::new(r.seg);
        let injected = fault_point!(WriterCreate, self.core.fault, task: self.task.fault_plan());
        let created = match injected {
            Injected::Fail(e) => Err(io::Error::from_raw_os_error(e)),
            Injected::FailAfter(e) => return Err(self.create_failed_after(r, &name, e).into()),
            _ => self.core.io.fds().open_with(|| {
                fs::open_segment_at(r.dir.as_fd(), name.as_cstr(), true, self.direct)
            }),
        };
        match created {
            Ok(fd) => {
                Counters::add(&self.core.counters.segments_created, 1);
                Ok((r, fd))
            }
            Err(e) => {
                let Reserved {
                    root, dir, ticket, ..
                } = r;
                drop(ticket);
                let skipped = self.core.root_failed(root, &e);
                Err(Failed {
                    err: SpillError::io("create", dir.path.join(name.as_str()), e),
                    next_root: skipped,
                })
            }
        }
    }

    /// The injected `FailAfter` of `writer::create`.
    fn create_failed_after(&self, r: Reserved, name: &SegmentFileName, e: i32) -> SpillError {
        // The create happened, but its outcome reads as an error: whether a file exists is
        // unknown to us. Keep the ticket and let the cleanup worker settle the name (deleted,
        // or found absent).
        if let Ok(fd) = fs::open_segment_at(r.dir.as_fd(), name.as_cstr(), true, self.direct) {
            drop(fd);
        }
        Counters::add(&self.core.counters.segments_created, 1);
        self.core
            .store
            .cleanup
            .retain_file(r.dir.root, r.seg, r.ticket.retain());
        let e = io::Error::from_raw_os_error(e);
        SpillError::io("create", r.dir.path.join(name.as_str()), e)
    }

    /// True if the mode allocates segments ahead of their writes (direct, `preallocate`).
    fn allocates(&self) -> bool {
        self.direct || self.core.cfg.preallocate
    }

    /// Allocates the first `len` bytes of the file where the mode asks for it; the bytes
    /// allocated (0 if none, or if the filesystem cannot).
    fn preallocate(&self, fd: BorrowedFd<'_>, len: u64) -> io::Result<u64> {
        allocate_step(fd, self.direct, self.core.cfg.preallocate, len)
    }

    /// Allocates the new file up front where the mode asks for it. A failure deletes the file
    /// and marks the root failed on a device error.
    fn allocate(
        &self,
        r: Reserved,
        fd: SegFile,
        step: u64,
    ) -> std::result::Result<Created, Failed> {
        // The first allocation step (see `first_step`): the rest comes in steps as the writes
        // reach it (`SpillWriter::poll_allocated`).
        let prealloc = self.preallocate(fd.as_fd(), step);
        let allocated = *prealloc.as_ref().unwrap_or(&0);
        if let Err(e) = prealloc {
            drop(fd);
            self.delete_now(&r.dir, r.seg, r.ticket, false);
            let next_root = self.core.root_failed(r.root, &e);
            let name = SegmentFileName::new(r.seg);
            return Err(Failed {
                err: SpillError::io("preallocate", r.dir.path.join(name.as_str()), e),
                next_root,
            });
        }
        Ok(Created {
            r,
            fd,
            allocated,
            generation: 0,
        })
    }

    /// Records the new file under the abort check (invariant 2 in ARCHITECTURE.md) and returns its index in
    /// the file list and its descriptor. If the hook ran meanwhile, deletes it: `Aborted`.
    fn record_segment(&self, made: Created) -> Result<(usize, SegFile)> {
        let Created {
            r,
            mut fd,
            generation,
            ..
        } = made;
        let map = match &mut fd {
            SegFile::Kept(_, _, map) => map.take(),
            SegFile::Opened(..) => None,
        };
        // The write-after-delete window: a scope closed right here must not leave this file.
        fault_point!(WriterAfterCreate, self.core.fault, task: self.task.fault_plan());
        match self.shared.files.record(
            SegmentEntry::new(r.dir.clone(), r.seg, r.ticket).with_generation(generation, map),
        ) {
            Ok(i) => Ok((i, fd)),
            Err(entry) => {
                drop(fd);
                Counters::add(&self.core.counters.late_files_deleted, 1);
                delete_segments(&self.core, self.lane, vec![entry]);
                Err(SpillError::Aborted)
            }
        }
    }

    /// Deletes a file this writer just created and nobody else knows of. Queued like every
    /// other delete (a direct-mode segment is already allocated, and freeing its blocks can
    /// take milliseconds): never on the caller's thread.
    fn delete_now(&self, dir: &Arc<ProcDir>, seg: u32, ticket: Ticket, late: bool) {
        if late {
            Counters::add(&self.core.counters.late_files_deleted, 1);
        }
        let entry = SegmentEntry::new(dir.clone(), seg, ticket);
        delete_segments(&self.core, self.lane, vec![entry]);
    }
}

/// An admission refusal a writer can never get past, because what it holds itself fills the
/// ledger or the quota, becomes [`SpillError::WriterCannotFit`]; any other error is returned
/// as it is. `segments`: the writer's segment files (a ticket each); `reserved`: the quota
/// its files reserve (read only for a quota refusal).
pub(super) fn explain_admission(
    e: SpillError,
    segments: u64,
    reserved: impl FnOnce() -> u64,
) -> SpillError {
    match e {
        SpillError::LedgerFull { capacity } => {
            if segments < capacity as u64 {
                return e;
            }
            SpillError::WriterCannotFit {
                resource: "ticket ledger",
                held: segments,
                limit: capacity as u64,
                requested: 1,
                fix: "each segment file holds a ticket until it is deleted: raise ticket_capacity (or segment_size), or finish this writer and spill the rest with another",
            }
        }
        SpillError::QuotaExceeded {
            limit, requested, ..
        } => {
            let held = reserved();
            if held.saturating_add(requested) <= limit {
                return e;
            }
            SpillError::WriterCannotFit {
                resource: "spill quota",
                held,
                limit,
                requested,
                fix: "every open segment reserves a whole segment_size of quota: raise max_spill_bytes (or lower segment_size), or finish this writer and spill the rest with another",
            }
        }
        e => e,
    }
}
