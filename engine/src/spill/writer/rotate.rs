//! Rotation: when a writer opens its next segment (at need, or ahead of need on the offload
//! pool), and how an opened segment starts. Making the segment's file is `segfile.rs`'s.

use std::task::Poll;

use super::segfile::{Opened, SegFile};
use super::sink::OpenSegment;
use super::step::Step;
use super::{SpillWriter, Wait};
use crate::cleanup::recycle;
use crate::config::DIRECT_ALIGN;
use crate::error::Result;
use crate::format::segment::{self, HEADER_LEN};
use crate::io::{IoBuf, Offloaded};
use crate::metrics::Counters;

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
