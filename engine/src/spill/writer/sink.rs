//! The segment sink: the open segment (its fd, its allocation, where its writes are), staging
//! buffers taken under the engine's budget, a buffer written (sealed by the block builder,
//! then submitted to the writer's lane, or run inline for a blocking `finish`'s last write),
//! the writes in flight waited for, and a segment sealed. What may block goes through a step
//! (`step.rs`).

use std::io;
use std::sync::Arc;
use std::task::Poll;

use super::block::{At, open_block};
use super::segfile::{next_step, trimmed_len};
use super::stage::Until;
use super::step::Step;
use super::{SpillWriter, Wait};
use crate::config::DIRECT_ALIGN;
use crate::error::{Result, SpillError};
use crate::format::block::{BLOCK_HEADER_LEN, Binding};
use crate::io::{CachedFile, FileHandle, IoBuf, NoBuffer, Op, OpKind, Refused, Taken, WriteData};
use crate::metrics::Counters;
use crate::store::entry::SegmentEntry;
use crate::store::roots::RootUse;

/// The segment being written.
pub(super) struct OpenSegment {
    pub(super) entry_index: usize,
    /// Bytes allocated to the file so far (direct mode, `preallocate`; grown in steps, see
    /// [`SpillWriter::poll_allocated`]), 0 if none.
    pub(super) allocated: u64,
    /// Bytes of quota the segment's ticket holds.
    pub(super) reserved: u64,
    /// The segment's fd, which the engine's fd bound may close while it is idle (reopened by
    /// name for the next write: `Step::Reopen`).
    pub(super) file: CachedFile,
    /// Bytes handed to writes so far: the file offset of the staging buffer's first byte.
    /// The segment's length is this plus what the staging buffer holds
    /// ([`SpillWriter::offset`]).
    pub(super) written: u64,
    /// This use of the file (in its header and every block's checksum).
    pub(super) generation: u32,
    /// The segment's number (bound into every block's checksum).
    pub(super) segment: u32,
    /// The engine's id (its segment header's; bound into every block's checksum too: two
    /// engines number their segments alike).
    pub(super) engine: u64,
    /// Counts it as being written on its root until the segment is sealed or dropped, and
    /// measures the root's rate as its writes go out.
    pub(super) root_use: RootUse,
}

impl OpenSegment {
    /// Where the staging buffer goes, for the block builder.
    pub(super) fn at(&self) -> At {
        At {
            bind: Binding {
                segment: self.segment,
                generation: self.generation,
                engine: self.engine,
            },
            written: self.written,
        }
    }
}

impl SpillWriter {
    /// The open segment's length so far (header included): the next record's offset; with
    /// buffers in the codec stage, the most it can be (exact once the stage is empty:
    /// `Until::Written`). 0 with no segment open.
    pub(super) fn offset(&self) -> u64 {
        self.seg.as_ref().map_or(0, |s| s.written)
            + self.stage.bound()
            + self.blocks.staged() as u64
    }

    /// Takes a staging buffer under the engine's buffer budget (`io/buf.rs`): waits while the
    /// budget is full and a buffer is in flight (asynchronously for an async write);
    /// `BufferBudgetExhausted` when nothing is in flight to wait for.
    pub(super) fn poll_buffer(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let pool = self.ctx.core.io.pool().clone();
        loop {
            if self.ctx.shared.files.is_aborted() {
                return Poll::Ready(Err(SpillError::Aborted));
            }
            let took = match wait {
                Wait::Block => pool.try_take(0),
                Wait::Async(cx, _) => match pool.try_take_now(0) {
                    Some(r) => r,
                    None => {
                        // The pool's lock is held (a buffer coming back): look again soon
                        // rather than wait for the lock in the poll.
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                },
            };
            match took {
                Ok(Taken::Free(b)) => {
                    self.blocks.staging = Some(b);
                    return Poll::Ready(Ok(()));
                }
                // The map, the unmaps that made room for it and the first touch of its pages:
                // a step (on the offload pool for an async writer).
                Ok(Taken::Map(m)) => return self.run_step(Step::Map(m), wait),
                // The writer's own queued buffers come back only once it writes them.
                Err(NoBuffer::Wait { .. } | NoBuffer::Exhausted { .. })
                    if self.stage.queued() > 0 =>
                {
                    ready_ok!(self.poll_written(false, wait));
                }
                Err(NoBuffer::Wait { epoch }) => match wait {
                    Wait::Block => pool.wait_returned(epoch),
                    Wait::Async(cx, _) => {
                        if pool.register_waker(epoch, cx.waker()) {
                            return Poll::Pending;
                        }
                    }
                },
                Err(NoBuffer::Exhausted { budget, held }) => {
                    return Poll::Ready(Err(buffer_error(Refused::Exhausted { budget, held })));
                }
                Err(NoBuffer::Io(e)) => return Poll::Ready(Err(buffer_error(Refused::Io(e)))),
            }
        }
    }

    /// A staging buffer with room for at least one byte: the full one written first, a new one
    /// taken when there is none.
    pub(super) fn staging_with_room(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if self.blocks.staging.is_some() && self.blocks.room() == 0 {
            ready_ok!(self.flush_staging(wait, false));
        }
        if self.blocks.staging.is_none() {
            ready_ok!(self.poll_buffer(wait));
        }
        Poll::Ready(Ok(()))
    }

    /// Waits until this writer may have one more write in flight (or buffer queued in its
    /// codec stage). Reports an earlier write's failure.
    pub(super) fn poll_slot(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.poll_until(Until::Below(self.ctx.queue_depth), wait)
    }

    /// Waits until nothing of this writer is in flight or queued.
    pub(super) fn poll_drained(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.poll_until(Until::Below(1), wait)
    }

    pub(super) fn write_error(&self, entry_index: u32, e: io::Error) -> SpillError {
        Counters::add(&self.ctx.core.counters.write_failures, 1);
        let f = self.ctx.shared.files.lock();
        let path = f
            .entries
            .get(entry_index as usize)
            .map(SegmentEntry::path)
            .unwrap_or_default();
        if let Some(entry) = f.entries.get(entry_index as usize) {
            self.ctx.core.root_failed(entry.dir.root, &e);
        }
        SpillError::io("write", path, e)
    }

    /// Queues `op` on the writer's lane, counted in flight. An async writer that finds the
    /// lane's channel full waits for room on the offload pool (a step), not in its poll.
    pub(super) fn submit(&mut self, op: Op, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.ctx.shared.tracker.st.lock().inflight += 1;
        let op = match wait {
            Wait::Block => op,
            Wait::Async(..) => match self.ctx.core.io.try_submit(self.ctx.lane, op) {
                Ok(()) => return Poll::Ready(Ok(())),
                Err(op) => op,
            },
        };
        let step = Step::Submit {
            core: self.ctx.core.clone(),
            lane: self.ctx.lane,
            op,
        };
        self.run_step(step, wait)
    }

    /// Submits `op` so that this writer's blocking `finish` can take it back and run it on
    /// its own thread if no I/O thread started it yet (it waits for it anyway): the op goes in
    /// the writer's claim slot and a claim to the lane, which runs whatever the slot still
    /// holds. One such op at a time: with the slot full, `op` is submitted as it is.
    pub(super) fn submit_claimable(&mut self, op: Op) -> Poll<Result<()>> {
        let w = &mut Wait::Block;
        match self.ctx.shared.claim.put(op) {
            Ok(()) => {
                let claim = Op {
                    kind: OpKind::InSlot(self.ctx.shared.claim.clone()),
                    sink: self.ctx.shared.tracker.clone(),
                    token: 0,
                };
                self.submit(claim, w)
            }
            Err(op) => self.submit(op, w),
        }
    }

    /// A blocking `finish`: the write this writer left claimable, if no I/O thread started
    /// it, runs here (its outcome goes to the tracker as from an I/O thread).
    fn run_claimed(&mut self) {
        if let Some(mut op) = self.ctx.shared.claim.take() {
            let res = self.ctx.core.io.run_inline(&mut op);
            Counters::add(&self.ctx.core.counters.writes_inline, 1);
            op.complete(res);
        }
    }

    /// Writes the staging buffer if a block is open in it (sealing the block).
    pub(super) fn seal_open_block(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if self.blocks.block_open() {
            ready_ok!(self.flush_staging(wait, false));
        }
        Poll::Ready(Ok(()))
    }

    /// Submits the staging buffer as one write (with a codec: queues it in the codec stage,
    /// `stage.rs`). `pad` (direct mode, last write of a segment) zero-fills it to the
    /// alignment.
    pub(super) fn flush_staging(&mut self, wait: &mut Wait<'_, '_>, pad: bool) -> Poll<Result<()>> {
        self.flush_staging_with(wait, pad, false, false)
    }

    /// [`SpillWriter::flush_staging`]; with `inline`, when nothing of this writer is in
    /// flight, the write runs on the calling thread (the last write of a blocking `finish`,
    /// which waits for it anyway: two thread hand-offs saved). `sealing`: the segment's last
    /// write (its allocation grows only to this write's end). Nothing to write with no
    /// segment open or an empty buffer.
    fn flush_staging_with(
        &mut self,
        wait: &mut Wait<'_, '_>,
        pad: bool,
        inline: bool,
        sealing: bool,
    ) -> Poll<Result<()>> {
        if self.seg.is_none() || self.blocks.staged() == 0 {
            return Poll::Ready(Ok(()));
        }
        // Direct mode writes whole 4 KiB pages: a buffer written before it is full ends with a
        // block whose header records the padding (an empty one if no block is open).
        if self.ctx.direct
            && !pad
            && let Some(b) = self.blocks.staging.as_mut()
            && b.block.is_none()
            && b.len % DIRECT_ALIGN != 0
            && b.remaining() >= BLOCK_HEADER_LEN
        {
            open_block(b);
        }
        let block = self.blocks.block_open();
        let pad = pad || (self.ctx.direct && block);
        ready_ok!(self.poll_slot(wait));
        if self.has_codec() {
            // Compressed off this thread, written in order (`stage.rs`).
            self.enqueue(pad, sealing);
            return self.poll_stage_ready(wait, inline);
        }
        // The write's end (padded in direct mode) must be allocated first.
        if let (Some(b), Some(seg)) = (self.blocks.staging.as_ref(), self.seg.as_ref()) {
            let end = seg.written + b.write_len(pad) as u64;
            ready_ok!(self.poll_allocated(end, sealing, wait));
        }
        let file = ready_ok!(self.poll_file(wait));
        let Some(seg) = self.seg.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if block {
            self.blocks.seal(&self.ctx.core, seg.at(), pad);
        }
        let Some(buf) = self.blocks.staging.take() else {
            return Poll::Ready(Ok(()));
        };
        self.write_buffer(buf, file, pad && !block, inline, wait)
    }

    /// Submits `buf`, sealed, as the open segment's next write (at its length so far); with
    /// `inline`, when nothing of this writer is in flight, runs it on this thread instead.
    /// `pad_end` (direct mode, the segment's end with no block to record the padding): zero
    /// padding to the alignment, past the segment's length.
    pub(super) fn write_buffer(
        &mut self,
        mut buf: IoBuf,
        file: Arc<FileHandle>,
        pad_end: bool,
        inline: bool,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        let Some(seg) = self.seg.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let len = buf.len;
        if pad_end {
            let aligned = buf.write_len(true);
            buf.space()[len..aligned].fill(0);
            buf.len = aligned;
        }
        let offset = seg.written;
        seg.written += len as u64;
        seg.root_use
            .progress(seg.written, self.blocks.codec.device_wait_ns);
        // For the scope's usage: what the open segment holds (issue 25).
        self.ctx
            .shared
            .open_written
            .store(seg.written, std::sync::atomic::Ordering::Relaxed);
        // Counted in flight: a writer short of buffer budget may wait for it to come back.
        buf.mark_in_flight();
        let mut op = Op {
            kind: OpKind::Write {
                file,
                offset,
                data: WriteData::Staged(buf),
            },
            sink: self.ctx.shared.tracker.clone(),
            token: seg.entry_index as u64,
        };
        if inline && self.ctx.shared.tracker.st.lock().inflight == 0 {
            Counters::add(&self.ctx.core.counters.writes_inline, 1);
            let token = op.token as u32;
            return match self.ctx.core.io.run_inline(&mut op) {
                Ok(_) => Poll::Ready(Ok(())),
                Err(e) => Poll::Ready(Err(self.write_error(token, e))),
            };
        }
        self.submit(op, wait)
    }

    /// Flushes and seals the open segment: records its length and trims its ticket's quota.
    /// `last`: `finish`'s (a blocking one runs its last write inline).
    pub(super) fn seal_with(&mut self, wait: &mut Wait<'_, '_>, last: bool) -> Poll<Result<()>> {
        if self.seg.is_none() {
            return Poll::Ready(Ok(()));
        }
        let direct = self.ctx.direct;
        let inline = last && matches!(wait, Wait::Block);
        if inline {
            self.run_claimed();
        }
        ready_ok!(self.flush_staging_with(wait, direct, inline, true));
        ready_ok!(self.poll_written(inline, wait));
        let len = self.offset();
        if let Some(seg) = self.seg.take() {
            let mut f = self.ctx.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                e.len = len;
                // The quota bounds allocated blocks: a segment allocated up front keeps its
                // whole ticket until `finish` gives the unused tail back.
                if seg.allocated > trimmed_len(len) {
                    e.allocated = seg.allocated;
                } else {
                    e.shrink_to(len);
                }
                // The fd stays with the file, for its reader and the pool's next writer.
                e.file = Some(seg.file);
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Makes sure the open segment is allocated up to `end` before a write reaches it (direct
    /// mode, `preallocate`; nothing otherwise, or if the filesystem could not allocate its
    /// first step). Segments are allocated in steps, not whole: the first step at rotation
    /// (`segfile::first_step`: 1 MiB or the first record), then doubling up to the segment's
    /// reservation (its ticket holds the whole segment all along, so a step never needs a
    /// ticket and the quota counts a segment's full size from its creation). A step
    /// (`Step::Grow`: on the offload pool for an async writer). A failed step fails the write
    /// (`StorageFull` on ENOSPC).
    ///
    /// `last` (the segment's last write, at a seal): only up to `end`, since nothing follows.
    pub(super) fn poll_allocated(
        &mut self,
        end: u64,
        last: bool,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        let (direct, preallocate) = (self.ctx.direct, self.ctx.core.cfg.preallocate);
        let Some(seg) = self.seg.as_ref() else {
            return Poll::Ready(Ok(()));
        };
        if seg.allocated == 0 || end <= seg.allocated {
            return Poll::Ready(Ok(()));
        }
        let target = if last {
            end.next_multiple_of(DIRECT_ALIGN as u64)
        } else {
            next_step(seg.allocated, end, seg.reserved)
        };
        let file = ready_ok!(self.poll_file(wait));
        let step = Step::Grow {
            file,
            direct,
            preallocate,
            target,
        };
        self.run_step(step, wait)
    }

    /// The open segment's fd for a write op: the cached one (the hot path: no syscall), or
    /// the segment reopened first (a step). A refusal here may come with part of a record
    /// already staged, so it fails the writer (its files are deleted) rather than leave it
    /// usable.
    pub(super) fn poll_file(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<Arc<FileHandle>>> {
        loop {
            if let Some(f) = self.seg.as_ref().and_then(|s| s.file.get()) {
                return Poll::Ready(Ok(f));
            }
            match self.poll_reopened(wait) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e @ SpillError::TooManyOpenFiles { .. })) => {
                    return Poll::Ready(Err(self.fail(e)));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Reopens the open segment, whose fd the bound closed (a step; nothing with no segment
    /// open).
    pub(super) fn poll_reopened(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let Some(seg) = self.seg.as_ref() else {
            return Poll::Ready(Ok(()));
        };
        let step = Step::Reopen {
            ctx: self.ctx.clone(),
            entry: seg.entry_index,
        };
        self.run_step(step, wait)
    }
}

/// The error for a buffer the budget could not give.
pub(super) fn buffer_error(r: Refused) -> SpillError {
    match r {
        Refused::Exhausted { budget, held } => SpillError::BufferBudgetExhausted { budget, held },
        Refused::Io(e) => SpillError::io("allocate buffer", "", e),
    }
}
