//! Deleting files: the normal delete path (batched unlinks queued to an I/O thread) and the
//! cleanup worker that owns name-only records of deletes whose outcome was not confirmed.
//!
//! A record is sixteen bytes: a directory index, a segment number, the quota pages its ticket
//! holds, and when it was queued. It keeps no buffer, fd or mmap alive. Its ticket stays held
//! until the delete is confirmed (or the file is found absent), so a long storage outage stops
//! new spills at admission instead of growing memory.
//!
//! The worker deletes in batches. After each batch exactly the confirmed names release their
//! tickets; the failed ones rotate to the back of the queue and the worker waits
//! `cleanup_retry_delay` (plus jitter) only after a failure. After a success it takes the next
//! ready record at once.

use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::dir::{DirEntry, DirNext, TaskDir};
use crate::engine::Core;
use crate::fault::FaultPoint;
use crate::io::{NameBuf, Op, OpKind, OpSink};
use crate::ledger::{RetainedTicket, Ticket};
use crate::metrics::Counters;
use crate::segment::SegmentFileName;
use crate::sync;
use crate::sys::errno;

/// Segment number that marks a record for the directory itself (its `rmdir`).
pub(crate) const DIR_RECORD: u32 = u32::MAX;

/// A name-only cleanup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub dir: u32,
    pub seg: u32,
    /// Quota pages of the retained ticket (the ticket itself is implied: every file record
    /// holds exactly one; a directory record holds none).
    pub pages: u32,
    /// Seconds since the engine started when the record was queued.
    pub since: u32,
}

const _: () = assert!(std::mem::size_of::<Record>() == 16);

/// One segment file owned by whoever holds this: its directory, number and ticket. It ends by
/// a confirmed delete or publish ([`SegmentEntry::release`]) or by a hand-off of its name to
/// the cleanup worker ([`SegmentEntry::retain`]); dropped any other way (a bug, or an op that
/// never completed), its name goes to the cleanup worker with its ticket, so the file is
/// never forgotten while it may exist.
#[derive(Debug)]
pub(crate) struct SegmentEntry {
    pub dir: Arc<TaskDir>,
    pub seg: u32,
    /// Written length (set when the segment is sealed).
    pub len: u64,
    /// Bytes allocated to the file up front (direct mode, `preallocate`) that the writer has
    /// not yet given back; 0 once trimmed or if none. The ticket holds at least this much.
    pub allocated: u64,
    /// `None` only once the entry ended (release or retain).
    ticket: Option<Ticket>,
}

impl SegmentEntry {
    pub(crate) fn new(dir: Arc<TaskDir>, seg: u32, ticket: Ticket) -> Self {
        SegmentEntry {
            dir,
            seg,
            len: 0,
            allocated: 0,
            ticket: Some(ticket),
        }
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path.join(SegmentFileName::new(self.seg).as_str())
    }

    /// Shrinks the ticket's quota to `bytes` (see [`Ticket::shrink_to`]).
    pub(crate) fn shrink_to(&mut self, bytes: u64) {
        if let Some(t) = &mut self.ticket {
            t.shrink_to(bytes);
        }
    }

    /// Grows the ticket's quota to `bytes` (see [`Ticket::grow_to`]).
    pub(crate) fn grow_to(&mut self, bytes: u64) -> crate::error::Result<()> {
        match &mut self.ticket {
            Some(t) => t.grow_to(bytes),
            None => Ok(()),
        }
    }

    /// The file is confirmed gone (or published): releases the ticket and returns the
    /// directory, whose file count the caller decrements.
    pub(crate) fn release(mut self) -> Arc<TaskDir> {
        drop(self.ticket.take());
        self.dir.clone()
    }

    /// Hands the name to the cleanup worker, ticket held.
    pub(crate) fn retain(mut self, cleanup: &Cleanup) {
        if let Some(t) = self.ticket.take() {
            cleanup.retain_file(&self.dir, self.seg, t.retain());
        }
    }
}

impl Drop for SegmentEntry {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            if cfg!(feature = "broken-skip-abort-check") {
                // The deliberately broken engine has no backstop either: it forgets the file
                // (and keeps its ticket), so loadgen can prove its leak checks fail.
                std::mem::forget(t);
                return;
            }
            tracing::warn!(path = %self.path().display(),
                "a segment was dropped without a hand-off; its name goes to the cleanup worker");
            self.dir
                .cleanup
                .retain_file(&self.dir, self.seg, t.retain());
        }
    }
}

/// What is left for the cleanup worker, for operators.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CleanupReport {
    /// Records pending.
    pub pending: u64,
    /// Age of the oldest pending record, seconds.
    pub oldest_age_secs: f64,
    /// A few pending paths, oldest first.
    pub examples: Vec<PathBuf>,
    /// Orphan directories of dead processes not yet deleted.
    pub sweeps_pending: u64,
}

#[derive(Debug, Default)]
struct Queue {
    records: VecDeque<Record>,
    sweeps: VecDeque<PathBuf>,
    stop: bool,
    /// No attempt before this instant (set after a failed batch).
    retry_at: Option<Instant>,
}

/// The cleanup worker's queue and its metrics. The worker thread itself is started by the
/// engine and runs [`worker_loop`].
#[derive(Debug)]
pub(crate) struct Cleanup {
    queue: Mutex<Queue>,
    cv: Condvar,
    pending: AtomicU64,
    /// Every unit of delete work not finished: deletes in flight on an I/O thread, records
    /// pending, orphan sweeps queued or running. Each hand-over (a failed delete becoming a
    /// record, a confirmed name queueing its directory's `rmdir`) counts the new unit before
    /// it ends the old one, so one load of zero means nothing is left (see
    /// [`Cleanup::outstanding`]); two counters read one after the other could both miss a unit
    /// moving between them.
    outstanding: AtomicU64,
    /// Set by [`Cleanup::stop`]; read without the queue's lock inside a batch or a sweep, so a
    /// shutdown never waits for more than the one unlink under way.
    stopping: AtomicBool,
    epoch: Instant,
    oldest: Mutex<OldestSample>,
}

#[derive(Debug)]
struct OldestSample {
    at: Option<Instant>,
    age: f64,
}

impl Cleanup {
    pub(crate) fn new() -> Self {
        Cleanup {
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            pending: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            epoch: Instant::now(),
            oldest: Mutex::new(OldestSample { at: None, age: 0.0 }),
        }
    }

    fn now_secs(&self) -> u32 {
        u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    /// Hands a file whose delete failed to the worker; its ticket stays held.
    pub(crate) fn retain_file(&self, dir: &DirEntry, seg: u32, ticket: RetainedTicket) {
        // The capacity stays held; the record carries how much quota the ticket had.
        let pages = ticket.into_pages();
        self.push(Record {
            dir: dir.index,
            seg,
            pages,
            since: self.now_secs(),
        });
    }

    /// Hands a directory whose `rmdir` failed to the worker.
    pub(crate) fn retain_dir(&self, dir: &DirEntry) {
        self.push(Record {
            dir: dir.index,
            seg: DIR_RECORD,
            pages: 0,
            since: self.now_secs(),
        });
    }

    fn push(&self, r: Record) {
        self.begin(1);
        let mut q = self.queue.lock();
        q.records.push_back(r);
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.cv.notify_all();
    }

    /// Counts `n` new units of delete work (before the unit they replace ends).
    pub(crate) fn begin(&self, n: u64) {
        self.outstanding.fetch_add(n, Ordering::SeqCst);
    }

    /// Ends one unit of delete work (after the unit that replaces it, if any, began).
    pub(crate) fn end(&self) {
        self.outstanding.fetch_sub(1, Ordering::SeqCst);
    }

    /// Units of delete work not finished: zero means every delete the engine was asked for
    /// (and every orphan sweep) is confirmed done. One load.
    pub(crate) fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::SeqCst)
    }

    /// Queues the deletion of a dead process's directory tree (renamed out of the way).
    pub(crate) fn sweep(&self, path: PathBuf) {
        self.begin(1);
        let mut q = self.queue.lock();
        q.sweeps.push_back(path);
        self.cv.notify_all();
    }

    /// The queue in order, as (directory index, segment number): for tests of its rotation.
    pub(crate) fn snapshot(&self) -> Vec<(u32, u32)> {
        self.queue
            .lock()
            .records
            .iter()
            .map(|r| (r.dir, r.seg))
            .collect()
    }

    /// Queues a sweep that failed again, after the retry delay.
    pub(crate) fn sweep_later(&self, path: PathBuf, delay: Duration) {
        let mut q = self.queue.lock();
        q.sweeps.push_back(path);
        q.retry_at = Some(Instant::now() + delay);
        self.cv.notify_all();
    }

    /// Puts back a sweep a shutdown interrupted, so reports count it (the worker is stopping:
    /// the next open sweeps it).
    pub(crate) fn sweep_left(&self, path: &std::path::Path) {
        self.queue.lock().sweeps.push_back(path.to_path_buf());
    }

    /// Orphan sweeps queued and not finished.
    pub(crate) fn sweeps_pending(&self) -> u64 {
        self.queue.lock().sweeps.len() as u64
    }

    /// Records pending now (kept on every operation, no scan).
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Age of the oldest pending record, sampled at most once a second.
    pub(crate) fn oldest_age(&self) -> f64 {
        let mut s = self.oldest.lock();
        let now = Instant::now();
        if s.at
            .is_some_and(|at| now.duration_since(at) < Duration::from_secs(1))
        {
            return s.age;
        }
        let now_secs = self.epoch.elapsed().as_secs_f64();
        let q = self.queue.lock();
        let min = q.records.iter().map(|r| r.since).min();
        drop(q);
        s.age = min.map_or(0.0, |m| (now_secs - f64::from(m)).max(0.0));
        s.at = Some(now);
        s.age
    }

    pub(crate) fn report(&self, core: &Core) -> CleanupReport {
        let q = self.queue.lock();
        let mut oldest: Vec<Record> = q.records.iter().copied().collect();
        let sweeps_pending = q.sweeps.len() as u64;
        drop(q);
        oldest.sort_by_key(|r| r.since);
        let examples = oldest
            .iter()
            .take(5)
            .filter_map(|r| {
                let d = core.dirs.get(r.dir)?;
                Some(if r.seg == DIR_RECORD {
                    d.path.clone()
                } else {
                    d.path.join(SegmentFileName::new(r.seg).as_str())
                })
            })
            .collect();
        CleanupReport {
            pending: self.pending(),
            oldest_age_secs: self.oldest_age(),
            examples,
            sweeps_pending,
        }
    }

    /// Asks the worker to stop: it finishes the unlink under way, puts back what it had not
    /// started, and returns.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.queue.lock().stop = true;
        self.cv.notify_all();
    }

    /// True once [`Cleanup::stop`] was called.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Lets the worker retry now instead of waiting out its failure delay.
    pub(crate) fn retry_now(&self) {
        self.queue.lock().retry_at = None;
        self.cv.notify_all();
    }
}

/// Queues the deletes of `entries` on an I/O thread and returns at once. Confirmed (or absent)
/// names release their tickets; the others go to the cleanup worker with their tickets.
pub(crate) fn delete_segments(core: &Arc<Core>, lane: usize, entries: Vec<SegmentEntry>) {
    if entries.is_empty() {
        return;
    }
    let n = entries.len();
    core.cleanup.begin(n as u64);
    Counters::add(&core.counters.deletes_in_flight, n as u64);
    let batch = Arc::new(DeleteBatch {
        core: core.clone(),
        // `Option<SegmentEntry>` has the size of `SegmentEntry`: this reuses the allocation.
        entries: Mutex::new(entries.into_iter().map(Some).collect()),
    });
    for i in 0..n {
        // Read under the lock: a completion may already have taken an earlier entry.
        let target = batch.entries.lock()[i]
            .as_ref()
            .map(|e| (e.dir.fd.clone(), seg_name(e.seg)));
        let Some((dir, name)) = target else { continue };
        core.io.submit(
            lane,
            Op {
                kind: OpKind::Unlink {
                    dir,
                    name,
                    rmdir: false,
                    point: FaultPoint::IoUnlink,
                },
                sink: batch.clone(),
                token: i as u64,
            },
        );
    }
}

fn seg_name(seg: u32) -> NameBuf {
    NameBuf::segment(seg)
}

/// A batch of segment deletes in flight on the normal path.
struct DeleteBatch {
    core: Arc<Core>,
    entries: Mutex<Vec<Option<SegmentEntry>>>,
}

impl OpSink for DeleteBatch {
    fn complete(&self, token: u64, res: io::Result<usize>) {
        let entry = self
            .entries
            .lock()
            .get_mut(token as usize)
            .and_then(Option::take);
        let Some(entry) = entry else { return };
        let c = &self.core.counters;
        match res {
            Ok(_) => {
                Counters::add(&c.files_deleted, 1);
                confirmed(&self.core, entry);
            }
            Err(e) if e.raw_os_error() == Some(errno::ENOENT) => {
                Counters::add(&c.files_already_absent, 1);
                confirmed(&self.core, entry);
            }
            Err(e) => {
                if crate::io::is_abandoned(&e) {
                    tracing::debug!(path = %entry.path().display(),
                        "segment delete not started before shutdown's deadline; left for the next open");
                } else {
                    Counters::add(&c.delete_failures, 1);
                    tracing::warn!(path = %entry.path().display(), error = %e,
                        "segment delete failed; handing its name to the cleanup worker");
                }
                entry.retain(&self.core.cleanup);
            }
        }
        // Last: until the outcome is recorded (ticket released, record queued, rmdir queued),
        // the delete counts as in flight, so `pending_deletes` and `settle` never see a gap.
        Counters::add(&c.deletes_in_flight, u64::MAX); // -1
        self.core.cleanup.end();
    }
}

/// A file is confirmed gone: release its ticket and maybe remove its directory.
fn confirmed(core: &Arc<Core>, entry: SegmentEntry) {
    let dir = entry.release();
    if dir.file_gone() == DirNext::Remove {
        remove_dir(core, &dir.entry);
    }
}

/// Queues the `rmdir` of a task directory whose scope is closed and whose files are gone.
pub(crate) fn remove_dir(core: &Arc<Core>, dir: &Arc<DirEntry>) {
    core.cleanup.begin(1);
    Counters::add(&core.counters.deletes_in_flight, 1);
    let sink = Arc::new(RmdirSink {
        core: core.clone(),
        dir: dir.clone(),
    });
    core.io.submit(
        0,
        Op {
            kind: OpKind::Unlink {
                dir: dir.parent.fd.clone(),
                name: dir.name,
                rmdir: true,
                point: FaultPoint::IoUnlink,
            },
            sink,
            token: 0,
        },
    );
}

struct RmdirSink {
    core: Arc<Core>,
    dir: Arc<DirEntry>,
}

impl OpSink for RmdirSink {
    fn complete(&self, _token: u64, res: io::Result<usize>) {
        match res {
            Ok(_) => self.core.dirs.remove(&self.dir),
            Err(e) if e.raw_os_error() == Some(errno::ENOENT) => self.core.dirs.remove(&self.dir),
            Err(e) => {
                Counters::add(&self.core.counters.delete_failures, 1);
                tracing::warn!(path = %self.dir.path.display(), error = %e,
                    "task directory removal failed; handing it to the cleanup worker");
                self.core.cleanup.retain_dir(&self.dir);
            }
        }
        Counters::add(&self.core.counters.deletes_in_flight, u64::MAX); // -1, last (see above)
        self.core.cleanup.end();
    }
}

/// Collects the outcomes of one worker batch, completed on I/O threads (or inline) while the
/// worker waits: the worker sees every outcome, each exactly where its name is, before it
/// releases exactly the confirmed names (invariant 4; modelled by
/// `loom_worker_batch_sees_every_outcome`). Its lock and condvar come from the `sync` shim.
struct WorkerBatch {
    results: sync::Mutex<Vec<Option<io::Result<usize>>>>,
    left: sync::Mutex<usize>,
    cv: sync::Condvar,
}

impl WorkerBatch {
    fn new(n: usize) -> Self {
        WorkerBatch {
            results: sync::Mutex::new((0..n).map(|_| None).collect()),
            left: sync::Mutex::new(n),
            cv: sync::Condvar::new(),
        }
    }

    /// Waits until every name of the batch arrived; returns the outcomes, in batch order
    /// (`None`: not attempted).
    fn wait(&self) -> Vec<Option<io::Result<usize>>> {
        {
            let mut left = self.left.lock();
            while *left > 0 {
                self.cv.wait(&mut left);
            }
        }
        std::mem::take(&mut *self.results.lock())
    }

    /// Counts one record as done: completed, or not attempted (its result stays `None`).
    fn arrived(&self) {
        let mut left = self.left.lock();
        *left -= 1;
        if *left == 0 {
            self.cv.notify_all();
        }
    }
}

impl OpSink for WorkerBatch {
    fn complete(&self, token: u64, res: io::Result<usize>) {
        if let Some(slot) = self.results.lock().get_mut(token as usize) {
            *slot = Some(res);
        }
        self.arrived();
    }
}

/// The cleanup worker: runs until [`Cleanup::stop`].
pub(crate) fn worker_loop(core: Arc<Core>) {
    let cl = &core.cleanup;
    let mut rng = core.id | 1;
    loop {
        // Take a batch of ready records, or a sweep job, or wait.
        let mut checked = false;
        let work = {
            let mut q = cl.queue.lock();
            loop {
                if q.stop {
                    return;
                }
                let now = Instant::now();
                let waiting = q.retry_at.filter(|t| *t > now);
                let ready = waiting.is_none() && (!q.records.is_empty() || !q.sweeps.is_empty());
                if ready && core.fault.is_some() && !checked {
                    // The `cleanup::take` fault point, outside the lock (it may pause).
                    checked = true;
                    parking_lot::MutexGuard::unlocked(&mut q, || {
                        let _ = crate::fault::check(&core.fault, FaultPoint::CleanupTake);
                    });
                    continue;
                }
                if !q.records.is_empty() && waiting.is_none() {
                    let n = q.records.len().min(core.cfg.cleanup_batch);
                    let batch: Vec<Record> = q.records.drain(..n).collect();
                    break Work::Records(batch);
                }
                if waiting.is_none()
                    && let Some(p) = q.sweeps.pop_front()
                {
                    break Work::Sweep(p);
                }
                match waiting {
                    Some(t) => {
                        cl.cv.wait_until(&mut q, t);
                    }
                    None => cl.cv.wait(&mut q),
                }
            }
        };
        match work {
            Work::Records(batch) => {
                let failed = run_batch(&core, batch);
                let mut q = cl.queue.lock();
                for r in &failed {
                    q.records.push_back(*r);
                }
                if !failed.is_empty() {
                    Counters::add(&core.counters.cleanup_retries, failed.len() as u64);
                    // xorshift jitter of up to 25% of the delay.
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let base = core.cfg.cleanup_retry_delay;
                    let jitter = base.mul_f64((rng % 1000) as f64 / 4000.0);
                    q.retry_at = Some(Instant::now() + base + jitter);
                } else {
                    q.retry_at = None;
                }
            }
            Work::Sweep(path) => crate::sweep::delete_tree(&core, &path),
        }
    }
}

enum Work {
    Records(Vec<Record>),
    Sweep(PathBuf),
}

/// Batches up to this size run as plain `unlinkat` calls on the worker's thread; larger ones go
/// to the ring, whose io-wq workers unlink in parallel.
const INLINE_BATCH: usize = 64;

/// Deletes one batch of records; returns the ones that failed (whole, in order).
fn run_batch(core: &Arc<Core>, batch: Vec<Record>) -> Vec<Record> {
    let n = batch.len();
    let sink = Arc::new(WorkerBatch::new(n));
    let mut dirs: Vec<Option<Arc<DirEntry>>> = Vec::with_capacity(n);
    for (i, r) in batch.iter().enumerate() {
        let dir = core.dirs.get(r.dir);
        let op = dir.as_ref().map(|d| {
            if r.seg == DIR_RECORD {
                (d.parent.fd.clone(), d.name, true)
            } else {
                (d.parent.fd.clone(), d.segment_rel(r.seg), false)
            }
        });
        dirs.push(dir);
        match op {
            Some((fd, name, rmdir)) => {
                let op = Op {
                    kind: OpKind::Unlink {
                        dir: fd,
                        name,
                        rmdir,
                        point: FaultPoint::CleanupUnlink,
                    },
                    sink: sink.clone(),
                    token: i as u64,
                };
                if n <= INLINE_BATCH {
                    // A small batch costs less as plain syscalls on this (the worker's own)
                    // thread than as two thread hand-offs through a ring.
                    if core.cleanup.stopping() {
                        // Shutting down: what is not started stays queued (not attempted).
                        sink.arrived();
                        continue;
                    }
                    let res = crate::io::psync::perform(&op, &core.fault);
                    op.complete(res);
                } else {
                    core.io.submit(0, op);
                }
            }
            // The directory is gone from the table: nothing of it can be deleted any more.
            None => sink.complete(i as u64, Err(io::Error::from_raw_os_error(errno::ENOENT))),
        }
    }
    let results = sink.wait();
    let mut failed = Vec::new();
    for ((r, res), dir) in batch.into_iter().zip(results).zip(dirs) {
        let ok = match &res {
            Some(Ok(_)) => true,
            Some(Err(e)) if !crate::io::is_abandoned(e) => e.raw_os_error() == Some(errno::ENOENT),
            // Not attempted (the worker or the engine is stopping): back to the queue, not a
            // failure.
            _ => {
                failed.push(r);
                continue;
            }
        };
        if !ok {
            Counters::add(&core.counters.delete_failures, 1);
            failed.push(r);
            continue;
        }
        if r.seg == DIR_RECORD {
            if let Some(d) = &dir {
                core.dirs.remove(d);
            }
        } else {
            core.ledger
                .release_retained(RetainedTicket::from_pages(r.pages));
            if let Some(d) = dir
                && d.file_gone() == DirNext::Remove
            {
                // Counted before this record ends (see `Cleanup::outstanding`).
                remove_dir(core, &d);
            }
        }
        core.cleanup.pending.fetch_sub(1, Ordering::Relaxed);
        Counters::add(&core.counters.cleanup_released, 1);
        core.cleanup.end();
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dir::{DirTable, ProcDir};
    use crate::io::{FileHandle, Reaper};
    use crate::ledger::Ledger;
    use std::path::Path;

    fn task_dir(cleanup: &Arc<Cleanup>) -> Arc<TaskDir> {
        let fd = || crate::dir::open_dir(Path::new("/")).unwrap();
        let parent = Arc::new(ProcDir {
            path: PathBuf::from("/"),
            fd: FileHandle::new(fd(), Reaper::inline()),
            root: 0,
        });
        let table = DirTable::default();
        let entry = table.insert(PathBuf::from("/t"), NameBuf::new(b"t").unwrap(), parent);
        assert!(entry.file_coming());
        Arc::new(TaskDir {
            entry,
            fd: FileHandle::new(fd(), Reaper::inline()),
            cleanup: cleanup.clone(),
        })
    }

    /// A segment dropped without a hand-off keeps its ticket and sends its name to the cleanup
    /// worker: the file may exist, so it is never silently forgotten.
    #[test]
    fn a_segment_dropped_without_a_hand_off_goes_to_the_cleanup_worker() {
        let cleanup = Arc::new(Cleanup::new());
        let ledger = Ledger::new(4, None);
        let dir = task_dir(&cleanup);
        let e = SegmentEntry::new(dir.clone(), 7, ledger.reserve(8192).unwrap());
        drop(e);
        assert_eq!(
            ledger.used(),
            1,
            "the ticket stays held until a confirmed delete"
        );
        assert_eq!(ledger.bytes_used(), 8192);
        assert_eq!(cleanup.pending(), 1);
        assert_eq!(cleanup.snapshot(), vec![(dir.index, 7)]);
        // Released or retained entries end for good: no second record.
        SegmentEntry::new(dir.clone(), 8, ledger.reserve(1).unwrap()).retain(&cleanup);
        assert_eq!(cleanup.pending(), 2);
        drop(SegmentEntry::new(dir, 9, ledger.reserve(1).unwrap()).release());
        assert_eq!(cleanup.pending(), 2);
        assert_eq!(ledger.used(), 2);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// Invariant 4's collection step: two names of a batch complete on two I/O threads (one
    /// confirmed, one failed) and a third is not attempted, while the worker waits. In every
    /// interleaving the worker returns only once all three arrived, and sees each outcome at
    /// its own name: so exactly the confirmed name is released.
    #[test]
    fn loom_worker_batch_sees_every_outcome() {
        loom::model(|| {
            let b = std::sync::Arc::new(WorkerBatch::new(3));
            let b1 = b.clone();
            let t1 = thread::spawn(move || b1.complete(0, Ok(0)));
            let b2 = b.clone();
            let t2 = thread::spawn(move || {
                b2.complete(1, Err(io::Error::from_raw_os_error(errno::EIO)))
            });
            b.arrived(); // name 2: not attempted
            let results = b.wait();
            assert!(
                matches!(results[0], Some(Ok(0))),
                "a confirmed outcome was lost"
            );
            assert!(
                matches!(&results[1], Some(Err(e)) if e.raw_os_error() == Some(errno::EIO)),
                "a failure was lost or misplaced"
            );
            assert!(results[2].is_none());
            t1.join().unwrap();
            t2.join().unwrap();
        });
    }
}
