//! The steps of a write that may block, as one enum, and the one helper that runs them:
//! inline for a blocking call, on the engine's offload pool for an async one (its poll returns
//! `Pending` until the step ends; the next poll applies the result first, [`SpillWriter::resume`]).
//! So an `_async` call makes none of these syscalls, and waits for none of these locks, on its
//! caller's thread:
//!
//! - `Rotate`: open the next segment (`segfile.rs`: ticket, create or pooled reuse, the first
//!   allocation step, the abort check) and map its staging buffer;
//! - `Grow`: the next allocation step of the open segment (`segfile.rs`: `fallocate`);
//! - `Map`: map a fresh staging buffer (`io/buf.rs` `Mapping`: `mmap`, the unmaps that made
//!   room, the first touch of its pages);
//! - `Reopen`: reopen the open segment after the engine's fd bound (`max_open_files`,
//!   `io/fdcache.rs`) closed its idle fd: the fd permit (which may wait for another writer's fd
//!   to go idle), `openat` by name with the flags it was created with (`O_DIRECT` in direct
//!   mode), never creating, and a sleep on EMFILE. A segment the scope's cancel deleted
//!   meanwhile is `Aborted` (the cancel owns its delete: the reopen never creates a file, so
//!   every file still has exactly one deleter);
//! - `Submit`: queue an op to a lane whose channel is full (wait for room);
//! - `Trim`: give back the preallocated tails of the writer's segments at `finish` (an open and
//!   an `ftruncate` per segment).

use std::future::poll_fn;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::task::Poll;

use super::Ctx;
use super::segfile::{Opened, allocate_step, trim_allocations};
use super::sink::buffer_error;
use super::{Life, SpillWriter, Wait};
use crate::error::{Result, SpillError};
use crate::fault::fault_point;
use crate::format::segment::{HEADER_LEN, SegmentFileName};
use crate::io::{FdPermit, FileHandle, IoBuf, Mapping, Offloaded, Op, Refused};
use crate::shared::EngineShared;
use crate::spill::budget::Budget;
use crate::store::entry::SegmentEntry;
use crate::sys::fs;

/// A step of a write that may block (see the module docs). A value that lives for one call
/// (or moves into an offload job, boxed there): boxing its op would allocate per submit.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step {
    Rotate {
        ctx: Ctx,
        /// Bytes the new segment's ticket holds.
        reserve: u64,
        /// Its first allocation step.
        first: u64,
    },
    Grow {
        file: Arc<FileHandle>,
        direct: bool,
        preallocate: bool,
        /// Bytes the segment is to have allocated.
        target: u64,
    },
    Map(Mapping),
    Reopen {
        ctx: Ctx,
        /// The open segment's index in the writer's file list.
        entry: usize,
    },
    Submit {
        core: Arc<EngineShared>,
        lane: usize,
        op: Op,
    },
    /// Give back the preallocated tails at `finish` (`segfile.rs` `trim_allocations`).
    Trim(Ctx),
}

/// What a step did, for [`SpillWriter::apply`].
pub(super) enum Done {
    Rotated(Opened, IoBuf),
    Grown { target: u64, r: io::Result<u64> },
    Mapped(io::Result<IoBuf>),
    Reopened(OwnedFd, FdPermit),
    Submitted,
    Trimmed,
}

/// A step running on the offload pool.
pub(super) type Running = Offloaded<Result<Done>>;

impl Step {
    /// Runs the step on this thread. `off_thread`: on the offload pool (a fresh buffer's pages
    /// are faulted in there, not by the caller's first copy into it).
    fn run(self, off_thread: bool) -> Result<Done> {
        match self {
            Step::Rotate {
                ctx,
                reserve,
                first,
            } => {
                let opened = ctx.open(reserve, first)?;
                // A full buffer budget waits here (a blocking writer's thread, or the pool's).
                // An error leaves the recorded file to the writer's failure.
                let buf = ctx.core.io.pool().get_blocking(HEADER_LEN, off_thread);
                Ok(Done::Rotated(opened, buf.map_err(buffer_error)?))
            }
            Step::Grow {
                file,
                direct,
                preallocate,
                target,
            } => Ok(Done::Grown {
                target,
                r: allocate_step(file.as_fd(), direct, preallocate, target),
            }),
            Step::Map(m) => Ok(Done::Mapped(m.map(off_thread))),
            Step::Reopen { ctx, entry } => {
                let (fd, permit) = ctx.reopen(entry)?;
                Ok(Done::Reopened(fd, permit))
            }
            Step::Submit { core, lane, op } => {
                core.io.submit(lane, op);
                Ok(Done::Submitted)
            }
            Step::Trim(ctx) => {
                trim_allocations(&ctx.core, &ctx.shared, ctx.direct);
                Ok(Done::Trimmed)
            }
        }
    }
}

impl SpillWriter {
    /// Polls `f` to its end as an async call: first the writer's budget of work
    /// (`spill/budget.rs`: a spent one yields before anything is done; `record` bytes are
    /// what the call moves, and such a call, `write_async`, marks the writer `Busy` once it
    /// starts, since a record may then be half placed); then on every poll the call's step
    /// (if any) resumed first. A step running marks the writer `Busy` too: a future dropped
    /// then leaves it so, and the next call fails it (`WriteFutureDropped`). Back to `Open`
    /// when the call ends.
    pub(super) async fn run_async<T>(
        &mut self,
        record: Option<usize>,
        mut f: impl FnMut(&mut Self, &mut Wait<'_, '_>) -> Poll<Result<T>>,
    ) -> Result<T> {
        let mut step = None;
        let mut started = false;
        let r = poll_fn(|cx| {
            if !started {
                let budget = self.budget.get_or_insert_with(Budget::new);
                std::task::ready!(budget.poll_ready(cx));
                budget.spend(record.unwrap_or(0));
                if record.is_some() {
                    self.life = Life::Busy;
                }
                started = true;
            }
            let mut wait = Wait::Async(cx, &mut step);
            let r = match self.resume(&mut wait) {
                Poll::Ready(Ok(())) => f(self, &mut wait),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            };
            if r.is_pending()
                && let Some(budget) = self.budget.as_mut()
            {
                budget.yielded();
            }
            r
        })
        .await;
        if self.life == Life::Busy {
            self.life = Life::Open;
        }
        r
    }

    /// Runs `step`: here for a blocking call, and applies its result; on the offload pool for
    /// an async one, `Pending` until it ends (the next poll applies it first: `resume`).
    pub(super) fn run_step(&mut self, step: Step, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        match wait {
            Wait::Block => Poll::Ready(step.run(false).and_then(|d| self.apply(d))),
            Wait::Async(_, running) => {
                **running = Some(self.ctx.core.io.offload().run(move || step.run(true)));
                self.life = Life::Busy;
                self.resume(wait)
            }
        }
    }

    /// An async call's poll, first: the step running on the offload pool, if any. `Pending`
    /// while it runs; its result applied once it ended.
    pub(super) fn resume(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let Wait::Async(cx, running) = wait else {
            return Poll::Ready(Ok(()));
        };
        let Some(job) = running.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let done = ready_ok!(job.poll(cx).map(Ok::<_, SpillError>));
        **running = None;
        Poll::Ready(done.and_then(|d| self.apply(d)))
    }

    /// Makes what a step did part of the writer.
    fn apply(&mut self, done: Done) -> Result<()> {
        match done {
            Done::Rotated(opened, buf) => {
                self.start_segment(opened, buf);
                Ok(())
            }
            Done::Grown { target, r } => {
                let Some(seg) = self.seg.as_mut() else {
                    return Ok(());
                };
                match r {
                    // `Ok(0)`: the filesystem cannot (it could the first step), and the writes
                    // extend the file; counted as allocated all the same, so the step is not
                    // tried again for these bytes (`finish` truncates to the written length).
                    Ok(_) => {
                        seg.allocated = target;
                        Ok(())
                    }
                    Err(e) => {
                        let f = self.ctx.shared.files.lock();
                        let path = f
                            .entries
                            .get(seg.entry_index)
                            .map(SegmentEntry::path)
                            .unwrap_or_default();
                        Err(SpillError::io("preallocate", path, e))
                    }
                }
            }
            Done::Mapped(r) => {
                self.blocks.staging = Some(r.map_err(|e| buffer_error(Refused::Io(e)))?);
                Ok(())
            }
            Done::Reopened(fd, permit) => {
                if let Some(seg) = self.seg.as_ref() {
                    seg.file.fill(fd, permit, self.ctx.core.io.reaper().clone());
                }
                Ok(())
            }
            Done::Submitted | Done::Trimmed => Ok(()),
        }
    }
}

impl Ctx {
    /// The `Reopen` step: the open segment (index `entry` in the file list) reopened under a
    /// new permit of the fd bound (waiting at the bound).
    fn reopen(&self, entry: usize) -> Result<(OwnedFd, FdPermit)> {
        if self.shared.files.is_aborted() {
            return Err(SpillError::Aborted);
        }
        let found = {
            let f = self.shared.files.lock();
            f.entries.get(entry).map(|e| (e.dir.clone(), e.seg))
        };
        let Some((task_dir, num)) = found else {
            // The list was taken: by the cancel (then `Aborted`), or the writer failed.
            return Err(if self.shared.files.is_aborted() {
                SpillError::Aborted
            } else {
                SpillError::WriterFailed
            });
        };
        fault_point!(WriterReopen, self.core.fault, task: self.task.fault_plan());
        let fds = self.core.io.fds();
        let permit = fds.permit();
        let name = SegmentFileName::new(num);
        let direct = self.direct;
        let opened =
            fds.open_with(|| fs::open_segment_at(task_dir.as_fd(), name.as_cstr(), false, direct));
        match opened {
            Ok(fd) => Ok((fd, permit)),
            // The cancel deleted it between the check above and the open.
            Err(_) if self.shared.files.is_aborted() => Err(SpillError::Aborted),
            Err(e) => Err(SpillError::io(
                "reopen",
                task_dir.path.join(name.as_str()),
                e,
            )),
        }
    }
}
