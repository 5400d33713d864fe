//! Rotation: opening the next segment (a root and its task directory, a ticket, the file, its
//! allocation, and the abort check that records it), deleting a file nobody else knows of, and
//! trimming allocations at `finish`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::task::Poll;

use super::alloc::allocate_step;
use super::sink::OpenSegment;
use super::step::Step;
use super::{Ctx, SpillWriter, Wait};
use crate::cleanup::{Unlinked, delete_segments, recycle};
use crate::config::DIRECT_ALIGN;
use crate::error::{Result, SpillError};
use crate::fault::{Injected, fault_point};
use crate::format::segment::{self, HEADER_LEN, SegmentFileName};
use crate::io::{CachedFile, FdPermit, FileHandle, IoBuf, NameBuf, Offloaded, SharedMap};
use crate::metrics::Counters;
use crate::store::entry::SegmentEntry;
use crate::store::ledger::Ticket;
use crate::store::proc::ProcDir;
use crate::store::roots::RootUse;
use crate::sys::fs;

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

/// The smallest segment size whose writers open their next segment ahead of need: with
/// smaller segments a rotation is a small part of a segment's write time, and a second file
/// and ticket per writer would double what small spills hold.
pub(super) const AHEAD_MIN_SEGMENT: u64 = 8 << 20;

/// The next segment, opened ahead of need (issue 27, point 1): once the open segment is half
/// full, the rotation runs on the offload pool while the writer fills the rest, so the
/// producer's thread does not pay for the ticket, the create and the allocation of a whole
/// segment. It is the rotation's own code (`Ctx::open`): ticket first, the abort check after
/// the create, its file recorded in the writer's list (so a failed, cancelled or dropped
/// writer deletes it with the others, or the rotation deletes it itself if the writer gave
/// its files up first). A writer that finishes before it needs it gives it back
/// (`give_back_ahead`).
pub(super) enum Ahead {
    /// Nothing opened ahead: the next rotation happens at need.
    None,
    /// Opening on the offload pool.
    Opening(Offloaded<Result<Opened>>),
    /// Opened and recorded, waiting for the open segment to fill.
    Ready(Opened),
}

impl SpillWriter {
    /// Opens the next segment with room for a first record of `need` bytes: the one opened
    /// ahead of need if it has room (waiting for its rotation to end), else a rotation (see
    /// [`Ctx::open`]), a step (`step.rs`: on the offload pool for an async writer). If the
    /// future polling it is dropped meanwhile, the rotation still ends on the pool thread: a
    /// file it records is deleted by the writer's failure (the next use of a writer whose
    /// future was dropped) or, if the writer already gave up its files, is refused by the file
    /// list and deleted by the rotation itself.
    pub(super) fn poll_rotated(&mut self, need: u64, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let reserve = self.segment_reserve(need);
        loop {
            match std::mem::replace(&mut self.ahead, Ahead::None) {
                Ahead::None => break,
                Ahead::Opening(job) => {
                    self.ahead = Ahead::Opening(job);
                    std::task::ready!(self.poll_ahead(wait));
                }
                Ahead::Ready(o) if o.reserve >= reserve => match self.blocks.staging.take() {
                    Some(buf) => {
                        Counters::add(&self.ctx.core.counters.rotations_ahead, 1);
                        self.start_segment(o, buf);
                        return Poll::Ready(Ok(()));
                    }
                    None => {
                        self.ahead = Ahead::Ready(o);
                        ready_ok!(self.poll_buffer(wait));
                    }
                },
                // Too small for this record (a first record larger than a segment).
                Ahead::Ready(o) => self.give_back_ahead(o),
            }
        }
        let step = Step::Rotate {
            ctx: self.ctx.clone(),
            reserve,
            first: self.first_allocation(need, reserve),
        };
        self.run_step(step, wait)
    }

    /// Starts opening the next segment on the offload pool once the open one is half full
    /// (segments of [`AHEAD_MIN_SEGMENT`] or more), when the ledger and the quota have room
    /// for two more segments: an early rotation must not take what another writer needs now.
    pub(super) fn rotate_ahead(&mut self) {
        let seg = self.ctx.segment_size;
        if !matches!(self.ahead, Ahead::None) || seg < AHEAD_MIN_SEGMENT || self.offset() < seg / 2
        {
            return;
        }
        let reserve = self.segment_reserve(0);
        let ledger = &self.ctx.core.store.ledger;
        let room = ledger.capacity().saturating_sub(ledger.used()) >= 2
            && ledger
                .max_bytes()
                .is_none_or(|max| max.saturating_sub(ledger.bytes_used()) >= 2 * reserve);
        if !room {
            return;
        }
        // The open segment's root is no longer counted in placement: the writer is done with
        // it by the time the new one starts (`RootUse::leave`).
        if let Some(seg) = self.seg.as_mut() {
            seg.root_use.leave();
        }
        let ctx = self.ctx.clone();
        // Not the writer's first segment: allocated whole at its creation.
        let job = self
            .ctx
            .core
            .io
            .offload()
            .run(move || ctx.open(reserve, reserve));
        self.ahead = Ahead::Opening(job);
    }

    /// Waits for a rotation ahead of need to end (blocking, or `Pending` for an async call):
    /// `Ready` leaves [`Ahead::Ready`], or [`Ahead::None`] if it failed. Its error is not the
    /// writer's: the rotation at need runs again and reports what it meets.
    pub(super) fn poll_ahead(&mut self, wait: &mut Wait<'_, '_>) -> Poll<()> {
        let Ahead::Opening(job) = &mut self.ahead else {
            return Poll::Ready(());
        };
        let r = match wait {
            Wait::Block => job.wait(),
            Wait::Async(cx, _) => std::task::ready!(job.poll(cx)),
        };
        self.ahead = match r {
            Ok(o) => Ahead::Ready(o),
            Err(e) => {
                tracing::debug!(error = %e, "opening a segment ahead of need failed; rotating at need");
                Ahead::None
            }
        };
        Poll::Ready(())
    }

    /// `finish`: waits for a rotation ahead of need, then gives its unused segment back.
    pub(super) fn poll_ahead_given_back(&mut self, wait: &mut Wait<'_, '_>) -> Poll<()> {
        std::task::ready!(self.poll_ahead(wait));
        if let Ahead::Ready(o) = std::mem::replace(&mut self.ahead, Ahead::None) {
            self.give_back_ahead(o);
        }
        Poll::Ready(())
    }

    /// Gives back a segment opened ahead of need and not used: out of the file list, into the
    /// segment pool (or deleted). If the scope's hook took the list meanwhile, it deletes it.
    fn give_back_ahead(&mut self, o: Opened) {
        let Some(mut e) = self.ctx.shared.files.take_last(o.entry_index) else {
            return;
        };
        e.allocated = o.allocated;
        drop(o);
        recycle(&self.ctx.core, self.ctx.lane, vec![e], |_| false);
    }

    /// Bytes a new segment's ticket holds: a whole segment, or more for a first record that
    /// passes the segment size; whole blocks in direct mode.
    fn segment_reserve(&self, need: u64) -> u64 {
        let mut reserve = (HEADER_LEN as u64 + need).max(self.ctx.segment_size);
        if self.ctx.direct {
            reserve = reserve.next_multiple_of(DIRECT_ALIGN as u64);
        }
        reserve
    }

    /// Starts writing the recorded segment: its file handle, and `buf` as the staging buffer,
    /// holding its header.
    pub(super) fn start_segment(&mut self, o: Opened, mut buf: IoBuf) {
        let file = match o.fd {
            SegFile::Opened(fd, permit) => {
                self.ctx
                    .core
                    .io
                    .fds()
                    .install(fd, permit, self.ctx.core.io.reaper().clone())
            }
            SegFile::Kept(file, _in_use, _) => file,
        };
        buf.push(&segment::encode_header(
            o.seg,
            self.ctx.core.id,
            o.generation,
            self.ctx.core.key_id(),
        ));
        self.blocks.staging = Some(buf);
        self.blocks.codec.root_fill = o.root_fill;
        self.counts.segments += 1;
        (self.ctx.shared.open_written).store(0, std::sync::atomic::Ordering::Relaxed);
        self.seg = Some(OpenSegment {
            entry_index: o.entry_index,
            allocated: o.allocated,
            reserved: o.reserve,
            file,
            written: 0,
            generation: o.generation,
            segment: o.seg,
            engine: self.ctx.core.id,
            root_use: {
                let mut u = o.root_use;
                u.start();
                u
            },
        });
    }
}

/// A segment created (or reused), allocated and recorded in the file list: ready to write.
pub(super) struct Opened {
    fd: SegFile,
    seg: u32,
    entry_index: usize,
    /// Bytes allocated to the file (direct mode, `preallocate`), 0 if none.
    allocated: u64,
    /// Bytes of quota its ticket holds.
    reserve: u64,
    generation: u32,
    /// How full its root is of spills (`Store::root_fill`), for `Auto`'s space pressure.
    root_fill: f64,
    /// Counts the segment as being written on its root, for the placement of the next ones.
    root_use: RootUse,
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
