//! The codec stage: a writer's blocks compressed off its thread, on the codec pool
//! (`io/compress.rs`), in parallel with the producer, and written strictly in order.
//!
//! A block's seal binds its file offset (into its checksum and its encryption nonce), and a
//! buffer's offset is where the one before it ends once compressed. So a writer with a codec
//! queues a full buffer unsealed: its block closed and its codec picked (`Blocks::close`;
//! `Auto`'s trial on a sample stays on the writer's thread), the buffer handed to the codec
//! pool (or straight into its slot when nothing is to be compressed) while the producer fills
//! another. At its next flush or wait the writer takes back, in order, each buffer whose
//! compression is done, seals it at the segment's exact length (`seal_closed`: checksum,
//! encryption, padding), makes the allocation step it needs, and submits it. Queued buffers
//! count in `queue_depth` with the writes in flight, and come from the same buffer budget.
//!
//! Planning uses an upper bound for what is queued, each buffer's raw length (padded in direct
//! mode): [`SpillWriter::offset`]. Where an exact offset is needed (a rotation or a seal, a
//! record that is a block of its own, a vectored write, `finish`), the stage is emptied first
//! (`Until::Written`); where the bound says a record would pass the segment's end, the writer
//! waits for the queued buffers' compressions until it fits or none is left (`Until::Fits`),
//! so segments stay full. A writer waits for a compression as it waits for a write: blocking on
//! its tracker's condvar, or (async) returning `Pending`, woken by the codec thread. A writer
//! that fails, is cancelled or dropped gives its stage up ([`SpillWriter::close_stage`]): the
//! buffers back go to the buffer pool, those still compressing go there when they come back,
//! and nothing of them is written. Without a codec nothing goes through the stage.

use std::task::Poll;
use std::time::Instant;

use super::block::{Closed, seal_closed};
use super::{SpillWriter, Wait};
use crate::config::Compression;
use crate::error::{Result, SpillError};
use crate::format::block::Codec;
use crate::io::Compress;

/// A buffer of the codec stage (in the tracker's slots, `hook.rs`).
pub(super) struct Queued {
    /// The block closed in it, sealed when it is written (none: a buffer of a segment header
    /// or a large record's tail alone).
    pub(super) block: Option<Closed>,
    /// Padded to `DIRECT_ALIGN` when written.
    pub(super) pad: bool,
    /// The segment's last write.
    pub(super) last: bool,
    /// The most it can take in the file: its raw length, padded.
    pub(super) bound: u64,
    /// The buffer, once its compression is done (at once when none is to be done).
    pub(super) done: Option<Compress>,
}

/// The writer's side of its codec stage: the numbers of the next buffer queued and of the
/// next to write, and the upper bound of what is queued.
#[derive(Debug, Default)]
pub(super) struct Stage {
    next: u64,
    head: u64,
    bound: u64,
}

impl Stage {
    /// Buffers queued and not yet written.
    pub(super) fn queued(&self) -> usize {
        (self.next - self.head) as usize
    }

    /// The most the queued buffers can take in the file.
    pub(super) fn bound(&self) -> u64 {
        self.bound
    }
}

/// What [`SpillWriter::poll_until`] waits for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Until {
    /// Fewer than this many writes in flight and buffers queued.
    Below(usize),
    /// Every queued buffer written: the segment's length is exact. `inline`: the last one may
    /// run on this thread when nothing else is in flight (a blocking `finish`).
    Written { inline: bool },
    /// This many more bytes fit the segment by [`SpillWriter::offset`], or every queued
    /// buffer is written (its bound falls as each is written at its compressed length).
    Fits(u64),
}

impl SpillWriter {
    /// True when the writer's buffers go through the codec stage: it has a codec.
    pub(super) fn has_codec(&self) -> bool {
        !matches!(self.blocks.codec.mode, Compression::None)
    }

    /// Queues the staging buffer in the codec stage: its block closed (its codec picked), then
    /// handed to the codec pool, or into its slot at once when nothing is to be compressed.
    /// The caller made room for it (`Until::Below`).
    pub(super) fn enqueue(&mut self, pad: bool, last: bool) {
        let block = self.blocks.close(&self.ctx.core);
        let Some(buf) = self.blocks.staging.take() else {
            return;
        };
        let bound = buf.write_len(pad) as u64;
        let seq = self.stage.next;
        self.stage.next += 1;
        self.stage.bound += bound;
        let (from, codec) = match &block {
            Some(c) if c.codec != Codec::Raw => (c.body(), c.codec),
            _ => (0, Codec::Raw),
        };
        let job = Compress {
            buf,
            from,
            codec,
            nanos: 0,
            seq,
        };
        let tracker = &self.ctx.shared.tracker;
        let mut s = tracker.st.lock();
        let depth = self.ctx.queue_depth;
        if s.stage.len() != depth {
            s.stage.resize_with(depth, || None);
        }
        let mut q = Queued {
            block,
            pad,
            last,
            bound,
            done: None,
        };
        if codec == Codec::Raw {
            q.done = Some(job);
            s.stage[seq as usize % depth] = Some(q);
            return;
        }
        s.stage[seq as usize % depth] = Some(q);
        s.compressing += 1;
        drop(s);
        self.ctx.core.io.codec().compress(job, tracker.clone());
    }

    /// Writes the stage's buffers whose compression is done, in order, up to the first still
    /// compressing: each sealed at the segment's length, its allocation step made, submitted
    /// (the last on this thread, with `inline`, when it is the last queued and nothing is in
    /// flight). A `Pending` step leaves the buffer in its slot for the next poll.
    pub(super) fn poll_stage_ready(
        &mut self,
        wait: &mut Wait<'_, '_>,
        inline: bool,
    ) -> Poll<Result<()>> {
        let depth = self.ctx.queue_depth;
        while self.stage.queued() > 0 {
            let slot = self.stage.head as usize % depth;
            let peek = {
                let s = self.ctx.shared.tracker.st.lock();
                s.stage[slot].as_ref().and_then(|q| {
                    let d = q.done.as_ref()?;
                    Some((d.buf.write_len(q.pad) as u64, q.last))
                })
            };
            let (Some((len, last)), Some(seg)) = (peek, self.seg.as_ref()) else {
                break;
            };
            ready_ok!(self.poll_allocated(seg.written + len, last, wait));
            let file = ready_ok!(self.poll_file(wait));
            let taken = self.ctx.shared.tracker.st.lock().stage[slot].take();
            let (Some(q), Some(seg)) = (taken, self.seg.as_ref()) else {
                break;
            };
            let Some(done) = q.done else {
                break;
            };
            self.stage.head += 1;
            self.stage.bound -= q.bound;
            let mut buf = done.buf;
            if let Some(c) = &q.block {
                let stored = (done.codec, done.nanos);
                let codec = &mut self.blocks.codec;
                seal_closed(&self.ctx.core, codec, &mut buf, c, stored, seg.at(), q.pad);
            }
            let inline = inline && self.stage.queued() == 0;
            let pad_end = q.pad && q.block.is_none();
            ready_ok!(self.write_buffer(buf, file, pad_end, inline, wait));
        }
        Poll::Ready(Ok(()))
    }

    /// Waits until `until` holds: writes the stage's buffers as their compressions come back,
    /// and waits for a compression or a write (blocking, or `Pending` with the waker parked);
    /// an abort or an earlier write's failure ends the wait.
    pub(super) fn poll_until(&mut self, until: Until, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        loop {
            let inline = matches!(until, Until::Written { inline: true });
            ready_ok!(self.poll_stage_ready(wait, inline));
            let (queued, offset) = (self.stage.queued(), self.offset());
            let depth = self.ctx.queue_depth;
            let tracker = &self.ctx.shared.tracker;
            let mut s = tracker.st.lock();
            let codec = &mut self.blocks.codec;
            if self.ctx.shared.files.is_aborted() {
                return Poll::Ready(Err(SpillError::Aborted));
            }
            if let Some((idx, e)) = s.error.take() {
                drop(s);
                return Poll::Ready(Err(self.write_error(idx, e)));
            }
            codec.completed = s.completed;
            let reached = match until {
                Until::Below(limit) => s.inflight + queued < limit,
                Until::Written { .. } => queued == 0,
                Until::Fits(need) => queued == 0 || offset + need <= self.ctx.segment_size,
            };
            if reached {
                if let Some((t, stalled)) = codec.pending_since.take() {
                    codec.waited(t, stalled);
                }
                return Poll::Ready(Ok(()));
            }
            // What holds the writer back: the stage's head still compressing, else a write.
            let stalled = match s.stage.get(self.stage.head as usize % depth) {
                Some(Some(q)) if queued > 0 => {
                    if q.done.is_some() {
                        // Back since this poll looked: write it first.
                        continue;
                    }
                    true
                }
                _ => false,
            };
            match wait {
                Wait::Block => {
                    let t = Instant::now();
                    tracker.cv.wait(&mut s);
                    codec.waited(t, stalled);
                }
                Wait::Async(cx, _) => {
                    s.waker = Some(cx.waker().clone());
                    codec
                        .pending_since
                        .get_or_insert_with(|| (Instant::now(), stalled));
                    return Poll::Pending;
                }
            }
        }
    }

    /// Writes every buffer queued in the codec stage, waiting for their compressions: the
    /// segment's length ([`SpillWriter::offset`]) is exact after. `inline`: see
    /// [`Until::Written`].
    pub(super) fn poll_written(
        &mut self,
        inline: bool,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        if self.stage.queued() == 0 {
            return Poll::Ready(Ok(()));
        }
        self.poll_until(Until::Written { inline }, wait)
    }

    /// Gives the codec stage up (the writer failed, was cancelled or dropped): its buffers go
    /// back to the buffer pool, now or as their compressions come back, and none is written.
    pub(super) fn close_stage(&mut self) {
        if self.stage.queued() == 0 {
            return;
        }
        let mut s = self.ctx.shared.tracker.st.lock();
        s.closed = true;
        s.stage.iter_mut().for_each(|q| *q = None);
        self.stage = Stage::default();
    }
}
