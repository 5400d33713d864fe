//! Placing records: into the staging buffer, or as a vectored write of frame header + payload;
//! flushing the staging buffer, waiting for in-flight budget, sealing a segment.

use std::io;
use std::task::Poll;

use bytes::Bytes;

use super::rotate::trimmed_len;
use super::{SpillWriter, Wait, blocking};
use crate::config::DIRECT_ALIGN;
use crate::error::{Result, SpillError};
use crate::fault::{self, FaultPoint, Injected};
use crate::format::segment::{self, FRAME_LEN, HEADER_LEN};
use crate::io::{Op, OpKind, Short, Take, WriteData};
use crate::metrics::Counters;
use crate::store::entry::SegmentEntry;

/// A record being placed (kept across `Pending` so async writes resume where they stopped).
pub(super) struct Placing {
    rec: Bytes,
    frame: [u8; FRAME_LEN],
    /// Bytes of frame + payload placed.
    done: usize,
    /// Rotation decided and the target segment open.
    planned: bool,
    vectored: bool,
}

impl Placing {
    pub(super) fn new(rec: Bytes, vectored: bool) -> Self {
        Placing {
            vectored,
            rec,
            // Set once the target segment (whose generation the checksum binds) is open.
            frame: [0; FRAME_LEN],
            done: 0,
            planned: false,
        }
    }
}

impl SpillWriter {
    /// Places the current record; `Pending` only for async waits, with progress kept.
    pub(super) fn step(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let Some(mut p) = self.placing.take() else {
            return Poll::Ready(Ok(()));
        };
        let r = self.place(&mut p, wait);
        if r.is_pending() {
            self.placing = Some(p);
        }
        r
    }

    fn place(&mut self, p: &mut Placing, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let need = segment::framed_len(p.rec.len());
        if !p.planned {
            ready_ok!(self.plan(need, wait));
            p.planned = true;
            p.frame = segment::frame_header(&p.rec, self.generation());
        }
        if p.vectored {
            ready_ok!(self.flush_staging(wait, false));
            ready_ok!(self.poll_slot(wait));
            if let Some(seg) = self.seg.as_ref() {
                let end = seg.logical + need;
                ready_ok!(self.poll_allocated(end, false, wait));
            }
            let file = match self.segment_file() {
                Ok(f) => f,
                Err(e) => return Poll::Ready(Err(e)),
            };
            let Some(seg) = self.seg.as_mut() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let offset = seg.logical;
            seg.logical += need;
            seg.staged_at = seg.logical;
            let op = Op {
                kind: OpKind::Write {
                    file,
                    offset,
                    data: WriteData::Framed {
                        frame: p.frame,
                        payload: p.rec.clone(),
                    },
                },
                sink: self.shared.clone(),
                token: seg.entry_index as u64,
            };
            self.submit(op);
        } else {
            let total = FRAME_LEN + p.rec.len();
            while p.done < total {
                let rec = p.rec.clone();
                ready_ok!(self.copy_some(&p.frame, &rec, &mut p.done, wait));
            }
            if let Some(s) = self.seg.as_mut() {
                s.logical += need;
            }
        }
        self.count_record(p.rec.len());
        Poll::Ready(Ok(()))
    }

    pub(super) fn place_slice(&mut self, rec: &[u8]) -> Result<()> {
        let need = segment::framed_len(rec.len());
        let w = &mut Wait::Block;
        blocking(self.plan(need, w))?;
        let frame = segment::frame_header(rec, self.generation());
        let mut done = 0;
        while done < FRAME_LEN + rec.len() {
            blocking(self.copy_some(&frame, rec, &mut done, w))?;
        }
        if let Some(s) = self.seg.as_mut() {
            s.logical += need;
        }
        self.count_record(rec.len());
        Ok(())
    }

    /// The generation of the open segment (the one a record just planned goes to).
    pub(super) fn generation(&self) -> u32 {
        self.seg.as_ref().map_or(0, |s| s.generation)
    }

    pub(super) fn count_record(&mut self, len: usize) {
        self.records += 1;
        self.bytes_written += len as u64;
        let c = &self.core.counters;
        Counters::add(&c.bytes_written, len as u64);
        Counters::add(&c.records_written, 1);
    }

    /// Makes sure a segment with room for `need` more bytes is open: seals the current one if
    /// the record would pass the segment size (unless it is the segment's first record).
    pub(super) fn plan(&mut self, need: u64, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if let Some(seg) = &self.seg
            && seg.logical + need > self.segment_size
            && seg.logical > HEADER_LEN as u64
        {
            ready_ok!(self.poll_seal(wait));
        }
        let Some(seg) = &mut self.seg else {
            return match wait {
                Wait::Block => Poll::Ready(self.open_segment(need)),
                Wait::Async(cx) => self.poll_open_segment(need, cx),
            };
        };
        if !seg.file.is_cached() {
            // Evicted while idle: reopened before any byte of the record is placed, so a
            // refusal (`TooManyOpenFiles`) leaves the writer usable.
            if let Err(e) = self.reopen_segment() {
                return Poll::Ready(Err(e));
            }
        }
        let Some(seg) = &mut self.seg else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        if seg.logical + need > seg.reserved {
            // Only an empty segment gets here (a dropped `RecordSlot` opened it): the record
            // goes in whole, so its ticket must cover it.
            let mut bytes = seg.logical + need;
            if self.direct {
                bytes = bytes.next_multiple_of(DIRECT_ALIGN as u64);
            }
            let mut f = self.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                if let Err(err) = e.grow_to(bytes) {
                    return Poll::Ready(Err(err));
                }
                seg.reserved = bytes;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Copies as much of frame + payload (from `*done`) as fits in the staging buffer, flushing
    /// it first when it is full.
    fn copy_some(
        &mut self,
        frame: &[u8; FRAME_LEN],
        payload: &[u8],
        done: &mut usize,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        if self.staging.as_ref().is_some_and(|b| b.remaining() == 0) {
            ready_ok!(self.flush_staging(wait, false));
        }
        if self.staging.is_none() {
            ready_ok!(self.poll_buffer(0, wait));
        }
        let Some(buf) = self.staging.as_mut() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        if *done < FRAME_LEN {
            let n = (FRAME_LEN - *done).min(buf.remaining());
            buf.push(&frame[*done..*done + n]);
            *done += n;
        }
        if *done >= FRAME_LEN {
            let at = *done - FRAME_LEN;
            let n = (payload.len() - at).min(buf.remaining());
            buf.push(&payload[at..at + n]);
            *done += n;
        }
        Poll::Ready(Ok(()))
    }

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
            if let Wait::Async(cx) = wait
                && let Some(job) = self.mapping.as_mut()
            {
                let r = ready_ok!(job.poll(cx).map(Ok::<_, SpillError>));
                self.mapping = None;
                return match r {
                    Ok(b) => {
                        self.staging = Some(b);
                        Poll::Ready(Ok(()))
                    }
                    Err(e) => Poll::Ready(Err(short_error(Short::Io(e)))),
                };
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
                Ok(Take::Map(m)) => match wait {
                    Wait::Block => {
                        let r = match fault::check(&self.core.fault, FaultPoint::BufferMap) {
                            Injected::Fail(errno) => Err(io::Error::from_raw_os_error(errno)),
                            _ => m.map(false),
                        };
                        self.staging = Some(r.map_err(|e| short_error(Short::Io(e)))?);
                        return Poll::Ready(Ok(()));
                    }
                    // The map, the unmaps that made room for it and the first touch of its
                    // pages run on the offload pool (`io/buf.rs` `try_take`): the loop above
                    // polls the job.
                    Wait::Async(_) => {
                        let fault = self.core.fault.clone();
                        self.mapping = Some(self.core.io.offload().run(move || {
                            if let Injected::Fail(errno) =
                                fault::check(&fault, FaultPoint::BufferMap)
                            {
                                return Err(io::Error::from_raw_os_error(errno));
                            }
                            m.map(true)
                        }));
                    }
                },
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
    fn poll_slot(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let depth = self.queue_depth;
        self.poll_inflight_below(depth, wait)
    }

    /// Waits until nothing of this writer is in flight.
    pub(super) fn poll_drained(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.poll_inflight_below(1, wait)
    }

    /// Waits until fewer than `limit` writes are in flight; an abort or an earlier write's
    /// failure ends the wait.
    fn poll_inflight_below(&mut self, limit: usize, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
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
                return Poll::Ready(Ok(()));
            }
            match wait {
                Wait::Block => self.shared.tracker.cv.wait(&mut s),
                Wait::Async(cx) => {
                    s.waker = Some(cx.waker().clone());
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

    fn submit(&mut self, op: Op) {
        self.shared.tracker.st.lock().inflight += 1;
        self.core.io.submit(self.lane, op);
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
        let file = match self.segment_file() {
            Ok(f) => f,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let (Some(mut buf), Some(seg)) = (self.staging.take(), self.seg.as_mut()) else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let len = buf.len;
        if pad {
            let aligned = len.next_multiple_of(DIRECT_ALIGN).min(buf.capacity());
            buf.space()[len..aligned].fill(0);
            buf.len = aligned;
        }
        let offset = seg.staged_at;
        seg.staged_at += len as u64;
        // Counted in flight: a writer short of buffer budget may wait for it to come back.
        buf.mark_in_flight();
        let op = Op {
            kind: OpKind::Write {
                file,
                offset,
                data: WriteData::Staged(buf),
            },
            sink: self.shared.clone(),
            token: seg.entry_index as u64,
        };
        if inline && self.shared.tracker.st.lock().inflight == 0 {
            let token = op.token as u32;
            return match self.core.io.run_inline(&op) {
                Ok(_) => Poll::Ready(Ok(())),
                Err(e) => Poll::Ready(Err(self.write_error(token, e))),
            };
        }
        self.submit(op);
        Poll::Ready(Ok(()))
    }

    /// Flushes and seals the open segment: records its length and trims its ticket's quota.
    fn poll_seal(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.seal_with(wait, false)
    }

    pub(super) fn seal_with(&mut self, wait: &mut Wait<'_, '_>, last: bool) -> Poll<Result<()>> {
        if self.seg.is_none() {
            return Poll::Ready(Ok(()));
        }
        let direct = self.direct;
        let inline = last && matches!(wait, Wait::Block);
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
