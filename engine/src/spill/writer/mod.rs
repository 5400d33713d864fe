//! Stage 1: the writer. Frames records into rotating segment files, write-behind.
//!
//! `write` copies small records into a staging buffer and returns; a full buffer becomes one
//! write on an I/O thread. In buffered mode, records of at least `large_record_threshold` go
//! out without a copy (a vectored write of frame header + payload). `write` blocks only when
//! `queue_depth` writes of this writer are in flight.
//!
//! The abort protocol (invariant 2 in ARCHITECTURE.md) is explained in `hook.rs`: the scope's abort hook
//! and the writer's check under the file-list lock after every file creation give every file
//! exactly one deleter.
//!
//! The parts: `hook.rs` (what other threads touch: the file list and its abort protocol, the
//! abort hook, in-flight accounting), `place.rs` (records into the staging buffer or vectored
//! writes, flushes, in-flight waits, seals), `rotate.rs` (opening the next segment, trimming
//! at `finish`), `slot.rs` (records filled in place).

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::cleanup::delete_segments;
use crate::config::WriteMode;
use crate::core::Core;
use crate::error::{Result, SpillError};
use crate::fault::{self, FaultPoint};
use crate::format::segment::MAX_RECORD;
use crate::io::{IoBuf, Offloaded};
use crate::metrics::Counters;
use crate::spill::state::SpilledState;
use crate::spill::task::TaskShared;

/// `?` for `Poll<Result<T>>`: returns `Pending` and errors, yields the value.
macro_rules! ready_ok {
    ($e:expr) => {
        match $e {
            Poll::Ready(Ok(v)) => v,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
    };
}

mod hook;
mod place;
mod reopen;
mod rotate;
mod slot;

pub use slot::RecordSlot;

use hook::WriterShared;
use place::Placing;
use rotate::{OpenSegment, Opened, trim_allocations};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Open,
    Failed,
    Finished,
}

/// Stage 1 of a spill: writes records into rotating segment files. See the module docs.
///
/// Any error deletes everything the writer created; dropping an unfinished writer does too.
pub struct SpillWriter {
    task: Arc<TaskShared>,
    core: Arc<Core>,
    shared: Arc<WriterShared>,
    hook_id: u64,
    lane: usize,
    seg: Option<OpenSegment>,
    staging: Option<IoBuf>,
    placing: Option<Placing>,
    /// An async rotation running on the offload pool (see `rotate.rs`).
    opening: Option<Offloaded<Result<Opened>>>,
    /// An async allocation step of the open segment running on the offload pool (`rotate.rs`).
    growing: Option<Offloaded<std::io::Result<u64>>>,
    life: Life,
    segment_size: u64,
    direct: bool,
    large: usize,
    queue_depth: usize,
}

impl std::fmt::Debug for SpillWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillWriter")
            .field("task", &self.task.id)
            .field("life", &self.life)
            .finish()
    }
}

/// How a step waits for a free in-flight slot.
enum Wait<'a, 'b> {
    Block,
    Async(&'a mut Context<'b>),
}

/// The result of a poll made with [`Wait::Block`], which never returns `Pending`.
fn blocking<T>(p: Poll<Result<T>>) -> Result<T> {
    match p {
        Poll::Ready(r) => r,
        Poll::Pending => Err(SpillError::WriterFailed),
    }
}

impl SpillWriter {
    pub(crate) fn new(task: Arc<TaskShared>) -> Result<Self> {
        let core = task.core().clone();
        let lane = core.io.pick_lane();
        let shared = Arc::new(WriterShared::new(core.clone(), lane));
        let hook_id = task
            .register(shared.clone())
            .map_err(|_| SpillError::Closed { what: "task scope" })?;
        let cfg = &core.cfg;
        Ok(SpillWriter {
            segment_size: cfg.segment_size,
            direct: cfg.mode == WriteMode::Direct,
            large: cfg.large_record_threshold,
            queue_depth: cfg.queue_depth,
            task,
            shared,
            hook_id,
            lane,
            seg: None,
            staging: None,
            placing: None,
            opening: None,
            growing: None,
            life: Life::Open,
            core,
        })
    }

    /// Queues one record. Returns once it is copied to a staging buffer or handed to an I/O
    /// thread; blocks only while `queue_depth` writes of this writer are in flight. A failure
    /// of an earlier write may be reported here.
    ///
    /// `LedgerFull`, `QuotaExceeded`, `RecordTooLarge` and `TooManyOpenFiles` leave the writer
    /// usable: the record was not written, everything before it is intact, and the call can be
    /// retried. Any other error deletes everything the writer created.
    pub fn write(&mut self, record: Bytes) -> Result<()> {
        self.begin(record)?;
        let r = self.step(&mut Wait::Block);
        self.settle(blocking(r))
    }

    /// Copies `record` and queues it, like [`SpillWriter::write`], for callers holding a slice.
    /// Small records are copied once, straight into a staging buffer.
    pub fn write_slice(&mut self, record: &[u8]) -> Result<()> {
        if !self.direct && record.len() >= self.large {
            return self.write(Bytes::copy_from_slice(record));
        }
        self.check_open()?;
        check_len(record.len())?;
        let r = self.place_slice(record);
        self.settle(r)
    }

    /// The async form of [`SpillWriter::write`]: waits for in-flight budget without blocking
    /// the thread, on any runtime. If the future is dropped before it completes, the writer
    /// fails (and deletes its files) on its next use, since a record may be half placed.
    pub async fn write_async(&mut self, record: Bytes) -> Result<()> {
        self.begin(record)?;
        let r = poll_fn(|cx| self.step(&mut Wait::Async(cx))).await;
        self.settle(r)
    }

    /// Waits for every write in flight, seals the last segment, and hands the files to a
    /// [`SpilledState`], registered with the task scope in place of this writer. On a scope
    /// closed meanwhile, the files are deleted and the result is `Aborted`.
    pub fn finish(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let r = blocking(self.seal_with(&mut Wait::Block, true)).and_then(|()| self.wait_drained());
        self.settle(r)?;
        trim_allocations(&self.core, &self.shared, self.direct);
        self.hand_off()
    }

    /// The async form of [`SpillWriter::finish`]. Trimming the preallocated tails (an open
    /// and an `ftruncate` per segment) runs on the engine's offload pool, not in a poll.
    pub async fn finish_async(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let r = poll_fn(|cx| {
            let mut w = Wait::Async(cx);
            ready_ok!(self.seal_with(&mut w, true));
            self.poll_drained(&mut w)
        })
        .await;
        self.settle(r)?;
        if rotate::needs_trim(&self.shared) {
            let (core, shared, direct) = (self.core.clone(), self.shared.clone(), self.direct);
            let mut job = self
                .core
                .io
                .offload()
                .run(move || trim_allocations(&core, &shared, direct));
            poll_fn(|cx| job.poll(cx)).await;
        }
        self.hand_off()
    }

    /// Segment files this writer has created so far.
    pub fn segments(&self) -> usize {
        self.shared.files.lock().entries.len()
    }

    fn check_open(&mut self) -> Result<()> {
        if self.life != Life::Open {
            return Err(SpillError::WriterFailed);
        }
        if self.shared.files.is_aborted() {
            return Err(self.observe_abort());
        }
        if self.placing.is_some() || self.opening.is_some() || self.growing.is_some() {
            // A write_async future was dropped half way: the stream may hold a torn record.
            // (Or an async call was dropped while its rotation ran on the offload pool: the
            // segment it records is not this writer's open one.)
            return Err(self.fail(SpillError::WriterFailed));
        }
        Ok(())
    }

    fn begin(&mut self, rec: Bytes) -> Result<()> {
        self.check_open()?;
        check_len(rec.len())?;
        let vectored = !self.direct && rec.len() >= self.large;
        self.placing = Some(Placing::new(rec, vectored));
        Ok(())
    }

    /// Routes an error: admission refusals leave the writer open; an abort is observed; any
    /// other error fails the writer and deletes its files. The first error is what the caller
    /// gets.
    fn settle<T>(&mut self, r: Result<T>) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(
                e @ (SpillError::LedgerFull { .. }
                | SpillError::QuotaExceeded { .. }
                | SpillError::RecordTooLarge { .. }
                | SpillError::TooManyOpenFiles { .. }),
            ) => {
                self.placing = None;
                Err(e)
            }
            Err(SpillError::Aborted) => Err(self.observe_abort()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Hands the files to a new `SpilledState` registered in this writer's place.
    fn hand_off(mut self) -> Result<SpilledState> {
        let Some(entries) = self.shared.files.take_for_hand_off() else {
            return Err(self.observe_abort());
        };
        self.life = Life::Finished;
        let task_plan = self.task.fault_plan();
        let _ = fault::check2(
            task_plan.as_ref(),
            &self.core.fault,
            FaultPoint::WriterHandOff,
        );
        let r = SpilledState::register(self.task.clone(), self.lane, entries, |m| {
            self.task.replace(self.hook_id, m)
        });
        if r.is_err() {
            Counters::add(&self.core.counters.aborts_observed, 1);
        }
        r
    }

    /// The scope was closed: the hook deleted the files. Drop what this writer holds.
    fn observe_abort(&mut self) -> SpillError {
        if self.life == Life::Open {
            Counters::add(&self.core.counters.aborts_observed, 1);
        }
        self.life = Life::Failed;
        self.release_io();
        self.task.unregister(self.hook_id);
        SpillError::Aborted
    }

    /// Fails the writer: deletes everything it created (queued, never on this thread), drops
    /// its buffers and files, and returns `err` (the primary error wins over any cleanup
    /// failure, which goes to metrics, logs and the cleanup worker).
    fn fail(&mut self, err: SpillError) -> SpillError {
        self.life = Life::Failed;
        self.release_io();
        self.delete_own_files();
        self.task.unregister(self.hook_id);
        err
    }

    fn delete_own_files(&self) {
        let Some(entries) = self.shared.files.take_own() else {
            return;
        };
        delete_segments(&self.core, self.lane, entries);
    }

    fn release_io(&mut self) {
        self.placing = None;
        self.opening = None;
        self.growing = None;
        self.staging = None;
        self.seg = None;
    }
}

fn check_len(len: usize) -> Result<()> {
    if len as u64 > MAX_RECORD {
        return Err(SpillError::RecordTooLarge {
            len: len as u64,
            max: MAX_RECORD,
        });
    }
    Ok(())
}

impl Drop for SpillWriter {
    fn drop(&mut self) {
        if self.life == Life::Open {
            // Abandoned: delete everything it created. In-flight writes own their buffers and
            // files and finish on their own.
            self.life = Life::Failed;
            self.release_io();
            self.delete_own_files();
            self.task.unregister(self.hook_id);
        }
    }
}
