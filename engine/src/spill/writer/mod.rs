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
//! at `finish`), `slot.rs` (records filled in place), `stream.rs` (a byte stream cut into
//! records: `append`, `std::io::Write`).

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;

use crate::cleanup::delete_segments;
use crate::config::WriteMode;
use crate::core::Core;
use crate::error::{Result, SpillError};
use crate::fault::{self, FaultPoint};
use crate::format::segment::MAX_RECORD;
use crate::io::IoBuf;
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

mod alloc;
mod codec;
mod flush;
mod hook;
mod place;
mod rotate;
mod seal;
mod slot;
mod step;
mod stream;

pub use slot::RecordSlot;

use alloc::trim_allocations;
use hook::WriterShared;
use place::Placing;
use rotate::OpenSegment;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Open,
    /// An error other than an abort failed it (the error was returned then).
    Failed,
    /// Its scope closed it and deleted its files (`Aborted` was returned).
    Aborted,
    /// A `write_async` future was dropped half way (`WriteFutureDropped` was returned).
    Poisoned,
    Finished,
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
    task: Arc<TaskShared>,
    core: Arc<Core>,
    shared: Arc<WriterShared>,
    hook_id: u64,
    lane: usize,
    seg: Option<OpenSegment>,
    staging: Option<IoBuf>,
    placing: Option<Placing>,
    /// An async call's step running on the offload pool (`step.rs`).
    running: Option<step::Running>,
    life: Life,
    segment_size: u64,
    direct: bool,
    /// Records accepted so far, and their payload bytes (frames excluded).
    records: u64,
    bytes_written: u64,
    large: usize,
    queue_depth: usize,
    /// The writer's `tracing` span (debug level, under its task's): segments, bytes, outcome.
    span: tracing::Span,
    /// Format v2: the block codec and `Auto`'s state (`place.rs`).
    codec: codec::CodecState,
    /// Failed with `StorageFull`: the delete mark its error waits for (`settle`).
    freeing: Option<u64>,
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
        let shared = WriterShared::make(&core, lane);
        let hook_id = task
            .register(shared.clone())
            .map_err(|_| task.closed_error())?;
        let cfg = &core.cfg;
        let span = tracing::debug_span!(parent: &task.span, "spillring.writer",
            segments = 0u64, records = 0u64, bytes = 0u64, outcome = tracing::field::Empty);
        Ok(SpillWriter {
            span,
            segment_size: cfg.segment_size,
            records: 0,
            bytes_written: 0,
            direct: cfg.mode == WriteMode::Direct,
            large: cfg.large_record_threshold,
            queue_depth: cfg.queue_depth,
            codec: codec::CodecState::new(cfg.compression),
            task,
            shared,
            hook_id,
            lane,
            seg: None,
            staging: None,
            placing: None,
            running: None,
            life: Life::Open,
            freeing: None,
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
        let started = Instant::now();
        let r = self.write_untimed(record);
        self.core.counters.latency.write.record_since(started);
        r
    }

    fn write_untimed(&mut self, record: Bytes) -> Result<()> {
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
        let started = Instant::now();
        let r = self.write_slice_untimed(record);
        self.core.counters.latency.write.record_since(started);
        r
    }

    fn write_slice_untimed(&mut self, record: &[u8]) -> Result<()> {
        self.check_open()?;
        check_len(record.len())?;
        let r = self.place_slice(record);
        self.settle(r)
    }

    /// The async form of [`SpillWriter::write`]: waits for in-flight budget without blocking
    /// the thread, on any runtime. If the future is dropped before it completes, the writer
    /// fails (and deletes its files) on its next use, since a record may be half placed.
    pub async fn write_async(&mut self, record: Bytes) -> Result<()> {
        let started = Instant::now();
        self.begin(record)?;
        let r = poll_fn(|cx| self.step(&mut Wait::Async(cx))).await;
        let r = self.settle_async(r).await;
        self.core.counters.latency.write.record_since(started);
        r
    }

    /// Waits for every write in flight, seals the last segment, and hands the files to a
    /// [`SpilledState`], registered with the task scope in place of this writer. On a scope
    /// closed meanwhile, the files are deleted and the result is `Aborted`.
    pub fn finish(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let started = Instant::now();
        let core = self.core.clone();
        let r = self.finish_sealed();
        core.counters.latency.finish.record_since(started);
        r
    }

    fn finish_sealed(mut self) -> Result<SpilledState> {
        let r = blocking(self.seal_with(&mut Wait::Block, true)).and_then(|()| self.wait_drained());
        self.settle(r)?;
        trim_allocations(&self.core, &self.shared, self.direct);
        self.hand_off()
    }

    /// The async form of [`SpillWriter::finish`]. Trimming the preallocated tails (an open
    /// and an `ftruncate` per segment) runs on the engine's offload pool, not in a poll.
    pub async fn finish_async(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let started = Instant::now();
        let core = self.core.clone();
        let r = self.finish_async_sealed().await;
        core.counters.latency.finish.record_since(started);
        r
    }

    async fn finish_async_sealed(mut self) -> Result<SpilledState> {
        let r = poll_fn(|cx| {
            ready_ok!(self.resume(cx));
            let mut w = Wait::Async(cx);
            ready_ok!(self.seal_with(&mut w, true));
            self.poll_drained(&mut w)
        })
        .await;
        self.settle_async(r).await?;
        if alloc::needs_trim(&self.shared) {
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

    /// Records this writer accepted so far (`write`, `write_slice`, committed slots). After
    /// an error from [`SpillWriter::write_all`], the records that went in before it.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Payload bytes of the records this writer accepted so far (framing and segment headers
    /// excluded: [`SpilledState::bytes`] counts the files).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
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
        if self.task.is_cancelled() {
            return SpillError::Aborted;
        }
        match self.life {
            Life::Aborted => SpillError::Aborted,
            Life::Poisoned => SpillError::WriteFutureDropped,
            Life::Open | Life::Failed | Life::Finished => SpillError::WriterFailed,
        }
    }

    /// [`SpillWriter::check_live`], and ends the byte stream's open record (`stream.rs`):
    /// every call but `append` places something after it, or seals it.
    fn check_open(&mut self) -> Result<()> {
        self.check_live()?;
        if let Some(b) = self.staging.as_mut() {
            b.end_open_record();
        }
        Ok(())
    }

    fn check_live(&mut self) -> Result<()> {
        if self.life != Life::Open {
            return Err(self.ended_error());
        }
        if self.shared.files.is_aborted() {
            return Err(self.observe_abort());
        }
        if self.placing.is_some() || self.running.is_some() {
            // A write_async future was dropped half way: the stream may hold a torn record.
            // (Or an async call was dropped while its rotation ran on the offload pool: the
            // segment it records is not this writer's open one.)
            let e = self.fail(SpillError::WriteFutureDropped);
            self.life = Life::Poisoned;
            return Err(e);
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

    /// [`SpillWriter::route`]; after a `StorageFull` failure, waits (bounded) until the
    /// writer's files are deleted and closed, so their space is back when the error returns.
    fn settle<T>(&mut self, r: Result<T>) -> Result<T> {
        let r = self.route(r);
        if let Some(mark) = self.freeing.take() {
            crate::cleanup::wait_freed(&self.core, mark);
        }
        r
    }

    /// [`SpillWriter::settle`] for an async call: the wait runs on the offload pool.
    async fn settle_async<T>(&mut self, r: Result<T>) -> Result<T> {
        let r = self.route(r);
        if let Some(mark) = self.freeing.take() {
            let core = self.core.clone();
            let mut job = self.core.io.offload().run(move || {
                crate::cleanup::wait_freed(&core, mark);
            });
            poll_fn(|cx| job.poll(cx)).await;
        }
        r
    }

    /// Routes an error: admission refusals leave the writer open; an abort is observed; any
    /// other error fails the writer and deletes its files. The first error is what the caller
    /// gets.
    fn route<T>(&mut self, r: Result<T>) -> Result<T> {
        match r {
            Ok(v) => Ok(v),
            Err(
                e @ (SpillError::LedgerFull { .. }
                | SpillError::QuotaExceeded { .. }
                | SpillError::RecordTooLarge { .. }
                | SpillError::TooManyOpenFiles { .. }),
            ) => {
                self.placing = None;
                Err(self.explain_admission(e))
            }
            Err(SpillError::Aborted) => Err(self.observe_abort()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// An admission refusal this writer can never get past, because what it holds itself
    /// fills the ledger or the quota, becomes [`SpillError::WriterCannotFit`]; any other error
    /// is returned as it is.
    fn explain_admission(&self, e: SpillError) -> SpillError {
        match e {
            SpillError::LedgerFull { capacity } => {
                let held = self.segments() as u64;
                if held < capacity as u64 {
                    return e;
                }
                SpillError::WriterCannotFit {
                    resource: "ticket ledger",
                    held,
                    limit: capacity as u64,
                    requested: 1,
                    fix: "each segment file holds a ticket until it is deleted: raise ticket_capacity (or segment_size), or finish this writer and spill the rest with another",
                }
            }
            SpillError::QuotaExceeded {
                limit, requested, ..
            } => {
                let held = self
                    .shared
                    .files
                    .lock()
                    .entries
                    .iter()
                    .map(|e| e.reserved())
                    .sum::<u64>();
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

    /// Hands the files to a new `SpilledState` registered in this writer's place.
    fn hand_off(mut self) -> Result<SpilledState> {
        let Some(entries) = self.shared.files.take_for_hand_off() else {
            return Err(self.observe_abort());
        };
        self.span.record("segments", entries.len() as u64);
        self.life = Life::Finished;
        let task_plan = self.task.fault_plan();
        let _ = fault::check2(
            task_plan.as_ref(),
            &self.core.fault,
            FaultPoint::WriterHandOff,
        );
        let counts = (self.records, self.bytes_written);
        let r = SpilledState::register(self.task.clone(), self.lane, entries, counts, |m| {
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
        self.life = Life::Aborted;
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
        if err.is_storage_full() {
            self.freeing = Some(crate::cleanup::delete_mark(&self.core));
        }
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
        self.running = None;
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
        if !self.span.is_disabled() {
            let outcome = match self.life {
                Life::Finished => "finished",
                Life::Aborted => "aborted",
                _ if self.task.is_cancelled() => "aborted",
                _ => "failed",
            };
            self.span.record("records", self.records);
            self.span.record("bytes", self.bytes_written);
            self.span.record("outcome", outcome);
        }
        // What the writer holds of its shared part goes first, so the part can be recycled.
        self.seg = None;
        self.running = None;
        WriterShared::shelve(&mut self.shared);
    }
}
