//! Stage 1: the writer. Frames records into rotating segment files, write-behind.
//!
//! `write` copies small records into a staging buffer and returns; a full buffer becomes one
//! write on an I/O thread. In buffered mode, records of at least `large_record_threshold` go
//! out without a copy (a vectored write of frame header + payload). `write` blocks only when
//! `queue_depth` writes of this writer are in flight.
//!
//! The abort protocol (DESIGN invariant 2): the writer's abort hook, registered with the task
//! scope, sets the abort flag and takes the file list under one lock, then deletes the files.
//! After every file creation the writer takes that lock and checks the flag: if set, it deletes
//! the file it just made and fails with `Aborted`; if not, it records the file under the same
//! lock. Every file has exactly one deleter, and the writer never creates anything in a
//! directory it does not hold open (so a deleted directory is never re-created).

use std::future::poll_fn;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::cleanup::{SegmentEntry, delete_segments, remove_dir};
use crate::config::{DIRECT_ALIGN, WriteMode};
use crate::dir::{self, DirNext, TaskDir};
use crate::engine::Core;
use crate::error::{Result, SpillError};
use crate::fault::{self, FaultPoint, Injected};
use crate::io::{FileHandle, IoBuf, Op, OpKind, OpSink, WriteData};
use crate::metrics::Counters;
use crate::segment::{self, FRAME_LEN, HEADER_LEN, MAX_RECORD, SegmentFileName};
use crate::state::SpilledState;
use crate::sync;
use crate::task::{Member, TaskShared};

/// The files a writer created, shared with its abort hook: the abort protocol (see the module
/// docs) on a list of `T`, so loom can check it alone (`loom_abortable_files_*` below). Every
/// `T` recorded or refused has exactly one owner: the hook ([`AbortableFiles::abort`]), the
/// hand-off ([`AbortableFiles::take_for_hand_off`]), the writer's own cleanup
/// ([`AbortableFiles::take_own`]), or, when refused by [`AbortableFiles::record`], the writer
/// that made it.
#[derive(Debug)]
pub(crate) struct AbortableFiles<T> {
    list: sync::Mutex<FileList<T>>,
    /// Mirrors `FileList::aborted` (set under the lock) for checks that need no lock.
    aborted: sync::AtomicBool,
}

/// The list behind [`AbortableFiles`]' lock.
#[derive(Debug)]
pub(crate) struct FileList<T> {
    entries: Vec<T>,
    /// The hook ran: everything in `entries` was taken and deleted by it.
    aborted: bool,
    /// The files went to a `SpilledState` or were deleted by the writer itself.
    released: bool,
}

impl<T> AbortableFiles<T> {
    pub(crate) fn new() -> Self {
        AbortableFiles {
            list: sync::Mutex::new(FileList {
                entries: Vec::new(),
                aborted: false,
                released: false,
            }),
            aborted: sync::AtomicBool::new(false),
        }
    }

    /// The list, locked: to read or update entries already recorded.
    pub(crate) fn lock(&self) -> sync::MutexGuard<'_, FileList<T>> {
        self.list.lock()
    }

    /// True once the hook ran (no lock: a hint for early exits; decisions take the lock).
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(sync::Ordering::Acquire)
    }

    /// The writer, after each file creation: records the file and returns its index, or
    /// gives it back (`Err`) if the hook already ran: then the caller deletes it.
    pub(crate) fn record(&self, t: T) -> std::result::Result<usize, T> {
        let mut l = self.list.lock();
        if l.aborted && !cfg!(feature = "broken-skip-abort-check") {
            return Err(t);
        }
        l.entries.push(t);
        Ok(l.entries.len() - 1)
    }

    /// The abort hook: sets the flag and takes the files to delete, under one lock; `None`
    /// if the writer already released them (handed off or deleted).
    pub(crate) fn abort(&self) -> Option<Vec<T>> {
        let mut l = self.list.lock();
        // Set the flag first, under the lock the writer checks after each creation.
        self.aborted.store(true, sync::Ordering::Release);
        l.aborted = true;
        if l.released {
            return None;
        }
        Some(std::mem::take(&mut l.entries))
    }

    /// `finish`: takes the files to hand them to a state; `None` if the hook ran (it deletes
    /// them).
    pub(crate) fn take_for_hand_off(&self) -> Option<Vec<T>> {
        let mut l = self.list.lock();
        if l.aborted {
            return None;
        }
        l.released = true;
        Some(std::mem::take(&mut l.entries))
    }

    /// A failed or dropped writer: takes its files to delete them; `None` if the hook ran or
    /// they were already released.
    pub(crate) fn take_own(&self) -> Option<Vec<T>> {
        let mut l = self.list.lock();
        if l.aborted || l.released {
            return None;
        }
        l.released = true;
        Some(std::mem::take(&mut l.entries))
    }
}

/// The writer's abort hook and file list.
pub(crate) struct WriterShared {
    core: Arc<Core>,
    lane: usize,
    files: AbortableFiles<SegmentEntry>,
    tracker: Tracker,
}

impl OpSink for WriterShared {
    fn complete(&self, token: u64, res: io::Result<usize>) {
        self.tracker.complete(token, res);
    }
}

impl Member for WriterShared {
    fn close_by_scope(&self) {
        let Some(entries) = self.files.abort() else {
            return;
        };
        // Wake a writer blocked on its in-flight budget: it returns `Aborted` now instead of
        // waiting for a slow device. Its in-flight writes still own their buffers and files.
        let waker = self.tracker.st.lock().waker.take();
        self.tracker.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
        delete_segments(&self.core, self.lane, entries);
    }
}

/// In-flight write accounting: completions arrive here from an I/O thread.
#[derive(Default)]
struct Tracker {
    st: Mutex<TrackState>,
    cv: Condvar,
}

#[derive(Default)]
struct TrackState {
    inflight: usize,
    /// First failure: the segment it hit and the OS error.
    error: Option<(u32, io::Error)>,
    waker: Option<Waker>,
}

impl Tracker {
    fn complete(&self, token: u64, res: io::Result<usize>) {
        let waker = {
            let mut s = self.st.lock();
            s.inflight -= 1;
            if let Err(e) = res
                && s.error.is_none()
            {
                s.error = Some((token as u32, e));
            }
            s.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The segment being written.
struct OpenSegment {
    entry_index: usize,
    /// Bytes allocated to the file at creation (direct mode, `preallocate`), 0 if none.
    allocated: u64,
    /// Bytes of quota the segment's ticket holds.
    reserved: u64,
    file: Arc<FileHandle>,
    /// Bytes appended so far (header included): the next record's offset.
    logical: u64,
    /// File offset of the staging buffer's first byte.
    staged_at: u64,
}

/// A record being placed (kept across `Pending` so async writes resume where they stopped).
struct Placing {
    rec: Bytes,
    frame: [u8; FRAME_LEN],
    /// Bytes of frame + payload placed.
    done: usize,
    /// Rotation decided and the target segment open.
    planned: bool,
    vectored: bool,
}

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
        let shared = Arc::new(WriterShared {
            core: core.clone(),
            lane,
            files: AbortableFiles::new(),
            tracker: Tracker::default(),
        });
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
            life: Life::Open,
            core,
        })
    }

    /// Queues one record. Returns once it is copied to a staging buffer or handed to an I/O
    /// thread; blocks only while `queue_depth` writes of this writer are in flight. A failure
    /// of an earlier write may be reported here.
    ///
    /// `LedgerFull`, `QuotaExceeded` and `RecordTooLarge` leave the writer usable: the record
    /// was not written, everything before it is intact, and the call can be retried. Any other
    /// error deletes everything the writer created.
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
        let frame = segment::frame_header(record);
        let r = self.place_slice(&frame, record);
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
        self.trim_allocations();
        self.hand_off()
    }

    /// The async form of [`SpillWriter::finish`].
    pub async fn finish_async(mut self) -> Result<SpilledState> {
        self.check_open()?;
        let r = poll_fn(|cx| {
            let mut w = Wait::Async(cx);
            ready_ok!(self.seal_with(&mut w, true));
            self.poll_drained(&mut w)
        })
        .await;
        self.settle(r)?;
        self.trim_allocations();
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
        if self.placing.is_some() {
            // A write_async future was dropped half way: the stream may hold a torn record.
            return Err(self.fail(SpillError::WriterFailed));
        }
        Ok(())
    }

    fn begin(&mut self, rec: Bytes) -> Result<()> {
        self.check_open()?;
        check_len(rec.len())?;
        let frame = segment::frame_header(&rec);
        self.placing = Some(Placing {
            vectored: !self.direct && rec.len() >= self.large,
            rec,
            frame,
            done: 0,
            planned: false,
        });
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
                | SpillError::RecordTooLarge { .. }),
            ) => {
                self.placing = None;
                Err(e)
            }
            Err(SpillError::Aborted) => Err(self.observe_abort()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Places the current record; `Pending` only for async waits, with progress kept.
    fn step(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
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
        }
        if p.vectored {
            ready_ok!(self.flush_staging(wait, false));
            ready_ok!(self.poll_slot(wait));
            let Some(seg) = self.seg.as_mut() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let offset = seg.logical;
            seg.logical += need;
            seg.staged_at = seg.logical;
            let op = Op {
                kind: OpKind::Write {
                    file: seg.file.clone(),
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

    fn place_slice(&mut self, frame: &[u8; FRAME_LEN], rec: &[u8]) -> Result<()> {
        let need = segment::framed_len(rec.len());
        let w = &mut Wait::Block;
        blocking(self.plan(need, w))?;
        let mut done = 0;
        while done < FRAME_LEN + rec.len() {
            blocking(self.copy_some(frame, rec, &mut done, w))?;
        }
        if let Some(s) = self.seg.as_mut() {
            s.logical += need;
        }
        self.count_record(rec.len());
        Ok(())
    }

    fn count_record(&self, len: usize) {
        let c = &self.core.counters;
        Counters::add(&c.bytes_written, len as u64);
        Counters::add(&c.records_written, 1);
    }

    /// Makes sure a segment with room for `need` more bytes is open: seals the current one if
    /// the record would pass the segment size (unless it is the segment's first record).
    fn plan(&mut self, need: u64, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if let Some(seg) = &self.seg
            && seg.logical + need > self.segment_size
            && seg.logical > HEADER_LEN as u64
        {
            ready_ok!(self.poll_seal(wait));
        }
        let Some(seg) = &mut self.seg else {
            return Poll::Ready(self.open_segment(need));
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
            match self.core.pool.get() {
                Ok(b) => self.staging = Some(b),
                Err(e) => return Poll::Ready(Err(SpillError::io("allocate buffer", "", e))),
            }
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

    /// Waits until this writer may have one more write in flight. Reports an earlier write's
    /// failure.
    fn poll_slot(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let depth = self.queue_depth;
        self.poll_inflight_below(depth, wait)
    }

    /// Waits until nothing of this writer is in flight.
    fn poll_drained(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
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

    fn wait_drained(&mut self) -> Result<()> {
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
    fn flush_staging(&mut self, wait: &mut Wait<'_, '_>, pad: bool) -> Poll<Result<()>> {
        self.flush_staging_with(wait, pad, false)
    }

    /// [`SpillWriter::flush_staging`]; with `inline`, when nothing of this writer is in
    /// flight, the write runs on the calling thread (the last write of a blocking `finish`,
    /// which waits for it anyway: two thread hand-offs saved).
    fn flush_staging_with(
        &mut self,
        wait: &mut Wait<'_, '_>,
        pad: bool,
        inline: bool,
    ) -> Poll<Result<()>> {
        if self.staging.as_ref().is_none_or(|b| b.len == 0) {
            return Poll::Ready(Ok(()));
        }
        ready_ok!(self.poll_slot(wait));
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
        let op = Op {
            kind: OpKind::Write {
                file: seg.file.clone(),
                offset,
                data: WriteData::Staged(buf),
            },
            sink: self.shared.clone(),
            token: seg.entry_index as u64,
        };
        if inline && self.shared.tracker.st.lock().inflight == 0 {
            let token = op.token as u32;
            return match crate::io::psync::perform(&op, &self.core.fault) {
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

    fn seal_with(&mut self, wait: &mut Wait<'_, '_>, last: bool) -> Poll<Result<()>> {
        if self.seg.is_none() {
            return Poll::Ready(Ok(()));
        }
        let direct = self.direct;
        let inline = last && matches!(wait, Wait::Block);
        ready_ok!(self.flush_staging_with(wait, direct, inline));
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

    /// Creates the next segment: ticket first, then the file, then the abort check under the
    /// file-list lock (DESIGN invariant 2). Tries the next healthy root when a root's create
    /// fails with a device error.
    fn open_segment(&mut self, need: u64) -> Result<()> {
        let core = self.core.clone();
        let mut reserve = (HEADER_LEN as u64 + need).max(self.segment_size);
        if self.direct {
            reserve = reserve.next_multiple_of(DIRECT_ALIGN as u64);
        }
        let attempts = core.cfg.roots.len();
        let mut attempt = 0;
        let (dir, seg, ticket, fd, allocated) = loop {
            attempt += 1;
            let root = core.pick_root();
            let dir = match self.task.dir(root) {
                Ok(d) => d,
                Err(e) => {
                    let skipped = e.os_error().is_some_and(|os| core.root_failed(root, os));
                    if skipped && attempt < attempts {
                        continue;
                    }
                    return Err(e);
                }
            };
            if self.shared.files.is_aborted() {
                return Err(SpillError::Aborted);
            }
            let task_plan = self.task.fault_plan();
            let _ = fault::check2(task_plan.as_ref(), &core.fault, FaultPoint::WriterReserve);
            let ticket = core.ledger.reserve(reserve)?;
            let Some(seg) = dir.next_segment() else {
                return Err(SpillError::InvalidConfig(
                    "segment numbers exhausted in this task directory".into(),
                ));
            };
            let name = SegmentFileName::new(seg);
            if !dir.file_coming() {
                // The scope closed the directory after our abort check: nothing was created.
                drop(ticket);
                return Err(SpillError::Aborted);
            }
            let task_plan = self.task.fault_plan();
            let created =
                match fault::check2(task_plan.as_ref(), &core.fault, FaultPoint::WriterCreate) {
                    Injected::Fail(e) => Err(io::Error::from_raw_os_error(e)),
                    Injected::FailAfter(e) => {
                        // The create happened, but its outcome reads as an error: whether a
                        // file exists is unknown to us. Keep the ticket and let the cleanup
                        // worker settle the name (deleted, or found absent).
                        if let Ok(fd) =
                            dir::create_file_at(dir.as_fd(), name.as_cstr(), self.direct)
                        {
                            drop(fd);
                        }
                        Counters::add(&core.counters.segments_created, 1);
                        core.cleanup.retain_file(&dir, seg, ticket.retain());
                        let e = io::Error::from_raw_os_error(e);
                        return Err(SpillError::io("create", dir.path.join(name.as_str()), e));
                    }
                    _ => dir::create_file_at(dir.as_fd(), name.as_cstr(), self.direct),
                };
            let fd = match created {
                Ok(fd) => fd,
                Err(e) => {
                    drop(ticket);
                    if dir.file_gone() == DirNext::Remove {
                        remove_dir(&core, &dir.entry);
                    }
                    let skipped = core.root_failed(root, &e);
                    if skipped && attempt < attempts {
                        continue;
                    }
                    return Err(SpillError::io("create", dir.path.join(name.as_str()), e));
                }
            };
            Counters::add(&core.counters.segments_created, 1);
            // Direct mode allocates the whole segment up front (file size included): O_DIRECT
            // writes inside the file size run in parallel under a shared inode lock, where
            // extending writes serialise. `preallocate` does the same without growing the file.
            let prealloc = if self.direct {
                dir::allocate(fd.as_fd(), reserve)
            } else if core.cfg.preallocate {
                dir::preallocate(fd.as_fd(), reserve)
            } else {
                Ok(false)
            };
            let allocated = if matches!(prealloc, Ok(true)) {
                reserve
            } else {
                0
            };
            if let Err(e) = prealloc {
                drop(fd);
                self.delete_now(&dir, seg, ticket, false);
                if core.root_failed(root, &e) && attempt < attempts {
                    continue;
                }
                return Err(SpillError::io(
                    "preallocate",
                    dir.path.join(name.as_str()),
                    e,
                ));
            }
            break (dir, seg, ticket, fd, allocated);
        };
        // The write-after-delete window: a scope closed right here must not leave this file.
        let task_plan = self.task.fault_plan();
        let _ = fault::check2(
            task_plan.as_ref(),
            &core.fault,
            FaultPoint::WriterAfterCreate,
        );
        let entry_index =
            match self
                .shared
                .files
                .record(SegmentEntry::new(dir.clone(), seg, ticket))
            {
                Ok(i) => i,
                Err(entry) => {
                    drop(fd);
                    Counters::add(&core.counters.late_files_deleted, 1);
                    delete_segments(&core, self.lane, vec![entry]);
                    return Err(SpillError::Aborted);
                }
            };
        let file = FileHandle::new(fd, core.reaper.clone());
        let mut buf = core
            .pool
            .get()
            .map_err(|e| SpillError::io("allocate buffer", "", e))?;
        buf.push(&segment::encode_header(seg, core.id));
        self.staging = Some(buf);
        self.seg = Some(OpenSegment {
            entry_index,
            allocated,
            reserved: reserve,
            file,
            logical: HEADER_LEN as u64,
            staged_at: 0,
        });
        Ok(())
    }

    /// Deletes a file this writer just created and nobody else knows of. Queued like every
    /// other delete (a direct-mode segment is already allocated, and freeing its blocks can
    /// take milliseconds): never on the caller's thread.
    fn delete_now(&self, dir: &Arc<TaskDir>, seg: u32, ticket: crate::ledger::Ticket, late: bool) {
        if late {
            Counters::add(&self.core.counters.late_files_deleted, 1);
        }
        let entry = SegmentEntry::new(dir.clone(), seg, ticket);
        delete_segments(&self.core, self.lane, vec![entry]);
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

    /// Gives back the unused tails of segments allocated up front (direct mode, `preallocate`),
    /// then shrinks each ticket to the written length. Runs after every write of the writer completed, so it never waits for
    /// one, and outside the file-list lock, so a cancel never waits for it. A segment whose
    /// trim fails keeps its whole ticket: the quota still counts what is allocated.
    fn trim_allocations(&mut self) {
        for i in 0.. {
            let target = {
                let f = self.shared.files.lock();
                let Some(e) = f.entries.get(i) else { break };
                (e.allocated > 0).then(|| (e.dir.clone(), e.seg, e.len, e.allocated))
            };
            let Some((dir, seg, len, allocated)) = target else {
                continue;
            };
            // Direct mode padded the last write to whole blocks; a buffered file is exactly
            // `len` long. Truncating to the size it has frees the blocks allocated past it
            // (ext4 and tmpfs truncate preallocated blocks even when the size does not change;
            // punching a hole past the end is a no-op on ext4).
            let keep = if self.direct { trimmed_len(len) } else { len };
            let name = SegmentFileName::new(seg);
            let r = dir::open_write_at(dir.as_fd(), name.as_cstr())
                .and_then(|fd| dir::truncate(fd.as_fd(), keep.min(allocated)));
            match r {
                Ok(()) => {
                    let mut f = self.shared.files.lock();
                    if let Some(e) = f.entries.get_mut(i) {
                        e.allocated = 0;
                        e.shrink_to(len);
                    }
                }
                // Only disk space is at stake: the reader uses the written length.
                Err(e) => {
                    tracing::debug!(error = %e, "trimming a segment failed; keeping its ticket")
                }
            }
        }
    }

    fn release_io(&mut self) {
        self.placing = None;
        self.staging = None;
        self.seg = None;
    }
}

/// What a segment of `len` written bytes keeps on disk after its trim: whole 4 KiB blocks
/// (direct mode pads its last write to them).
fn trimmed_len(len: u64) -> u64 {
    len.next_multiple_of(DIRECT_ALIGN as u64)
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
    /// Payload at `at + FRAME_LEN` in the staging buffer, `len` bytes.
    InPlace { at: usize, len: usize },
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

    /// Frames the record (length and CRC-32C of what the slot holds now) and queues it.
    pub fn commit(self) -> Result<()> {
        let RecordSlot { w, kind } = self;
        match kind {
            SlotKind::Owned(b) => w.write(b.freeze()),
            SlotKind::InPlace { at, len } => {
                if w.shared.files.is_aborted() {
                    return Err(w.observe_abort());
                }
                let Some(buf) = w.staging.as_mut() else {
                    return Err(w.fail(SpillError::WriterFailed));
                };
                let space = buf.space();
                let frame = segment::frame_header(&space[at + FRAME_LEN..at + FRAME_LEN + len]);
                space[at..at + FRAME_LEN].copy_from_slice(&frame);
                buf.len = at + FRAME_LEN + len;
                if let Some(s) = w.seg.as_mut() {
                    s.logical += segment::framed_len(len);
                }
                w.count_record(len);
                Ok(())
            }
        }
    }
}

impl std::ops::Deref for RecordSlot<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.kind {
            SlotKind::Owned(b) => b,
            SlotKind::InPlace { at, len } => match self.w.staging.as_ref() {
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
            SlotKind::InPlace { at, len } => match self.w.staging.as_mut() {
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

    /// A slot of `len` bytes for the caller to fill in place (serialise a row batch straight
    /// into the engine's buffer), then [`RecordSlot::commit`]. Records that fit a staging
    /// buffer are written with no copy at all; larger ones (and, in direct mode, one that
    /// does not fit the aligned buffer's remaining room) get an owned buffer instead. Blocks,
    /// like `write`, only while the in-flight budget is full.
    pub fn record(&mut self, len: usize) -> Result<RecordSlot<'_>> {
        self.check_open()?;
        check_len(len)?;
        let need = FRAME_LEN + len;
        let cap = self.core.pool.buffer_capacity();
        if need > cap {
            return Ok(self.owned_slot(len));
        }
        let r = blocking(self.plan(need as u64, &mut Wait::Block));
        self.settle(r)?;
        if self.staging.as_ref().is_some_and(|b| b.remaining() < need) {
            if self.direct {
                // Direct writes stay aligned: only a full buffer is written mid-segment.
                return Ok(self.owned_slot(len));
            }
            let r = blocking(self.flush_staging(&mut Wait::Block, false));
            self.settle(r)?;
        }
        if self.staging.is_none() {
            match self.core.pool.get() {
                Ok(b) => self.staging = Some(b),
                Err(e) => return Err(self.fail(SpillError::io("allocate buffer", "", e))),
            }
        }
        let at = self.staging.as_ref().map_or(0, |b| b.len);
        Ok(RecordSlot {
            w: self,
            kind: SlotKind::InPlace { at, len },
        })
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// Where a file ended.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum End {
        /// Deleted by the hook or by the writer.
        Deleted,
        /// Handed to a `SpilledState` (which then owns its delete).
        HandedOff,
    }

    /// How the writer ends once its files are made.
    #[derive(Debug, Clone, Copy)]
    enum Finish {
        /// `finish`: the hand-off.
        HandOff,
        /// A failure (or a drop): the writer deletes its own files.
        Fail,
    }

    /// A writer creating `files` files, then finishing as `finish`, races the scope's abort
    /// hook. Exactly one of the hook and the writer's hand-off (or own cleanup) takes the list,
    /// and it takes every file recorded; every file created ends exactly once: deleted by the
    /// hook, deleted by the writer (refused after the abort, or its own cleanup), or handed off.
    fn writer_races_the_hook(files: usize, finish: Finish) {
        loom::model(move || {
            let list = Arc::new(AbortableFiles::<usize>::new());
            let hook = {
                let list = list.clone();
                thread::spawn(move || list.abort())
            };
            let mut ends: Vec<(usize, End)> = Vec::new();
            let mut created = 0;
            let mut taken = None;
            'writer: {
                for f in 0..files {
                    // `open_segment`'s early check, before the ticket and the create.
                    if list.is_aborted() {
                        break 'writer;
                    }
                    created += 1; // the file exists from here on
                    match list.record(f) {
                        Ok(i) => assert_eq!(i, f),
                        Err(f) => {
                            ends.push((f, End::Deleted));
                            break 'writer;
                        }
                    }
                }
                taken = match finish {
                    Finish::HandOff => list.take_for_hand_off().map(|v| (v, End::HandedOff)),
                    Finish::Fail => list.take_own().map(|v| (v, End::Deleted)),
                };
            }
            let by_hook = hook.join().unwrap();
            match (by_hook, taken) {
                (Some(v), None) => ends.extend(v.into_iter().map(|f| (f, End::Deleted))),
                (None, Some((v, end))) => {
                    assert_eq!(v.len(), created, "the writer took a partial list: {v:?}");
                    ends.extend(v.into_iter().map(|f| (f, end)));
                }
                (h, w) => panic!("the list must have one taker: hook {h:?}, writer {w:?}"),
            }
            for f in 0..created {
                let n = ends.iter().filter(|(g, _)| *g == f).count();
                assert_eq!(n, 1, "file {f} ended {n} times: {ends:?}");
            }
            assert_eq!(
                ends.len(),
                created,
                "a file that was never created ended: {ends:?}"
            );
        });
    }

    #[test]
    fn loom_abortable_files_hand_off() {
        writer_races_the_hook(2, Finish::HandOff);
    }

    #[test]
    fn loom_abortable_files_fail() {
        writer_races_the_hook(2, Finish::Fail);
    }
}
