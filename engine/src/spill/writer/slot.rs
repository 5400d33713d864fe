//! Records filled in place: [`RecordSlot`] and [`SpillWriter::record`].

use std::task::Poll;
use std::time::{Duration, Instant};

use super::{SpillWriter, Wait, check_len, drive};
use crate::error::{Result, SpillError};
use crate::format::block::BLOCK_HEADER_LEN;
use crate::format::segment::{self, FRAME_LEN};
use crate::io::{NoBuffer, Taken};

/// A record filled in place, in the writer's staging buffer: the bytes the caller writes here
/// are the bytes that go to disk, with no copy. Made by [`SpillWriter::record`]; `commit`
/// frames and queues it; dropping it without `commit` writes nothing.
///
/// The slot's initial contents are unspecified (a reused buffer): fill all of it.
pub struct RecordSlot<'a> {
    w: &'a mut SpillWriter,
    kind: SlotKind,
}

enum SlotKind {
    /// Payload at `at + FRAME_LEN` in the staging buffer, `len` bytes. `took`: the caller's
    /// time in the `record` call that made it (with the commit's, one write latency).
    InPlace {
        at: usize,
        len: usize,
        took: Duration,
    },
    /// Too big for a staging buffer (or no aligned room in direct mode): an owned buffer,
    /// written like `write` on commit.
    Owned(bytes::BytesMut),
}

impl std::fmt::Debug for RecordSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSlot")
            .field("len", &self.len())
            .field("in_place", &matches!(self.kind, SlotKind::InPlace { .. }))
            .finish()
    }
}

impl RecordSlot<'_> {
    /// True when the slot is in the staging buffer (the write will make no copy).
    pub fn is_in_place(&self) -> bool {
        matches!(self.kind, SlotKind::InPlace { .. })
    }

    /// Frames the record (its length; the block's checksum covers it when the block is
    /// sealed) and queues it.
    pub fn commit(self) -> Result<()> {
        let RecordSlot { w, kind } = self;
        match kind {
            SlotKind::Owned(b) => w.write(b.freeze()),
            SlotKind::InPlace { at, len, took } => {
                let started = Instant::now();
                if w.ctx.shared.files.is_aborted() {
                    return Err(w.observe_abort());
                }
                // The slot borrows the writer from its making: its buffer is still there.
                if !w.blocks.commit_slot(at, len) {
                    return Err(w.fail(SpillError::WriterFailed));
                }
                w.count_record(len);
                w.ctx
                    .core
                    .counters
                    .latency
                    .write
                    .record(took + started.elapsed());
                Ok(())
            }
        }
    }
}

impl RecordSlot<'_> {
    /// The async form of [`RecordSlot::commit`]: an owned slot is written with
    /// [`SpillWriter::write_async`]; an in-place one never waits.
    pub async fn commit_async(self) -> Result<()> {
        match self.kind {
            SlotKind::Owned(b) => self.w.write_async(b.freeze()).await,
            kind @ SlotKind::InPlace { .. } => RecordSlot { w: self.w, kind }.commit(),
        }
    }
}

impl std::ops::Deref for RecordSlot<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.kind {
            SlotKind::Owned(b) => b,
            SlotKind::InPlace { at, len, .. } => match self.w.blocks.staging.as_ref() {
                Some(buf) => &buf.filled_to(at + FRAME_LEN + len)[at + FRAME_LEN..],
                None => &[],
            },
        }
    }
}

impl std::ops::DerefMut for RecordSlot<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.kind {
            SlotKind::Owned(b) => b,
            SlotKind::InPlace { at, len, .. } => match self.w.blocks.staging.as_mut() {
                Some(buf) => &mut buf.space()[*at + FRAME_LEN..*at + FRAME_LEN + *len],
                None => &mut [],
            },
        }
    }
}

impl SpillWriter {
    fn owned_slot(&mut self, len: usize) -> RecordSlot<'_> {
        RecordSlot {
            w: self,
            kind: SlotKind::Owned(bytes::BytesMut::zeroed(len)),
        }
    }

    /// Makes room for an in-place slot of `need` bytes: the segment planned (a rotation if
    /// needed), a staging buffer with too little room written out. `false`: the slot must be
    /// an owned buffer (direct mode keeps its writes aligned, so only a full buffer is written
    /// mid-segment).
    fn poll_room(&mut self, need: usize, wait: &mut Wait<'_, '_>) -> Poll<Result<bool>> {
        ready_ok!(self.plan((need + BLOCK_HEADER_LEN) as u64, wait));
        let need = need
            + if self.blocks.block_open() {
                0
            } else {
                BLOCK_HEADER_LEN
            };
        if self.blocks.staging.is_some() && self.blocks.room() < need {
            if self.ctx.direct {
                return Poll::Ready(Ok(false));
            }
            ready_ok!(self.flush_staging(wait, false));
        }
        Poll::Ready(Ok(true))
    }

    /// The slot in the staging buffer, taking a buffer if the writer has none.
    /// `in_poll`: called from `record_async`'s poll, which must not block: a buffer that would
    /// have to be mapped (an `mmap`, waiting for the process's mmap lock) or a busy pool lock
    /// makes the record an owned slot instead, whose `commit_async` maps off the thread.
    fn in_place_slot(
        &mut self,
        len: usize,
        started: Instant,
        in_poll: bool,
    ) -> Result<RecordSlot<'_>> {
        if self.blocks.staging.is_none() {
            // Under the buffer budget without waiting: a buffer too small, or none free, and
            // the record is an owned slot, whose commit waits (or fails) like a write.
            let pool = self.ctx.core.io.pool();
            let need = BLOCK_HEADER_LEN + FRAME_LEN + len;
            let got = if in_poll {
                match pool.try_take_now(need) {
                    Some(Ok(Taken::Free(b))) => Ok(b),
                    // Dropping the mapping gives its bytes back to the budget.
                    Some(Ok(Taken::Map(_))) | None => return Ok(self.owned_slot(len)),
                    Some(Err(e)) => Err(e),
                }
            } else {
                pool.try_get(need)
            };
            match got {
                Ok(b) if b.remaining() >= BLOCK_HEADER_LEN + FRAME_LEN + len => {
                    self.blocks.staging = Some(b)
                }
                Ok(_) | Err(NoBuffer::Wait { .. } | NoBuffer::Exhausted { .. }) => {
                    return Ok(self.owned_slot(len));
                }
                Err(NoBuffer::Io(e)) => {
                    return Err(self.fail(SpillError::io("allocate buffer", "", e)));
                }
            }
        }
        self.blocks.open_block();
        let at = self.blocks.staged();
        Ok(RecordSlot {
            w: self,
            kind: SlotKind::InPlace {
                at,
                len,
                took: started.elapsed(),
            },
        })
    }

    /// The async form of [`SpillWriter::record`]: a rotation runs on the engine's offload
    /// pool and a full in-flight budget is awaited, never blocking the thread. Commit the slot
    /// with [`RecordSlot::commit_async`] (an owned slot's write may rotate too). Dropping the
    /// future while it waits for a rotation poisons the writer, like a dropped `write_async`.
    pub async fn record_async(&mut self, len: usize) -> Result<RecordSlot<'_>> {
        let started = Instant::now();
        self.check_open()?;
        check_len(len)?;
        let need = FRAME_LEN + len;
        if need + BLOCK_HEADER_LEN + segment::HEADER_LEN > self.ctx.core.io.pool().buffer_capacity()
        {
            return Ok(self.owned_slot(len));
        }
        let r = self
            .run_async(None, |w, wait| w.poll_room(need, wait))
            .await;
        if !self.conclude_async(r).await? {
            return Ok(self.owned_slot(len));
        }
        self.in_place_slot(len, started, true)
    }

    /// A slot of `len` bytes for the caller to fill in place (serialise a row batch straight
    /// into the engine's buffer), then [`RecordSlot::commit`]. Records that fit a staging
    /// buffer are written with no copy at all; larger ones (and, in direct mode, one that
    /// does not fit the aligned buffer's remaining room) get an owned buffer instead. Blocks,
    /// like `write`, only while the in-flight budget is full.
    pub fn record(&mut self, len: usize) -> Result<RecordSlot<'_>> {
        let started = Instant::now();
        self.check_open()?;
        check_len(len)?;
        let need = FRAME_LEN + len;
        let cap = self.ctx.core.io.pool().buffer_capacity();
        if need + BLOCK_HEADER_LEN + segment::HEADER_LEN > cap {
            return Ok(self.owned_slot(len));
        }
        let r = drive(|w| self.poll_room(need, w));
        if !self.conclude(r)? {
            return Ok(self.owned_slot(len));
        }
        self.in_place_slot(len, started, false)
    }
}
