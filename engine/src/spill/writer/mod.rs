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
//! The parts: `block.rs` (the block builder: the staging buffer, framing, seals; no I/O),
//! `sink.rs` (the segment sink: the open segment, buffers taken and written, writes in flight
//! waited for, a segment sealed), `stage.rs` (the codec stage: blocks compressed off the
//! writer's thread, written in order), `step.rs` (the steps that may block, as one enum, and the
//! one helper that runs them: inline for a blocking call, on the offload pool for an async
//! one), `place.rs` (one record through them), `hook.rs` (what other threads touch: the file
//! list and its abort protocol, the abort hook, in-flight accounting), `rotate.rs` (when
//! the next segment opens), `segfile.rs` (its file made, allocated in steps, trimmed at
//! `finish`), `codec.rs`
//! (`Auto`'s policy), `slot.rs` (records filled in place), `stream.rs` (a byte stream cut
//! into records: `append`, `std::io::Write`).

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use crate::cleanup::delete_segments;
use crate::config::WriteMode;
use crate::error::{Result, SpillError};
use crate::fault::fault_point;
use crate::format::segment::MAX_RECORD;
use crate::metrics::Counters;
use crate::shared::EngineShared;
use crate::spill::budget::Budget;
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

mod block;
mod codec;
mod hook;
mod place;
mod rotate;
mod segfile;
mod sink;
mod slot;
mod stage;
mod step;
mod stream;

pub use slot::RecordSlot;

use block::Blocks;
use hook::{Tracker, WriterShared};
use place::PendingRecord;
use rotate::Ahead;
use sink::OpenSegment;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Open,
    /// An async call is under way: `write_async` (a record may be half placed), or a step on
    /// the offload pool (`step.rs`). A future dropped then leaves the writer so.
    Busy,
    /// An error other than an abort failed it (the error was returned then).
    Failed,
    /// Its scope closed it and deleted its files (`Aborted` was returned).
    Aborted,
    /// A `write_async` future was dropped half way (`WriteFutureDropped` was returned).
    Poisoned,
    Finished,
}

impl Life {
    /// Open to calls (a `Busy` writer is failed by the next one).
    fn is_live(self) -> bool {
        matches!(self, Life::Open | Life::Busy)
    }
}

/// Stage 1 of a spill: writes records into rotating segment files. See the module docs.
///
/// Any error deletes everything the writer created; dropping an unfinished writer does too.
/// The exceptions are the refusals that leave it usable (`LedgerFull`, `QuotaExceeded`,
/// `WriterCannotFit`, `TooManyOpenFiles`, `RecordTooLarge`), and a cancel of its scope
/// (`Aborted`, from then on on every call).
///
/// ```
/// use spillring::{Bytes, Engine, EngineConfig};
/// # fn main() -> spillring::Result<()> {
/// # let root = std::env::temp_dir().join(format!("spillring-doc-writer-{}", std::process::id()));
/// # let engine = Engine::open(EngineConfig::new(&root))?;
/// let task = engine.task("t")?;
/// let mut w = task.writer()?;
/// w.write(Bytes::from(vec![1u8; 1000]))?; // an owned buffer: no copy for large records
/// w.write_slice(b"borrowed bytes")?; // copied once into the staging buffer
/// let mut slot = w.record(8)?; // serialise in place
/// slot.copy_from_slice(&42u64.to_le_bytes());
/// slot.commit()?;
/// w.write_all(["a", "b", "c"])?; // any iterator of Into<Bytes>
/// assert_eq!((w.records(), w.bytes_written()), (6, 1000 + 14 + 8 + 3));
/// let state = w.finish()?;
/// assert_eq!(state.records(), 6);
/// # drop((state, task, engine));
/// # let _ = std::fs::remove_dir(&root);
/// # Ok(()) }
/// ```
pub struct SpillWriter {
    /// What the writer holds of the engine, its scope and its configuration.
    ctx: Ctx,
    /// The block builder: the staging buffer and the codec (`block.rs`; no I/O).
    blocks: Blocks,
    /// The segment sink: the segment being written, if one is open (`sink.rs`).
    seg: Option<OpenSegment>,
    /// The buffers queued in the codec stage, compressed off this thread (`stage.rs`).
    stage: stage::Stage,
    /// The next segment, opened ahead of need (`rotate.rs`).
    ahead: Ahead,
    life: Life,
    counts: Counts,
    /// The work its async calls may do before one yields (`spill/budget.rs`), from the first.
    budget: Option<Budget>,
}

/// What a writer holds of the engine, its scope and its configuration: also what a step
/// running on the offload pool needs of it (shared handles only: cloned into the step).
#[derive(Clone)]
struct Ctx {
    core: Arc<EngineShared>,
    task: Arc<TaskShared>,
    shared: Arc<WriterShared>,
    /// The writer's id in its scope's registry.
    hook_id: u64,
    lane: usize,
    /// The writer's `tracing` span (debug level, under its task's): segments, bytes, outcome.
    span: tracing::Span,
    direct: bool,
    segment_size: u64,
    large: usize,
    queue_depth: usize,
}

/// Records accepted so far, and their payload bytes (frames excluded).
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    records: u64,
    bytes: u64,
    /// Segments opened (created or reused), for the span at close.
    segments: u64,
}

impl std::fmt::Debug for SpillWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillWriter")
            .field("task", &self.ctx.task.id)
            .field("life", &self.life)
            .finish()
    }
}

/// How a call waits: a blocking call on its own thread; an async one by returning `Pending`,
/// the step it runs on the offload pool (`step.rs`) kept with its future.
enum Wait<'a, 'b> {
    Block,
    Async(&'a mut Context<'b>, &'a mut Option<step::Running>),
}

/// Runs a poll with [`Wait::Block`] to its end. Such a poll blocks where an async one would
/// return `Pending`, so the loop turns once.
fn drive<T>(mut poll: impl FnMut(&mut Wait<'_, '_>) -> Poll<Result<T>>) -> Result<T> {
    loop {
        if let Poll::Ready(r) = poll(&mut Wait::Block) {
            return r;
        }
    }
}

impl SpillWriter {
    pub(crate) fn new(task: Arc<TaskShared>) -> Result<Self> {
        let core = task.core().clone();
        let lane = core.io.pick_lane();
        let shared = WriterShared::make(&core, lane);
        let hook_id = task
            .register(shared.clone())
            .map_err(|_| task.closed_error())?;
        let cfg = &core.cfg;
        let span = tracing::debug_span!(parent: &task.span, "spillring.writer",
            segments = tracing::field::Empty, records = tracing::field::Empty,
            bytes = tracing::field::Empty, outcome = tracing::field::Empty);
        Ok(SpillWriter {
            blocks: Blocks::new(cfg.compression, cfg.queue_depth),
            ctx: Ctx {
                segment_size: cfg.segment_size,
                direct: cfg.mode == WriteMode::Direct,
                large: cfg.large_record_threshold,
                queue_depth: cfg.queue_depth,
                task,
                shared,
                hook_id,
                lane,
                span,
                core,
            },
            counts: Counts::default(),
            budget: None,
            seg: None,
            stage: stage::Stage::default(),
            ahead: Ahead::None,
            life: Life::Open,
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
        let started = Instant::now();
        let r = self.write_untimed(record);
        self.ctx.core.counters.latency.write.record_since(started);
        r
    }

    fn write_untimed(&mut self, record: Bytes) -> Result<()> {
        let mut p = self.begin(record)?;
        let r = drive(|w| self.place(&mut p, w));
        self.conclude(r)
    }

    /// Copies `record` and queues it, like [`SpillWriter::write`], for callers holding a slice.
    /// Small records are copied once, straight into a staging buffer.
    pub fn write_slice(&mut self, record: &[u8]) -> Result<()> {
        if !self.ctx.direct && record.len() >= self.ctx.large {
            return self.write(Bytes::copy_from_slice(record));
        }
        let started = Instant::now();
        let r = self.write_slice_untimed(record);
        self.ctx.core.counters.latency.write.record_since(started);
        r
    }

    fn write_slice_untimed(&mut self, record: &[u8]) -> Result<()> {
        self.check_open()?;
        check_len(record.len())?;
        let r = self.place_slice(record);
        self.conclude(r)
    }

    /// The async form of [`SpillWriter::write`]: waits for in-flight budget without blocking
    /// the thread, on any runtime. If the future is dropped before it completes, the writer
    /// fails (and deletes its files) on its next use, since a record may be half placed.
    pub async fn write_async(&mut self, record: Bytes) -> Result<()> {
        let started = Instant::now();
        let len = record.len();
        let mut p = self.begin(record)?;
        // A future dropped once it starts placing leaves the writer `Busy`: its next call
        // fails it.
        let r = self
            .run_async(Some(len), |w, wait| w.place(&mut p, wait))
            .await;
        let r = self.conclude_async(r).await;
        self.ctx.core.counters.latency.write.record_since(started);
        r
    }

    /// Waits for every write in flight, seals the last segment, and hands the files to a
    /// [`SpilledState`], registered with the task scope in place of this writer. On a scope
    /// closed meanwhile, the files are deleted and the result is `Aborted`.
    pub fn finish(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let started = Instant::now();
        let core = self.ctx.core.clone();
        let r = self.finish_sealed();
        core.counters.latency.finish.record_since(started);
        r
    }

    fn finish_sealed(mut self) -> Result<SpilledState> {
        let r = drive(|w| self.poll_finished(w, &mut false));
        self.conclude(r)?;
        self.hand_off()
    }

    /// The async form of [`SpillWriter::finish`]. Trimming the preallocated tails (an open
    /// and an `ftruncate` per segment) runs on the engine's offload pool, not in a poll.
    pub async fn finish_async(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let started = Instant::now();
        let core = self.ctx.core.clone();
        let r = self.finish_async_sealed().await;
        core.counters.latency.finish.record_since(started);
        r
    }

    async fn finish_async_sealed(mut self) -> Result<SpilledState> {
        let mut trimmed = false;
        let r = self
            .run_async(None, |w, wait| w.poll_finished(wait, &mut trimmed))
            .await;
        self.conclude_async(r).await?;
        self.hand_off()
    }

    /// `finish`'s work: the last segment sealed, every write of the writer completed, then the
    /// preallocated tails given back (a step, taken once: `trimmed`).
    fn poll_finished(&mut self, wait: &mut Wait<'_, '_>, trimmed: &mut bool) -> Poll<Result<()>> {
        std::task::ready!(self.poll_ahead_given_back(wait));
        ready_ok!(self.seal_with(wait, true));
        ready_ok!(self.poll_drained(wait));
        if std::mem::replace(trimmed, true) || !segfile::needs_trim(&self.ctx.shared) {
            return Poll::Ready(Ok(()));
        }
        self.run_step(step::Step::Trim(self.ctx.clone()), wait)
    }

    /// Segments this writer has written to so far (a segment opened ahead of need counts from
    /// its first record).
    pub fn segments(&self) -> usize {
        self.counts.segments as usize
    }

    /// Segment files in the writer's list, each holding a ticket (a segment opened ahead of
    /// need included).
    fn files(&self) -> usize {
        self.ctx.shared.files.lock().entries.len()
    }

    /// Records this writer accepted so far (`write`, `write_slice`, committed slots). After
    /// an error from [`SpillWriter::write_all`], the records that went in before it.
    pub fn records(&self) -> u64 {
        self.counts.records
    }

    /// Payload bytes of the records this writer accepted so far (framing and segment headers
    /// excluded: [`SpilledState::bytes`] counts the files).
    pub fn bytes_written(&self) -> u64 {
        self.counts.bytes
    }

    /// Queues every record of `records` in order, like [`SpillWriter::write`] for each (so it
    /// blocks only while the in-flight budget is full), and stops at the first error, which
    /// it returns. [`SpillWriter::records`] then says how many went in: with an error that
    /// leaves the writer usable (`LedgerFull`, `QuotaExceeded`, `TooManyOpenFiles`,
    /// `RecordTooLarge`) the caller can retry from that record; after `WriterCannotFit` it
    /// can `finish` what went in.
    ///
    /// ```no_run
    /// # fn f(task: &spillring::TaskSpill) -> spillring::Result<()> {
    /// let mut w = task.writer()?;
    /// w.write_all((0..1000u32).map(|i| i.to_le_bytes().to_vec()))?;
    /// assert_eq!(w.records(), 1000);
    /// let state = w.finish()?;
    /// assert_eq!(state.records(), 1000);
    /// # Ok(()) }
    /// ```
    pub fn write_all<I>(&mut self, records: I) -> Result<()>
    where
        I: IntoIterator,
        I::Item: Into<Bytes>,
    {
        for r in records {
            self.write(r.into())?;
        }
        Ok(())
    }

    /// The error for a call on a writer that is no longer open. On a cancelled scope every
    /// call says `Aborted`, whatever ended the writer first.
    fn ended_error(&self) -> SpillError {
        if self.ctx.task.is_cancelled() {
            return SpillError::Aborted;
        }
        match self.life {
            Life::Aborted => SpillError::Aborted,
            Life::Poisoned | Life::Busy => SpillError::WriteFutureDropped,
            Life::Open | Life::Failed | Life::Finished => SpillError::WriterFailed,
        }
    }

    /// [`SpillWriter::check_live`], and ends the byte stream's open record (`stream.rs`):
    /// every call but `append` places something after it, or seals it.
    fn check_open(&mut self) -> Result<()> {
        self.check_live()?;
        self.blocks.end_stream_record();
        Ok(())
    }

    fn check_live(&mut self) -> Result<()> {
        if !self.life.is_live() {
            return Err(self.ended_error());
        }
        if self.ctx.shared.files.is_aborted() {
            return Err(self.observe_abort());
        }
        if self.life == Life::Busy {
            // A write_async future was dropped half way: the stream may hold a torn record.
            // (Or an async call was dropped while its step ran on the offload pool: the
            // segment a rotation records is not this writer's open one.)
            let e = self.fail(SpillError::WriteFutureDropped);
            self.life = Life::Poisoned;
            return Err(e);
        }
        Ok(())
    }

    fn begin(&mut self, rec: Bytes) -> Result<PendingRecord> {
        self.check_open()?;
        check_len(rec.len())?;
        let vectored = !self.ctx.direct && rec.len() >= self.ctx.large;
        Ok(PendingRecord::new(rec, vectored))
    }

    /// [`SpillWriter::route`]; after a `StorageFull` failure, waits (bounded) until the
    /// writer's files are deleted and closed, so their space is back when the error returns.
    fn conclude<T>(&mut self, r: Result<T>) -> Result<T> {
        let (r, freeing) = self.route(r);
        if let Some(mark) = freeing {
            space_back(&self.ctx.core, &self.ctx.shared.tracker, mark);
        }
        r
    }

    /// [`SpillWriter::conclude`] for an async call: the wait runs on the offload pool. It is not
    /// a writer step (`step.rs`): the writer has failed, and nothing comes back to apply.
    async fn conclude_async<T>(&mut self, r: Result<T>) -> Result<T> {
        let (r, freeing) = self.route(r);
        if let Some(mark) = freeing {
            let core = self.ctx.core.clone();
            let tracker = self.ctx.shared.tracker.clone();
            let mut job = self.ctx.core.io.offload().run(move || {
                space_back(&core, &tracker, mark);
            });
            poll_fn(|cx| job.poll(cx)).await;
        }
        r
    }

    /// Routes an error: admission refusals leave the writer open; an abort is observed; any
    /// other error fails the writer and deletes its files. The first error is what the caller
    /// gets; with it, after a `StorageFull` failure, the delete mark its deletes complete at.
    fn route<T>(&mut self, r: Result<T>) -> (Result<T>, Option<u64>) {
        let routed = self.route_error(r);
        if let Err(e) = &routed.0 {
            self.ctx.core.counters.count_error(e);
        }
        routed
    }

    fn route_error<T>(&mut self, r: Result<T>) -> (Result<T>, Option<u64>) {
        match r {
            Ok(v) => (Ok(v), None),
            Err(
                e @ (SpillError::LedgerFull { .. }
                | SpillError::QuotaExceeded { .. }
                | SpillError::RecordTooLarge { .. }
                | SpillError::TooManyOpenFiles { .. }),
            ) => (Err(self.explain_admission(e)), None),
            Err(SpillError::Aborted) => (Err(self.observe_abort()), None),
            Err(e) => {
                let full = e.is_storage_full();
                let e = self.fail(e);
                // Taken after `fail` queued the deletes: the mark covers them.
                let mark = full.then(|| crate::cleanup::delete_mark(&self.ctx.core));
                (Err(e), mark)
            }
        }
    }

    /// [`segfile::explain_admission`] with what this writer holds.
    fn explain_admission(&self, e: SpillError) -> SpillError {
        segfile::explain_admission(e, self.files() as u64, || {
            let files = self.ctx.shared.files.lock();
            files.entries.iter().map(|e| e.reserved()).sum::<u64>()
        })
    }

    /// Hands the files to a new `SpilledState` registered in this writer's place.
    fn hand_off(mut self) -> Result<SpilledState> {
        let Some(entries) = self.ctx.shared.files.take_for_hand_off() else {
            return Err(self.observe_abort());
        };
        self.life = Life::Finished;
        fault_point!(WriterHandOff, self.ctx.core.fault, task: self.ctx.task.fault_plan());
        let counts = (self.counts.records, self.counts.bytes);
        let r =
            SpilledState::register(self.ctx.task.clone(), self.ctx.lane, entries, counts, |m| {
                self.ctx.task.replace(self.ctx.hook_id, m)
            });
        if r.is_err() {
            Counters::add(&self.ctx.core.counters.aborts_observed, 1);
        }
        r
    }

    /// The scope was closed: the hook deleted the files. Drop what this writer holds.
    fn observe_abort(&mut self) -> SpillError {
        if self.life.is_live() {
            Counters::add(&self.ctx.core.counters.aborts_observed, 1);
        }
        self.life = Life::Aborted;
        self.release_io();
        self.ctx.task.unregister(self.ctx.hook_id);
        SpillError::Aborted
    }

    /// Fails the writer: deletes everything it created (queued, never on this thread), drops
    /// its buffers and files, and returns `err` (the primary error wins over any cleanup
    /// failure, which goes to metrics, logs and the cleanup worker).
    fn fail(&mut self, err: SpillError) -> SpillError {
        self.life = Life::Failed;
        self.release_io();
        self.delete_own_files();
        self.ctx.task.unregister(self.ctx.hook_id);
        err
    }

    fn delete_own_files(&self) {
        let Some(entries) = self.ctx.shared.files.take_own() else {
            return;
        };
        delete_segments(&self.ctx.core, self.ctx.lane, entries);
    }

    fn release_io(&mut self) {
        self.blocks.staging = None;
        self.seg = None;
        self.close_stage();
        // A segment opened ahead is in the file list: deleted with the others (a rotation
        // still running records it, or, refused, deletes it itself).
        self.ahead = Ahead::None;
    }
}

/// After a `StorageFull` failure: waits (up to `FREED_WAIT`) until the writer's writes still
/// in flight ended (each holds its segment's fd), then until its deletes queued before `mark`
/// are done and the reaper closed their fds. True if the space is back.
fn space_back(core: &EngineShared, tracker: &Tracker, mark: u64) -> bool {
    let deadline = Instant::now() + crate::cleanup::FREED_WAIT;
    tracker.wait_idle(deadline) && crate::cleanup::wait_freed(core, mark, deadline)
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
        if self.life.is_live() {
            // Abandoned: delete everything it created. In-flight writes own their buffers and
            // files and finish on their own.
            self.life = Life::Failed;
            self.release_io();
            self.delete_own_files();
            self.ctx.task.unregister(self.ctx.hook_id);
        }
        if !self.ctx.span.is_disabled() {
            let outcome = match self.life {
                Life::Finished => "finished",
                Life::Aborted => "aborted",
                _ if self.ctx.task.is_cancelled() => "aborted",
                _ => "failed",
            };
            // Each field once, at close (a `fmt` subscriber appends every `record`).
            let c = &self.counts;
            self.ctx.span.record("segments", c.segments);
            self.ctx.span.record("records", c.records);
            self.ctx.span.record("bytes", c.bytes);
            self.ctx.span.record("outcome", outcome);
            tracing::debug!(parent: &self.ctx.span, segments = c.segments, records = c.records,
                bytes = c.bytes, outcome, "spill writer closed");
        }
        // What the writer holds of its shared part goes first, so the part can be recycled.
        self.seg = None;
        WriterShared::keep_spare(&mut self.ctx.shared);
    }
}
