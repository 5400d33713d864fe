//! Writing staging buffers (inline on the caller for a blocking `finish`'s last write, else
//! submitted to the writer's lane), waiting for buffer budget and for writes in flight, and
//! sealing a segment.

use std::io;
use std::task::Poll;
use std::time::Instant;

use super::alloc::trimmed_len;
use super::seal::open_block;
use super::step::Step;
use super::{SpillWriter, Wait, blocking};
use crate::config::DIRECT_ALIGN;
use crate::error::{Result, SpillError};
use crate::format::block::BLOCK_HEADER_LEN;
use crate::io::{Op, OpKind, Short, Take, WriteData};
use crate::metrics::Counters;
use crate::store::entry::SegmentEntry;

impl SpillWriter {
    /// Takes a staging buffer of at least `at_least` bytes under the engine's buffer budget
    /// (`io/buf.rs`): waits while the budget is full and a buffer is in flight (asynchronously
    /// for an async write); `BufferBudgetExhausted` when nothing is in flight to wait for.
    pub(super) fn poll_buffer(
        &mut self,
        at_least: usize,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        let pool = self.core.io.pool().clone();
        loop {
            if self.shared.files.is_aborted() {
                return Poll::Ready(Err(SpillError::Aborted));
            }
            let took = match wait {
                Wait::Block => pool.try_take(at_least),
                Wait::Async(cx) => match pool.try_take_now(at_least) {
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
                Ok(Take::Free(b)) => {
                    self.staging = Some(b);
                    return Poll::Ready(Ok(()));
                }
                // The map, the unmaps that made room for it and the first touch of its pages:
                // a step (on the offload pool for an async writer).
                Ok(Take::Map(m)) => return self.run_step(Step::Map(m), wait),
                Err(Short::Wait { epoch }) => match wait {
                    Wait::Block => pool.wait_returned(epoch),
                    Wait::Async(cx) => {
                        if pool.register_waker(epoch, cx.waker()) {
                            return Poll::Pending;
                        }
                    }
                },
                Err(short) => return Poll::Ready(Err(short_error(short))),
            }
        }
    }

    /// Waits until this writer may have one more write in flight. Reports an earlier write's
    /// failure.
    pub(super) fn poll_slot(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let depth = self.queue_depth;
        self.poll_inflight_below(depth, wait)
    }

    /// Waits until nothing of this writer is in flight.
    pub(super) fn poll_drained(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.poll_inflight_below(1, wait)
    }

    /// Waits until fewer than `limit` writes are in flight; an abort or an earlier write's
    /// failure ends the wait.
    pub(super) fn poll_inflight_below(
        &mut self,
        limit: usize,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        let mut s = self.shared.tracker.st.lock();
        loop {
            if self.shared.files.is_aborted() {
                return Poll::Ready(Err(SpillError::Aborted));
            }
            if let Some((idx, e)) = s.error.take() {
                drop(s);
                return Poll::Ready(Err(self.write_error(idx, e)));
            }
            if s.inflight < limit {
                if let Some(t) = self.codec.pending_since.take() {
                    self.codec.waited(t);
                }
                return Poll::Ready(Ok(()));
            }
            match wait {
                Wait::Block => {
                    let t = Instant::now();
                    self.shared.tracker.cv.wait(&mut s);
                    self.codec.waited(t);
                }
                Wait::Async(cx) => {
                    s.waker = Some(cx.waker().clone());
                    self.codec.pending_since.get_or_insert_with(Instant::now);
                    return Poll::Pending;
                }
            }
        }
    }

    pub(super) fn wait_drained(&mut self) -> Result<()> {
        blocking(self.poll_drained(&mut Wait::Block))
    }

    fn write_error(&self, entry_index: u32, e: io::Error) -> SpillError {
        Counters::add(&self.core.counters.write_failures, 1);
        let f = self.shared.files.lock();
        let path = f
            .entries
            .get(entry_index as usize)
            .map(SegmentEntry::path)
            .unwrap_or_default();
        if let Some(entry) = f.entries.get(entry_index as usize) {
            self.core.root_failed(entry.dir.parent.root, &e);
        }
        SpillError::io("write", path, e)
    }

    /// Submits `op` so that this writer's blocking `finish` can take it back and run it on
    /// its own thread if no I/O thread started it yet (it waits for it anyway): the op goes in
    /// the writer's claim slot and a claim to the lane, which runs whatever the slot still
    /// holds. One such op at a time: with the slot full, `op` is submitted as it is.
    pub(super) fn submit_claimable(&mut self, op: Op) -> Poll<Result<()>> {
        let w = &mut Wait::Block;
        match self.shared.claim.put(op) {
            Ok(()) => {
                let claim = Op {
                    kind: OpKind::Claim(self.shared.claim.clone()),
                    sink: self.shared.tracker.clone(),
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
        if let Some(mut op) = self.shared.claim.take() {
            let res = self.core.io.run_inline(&mut op);
            Counters::add(&self.core.counters.writes_inline, 1);
            op.complete(res);
        }
    }

    /// Submits the staging buffer as one write. `pad` (direct mode, last write of a segment)
    /// zero-fills it to the alignment.
    pub(super) fn flush_staging(&mut self, wait: &mut Wait<'_, '_>, pad: bool) -> Poll<Result<()>> {
        self.flush_staging_with(wait, pad, false, false)
    }

    /// [`SpillWriter::flush_staging`]; with `inline`, when nothing of this writer is in
    /// flight, the write runs on the calling thread (the last write of a blocking `finish`,
    /// which waits for it anyway: two thread hand-offs saved). `sealing`: the segment's last write
    /// (its allocation grows only to this write's end).
    fn flush_staging_with(
        &mut self,
        wait: &mut Wait<'_, '_>,
        pad: bool,
        inline: bool,
        sealing: bool,
    ) -> Poll<Result<()>> {
        if self.staging.as_ref().is_none_or(|b| b.len == 0) {
            return Poll::Ready(Ok(()));
        }
        // Direct mode writes whole 4 KiB pages: a buffer written before it is full ends with a
        // block whose header records the padding (an empty one if no block is open).
        if self.direct
            && let Some(b) = self.staging.as_mut()
            && b.block.is_none()
            && b.len % DIRECT_ALIGN != 0
            && b.remaining() >= BLOCK_HEADER_LEN
            && !pad
        {
            open_block(b);
            if let Some(s) = self.seg.as_mut() {
                s.logical += BLOCK_HEADER_LEN as u64;
            }
        }
        let pad = pad || (self.direct && self.staging.as_ref().is_some_and(|b| b.block.is_some()));
        ready_ok!(self.poll_slot(wait));
        // The write's end (padded in direct mode) must be allocated first.
        if let (Some(b), Some(seg)) = (self.staging.as_ref(), self.seg.as_ref()) {
            let len = if pad {
                b.len.next_multiple_of(DIRECT_ALIGN).min(b.capacity())
            } else {
                b.len
            };
            let end = seg.staged_at + len as u64;
            ready_ok!(self.poll_allocated(end, sealing, wait));
        }
        let file = ready_ok!(self.poll_file(wait));
        let Some(buf) = self.staging.take() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let sealed_block = buf.block.is_some();
        let mut buf = self.seal_block(buf, pad);
        let Some(seg) = self.seg.as_mut() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let mut len = buf.len;
        if pad && !sealed_block {
            // The segment's end: the padding is past its logical length.
            let aligned = len.next_multiple_of(DIRECT_ALIGN).min(buf.capacity());
            buf.space()[len..aligned].fill(0);
            buf.len = aligned;
        } else {
            len = buf.len;
        }
        let offset = seg.staged_at;
        seg.staged_at += len as u64;
        // Counted in flight: a writer short of buffer budget may wait for it to come back.
        buf.mark_in_flight();
        let mut op = Op {
            kind: OpKind::Write {
                file,
                offset,
                data: WriteData::Staged(buf),
            },
            sink: self.shared.tracker.clone(),
            token: seg.entry_index as u64,
        };
        if inline && self.shared.tracker.st.lock().inflight == 0 {
            Counters::add(&self.core.counters.writes_inline, 1);
            let token = op.token as u32;
            return match self.core.io.run_inline(&mut op) {
                Ok(_) => Poll::Ready(Ok(())),
                Err(e) => Poll::Ready(Err(self.write_error(token, e))),
            };
        }
        self.submit(op, wait)
    }

    /// Flushes and seals the open segment: records its length and trims its ticket's quota.
    pub(super) fn poll_seal(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.seal_with(wait, false)
    }

    pub(super) fn seal_with(&mut self, wait: &mut Wait<'_, '_>, last: bool) -> Poll<Result<()>> {
        if self.seg.is_none() {
            return Poll::Ready(Ok(()));
        }
        let direct = self.direct;
        let inline = last && matches!(wait, Wait::Block);
        if inline {
            self.run_claimed();
        }
        ready_ok!(self.flush_staging_with(wait, direct, inline, true));
        if let Some(seg) = self.seg.take() {
            let mut f = self.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                e.len = seg.logical;
                // The quota bounds allocated blocks: a segment allocated up front keeps its
                // whole ticket until `finish` gives the unused tail back.
                if seg.allocated > trimmed_len(seg.logical) {
                    e.allocated = seg.allocated;
                } else {
                    e.shrink_to(seg.logical);
                }
                // The fd stays with the file, for its reader and the pool's next writer.
                e.file = Some(seg.file);
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The error for a buffer the budget could not give (a wait is not an error).
pub(super) fn short_error(short: Short) -> SpillError {
    match short {
        Short::Exhausted { budget, held } => SpillError::BufferBudgetExhausted { budget, held },
        Short::Io(e) => SpillError::io("allocate buffer", "", e),
        Short::Wait { .. } => SpillError::WriterFailed,
    }
}
