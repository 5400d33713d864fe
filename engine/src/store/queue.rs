//! The cleanup worker's queue: name-only records of deletes whose outcome was not confirmed,
//! and the orphan sweeps. A record (a directory index, a segment number, the quota pages its
//! ticket holds, when it was queued) is stored packed (`store/records.rs`) and keeps no buffer,
//! fd or mmap alive. Its ticket stays held until the delete is confirmed (or the file is found
//! absent), so a long storage outage stops new spills at admission instead of growing memory.

use std::collections::VecDeque;
use std::path::PathBuf;

use crate::store::records::RecordChunks;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::store::ledger::RetainedTicket;

/// A name-only cleanup record, as it goes in and out of the queue (stored packed:
/// [`RecordChunks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub dir: u32,
    pub seg: u32,
    /// Quota pages of the retained ticket (the ticket itself is implied: every file record
    /// holds exactly one; a directory record holds none).
    pub pages: u32,
    /// Seconds since the engine started when the record was queued. Out of the queue: when the
    /// oldest record of its chunk of 128 was queued (never later than its own).
    pub since: u32,
}

/// What the worker does next.
#[derive(Debug)]
pub(crate) enum Work {
    /// Delete these records' names.
    Records(Vec<Record>),
    /// Delete this claimed directory tree.
    Sweep(PathBuf),
    /// Nothing was ready by the time the caller asked to be woken
    /// ([`CleanupQueue::next_work_until`]): time for its periodic duty.
    Tick,
}

#[derive(Debug)]
struct Queue {
    records: RecordChunks,
    sweeps: VecDeque<PathBuf>,
    stop: bool,
    /// No attempt before this instant (set after a failed batch).
    retry_at: Option<Instant>,
    /// The worker waits on the condvar (no batch or sweep of its own under way):
    /// [`CleanupQueue::take_while_idle`] may hand a batch to another thread instead of waking it.
    worker_waits: bool,
}

/// The cleanup worker's queue of name-only records and orphan sweeps, and its metrics. The
/// worker thread (`cleanup::worker`) takes work from it; every delete path hands failures to it.
#[derive(Debug)]
pub(crate) struct CleanupQueue {
    queue: Mutex<Queue>,
    cv: Condvar,
    pending: AtomicU64,
    /// Every unit of delete work not finished: deletes in flight on an I/O thread, records
    /// pending, orphan sweeps queued or running. Each hand-over (a failed delete becoming a
    /// record) counts the new unit before
    /// it ends the old one, so one load of zero means nothing is left (see
    /// [`CleanupQueue::outstanding`]); two counters read one after the other could both miss a unit
    /// moving between them.
    outstanding: AtomicU64,
    /// Set by [`CleanupQueue::stop`]; read without the queue's lock inside a batch or a sweep, so a
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

impl CleanupQueue {
    /// A queue whose chunk list is reserved for `tickets` records (the ledger's capacity:
    /// each file record holds a ticket), so it never reallocates in use.
    pub(crate) fn new(tickets: usize) -> Self {
        CleanupQueue {
            queue: Mutex::new(Queue {
                records: RecordChunks::with_room_for(tickets),
                sweeps: VecDeque::new(),
                stop: false,
                retry_at: None,
                worker_waits: false,
            }),
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

    /// Hands a file whose delete failed to the worker; its ticket stays held. `dir`: its
    /// process directory's root index.
    pub(crate) fn retain_file(&self, dir: usize, seg: u32, ticket: RetainedTicket) {
        // The capacity stays held; the record carries how much quota the ticket had.
        let pages = ticket.into_pages();
        self.push(Record {
            dir: dir as u32,
            seg,
            pages,
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
        let min = q.records.oldest_since();
        drop(q);
        s.age = min.map_or(0.0, |m| (now_secs - f64::from(m)).max(0.0));
        s.at = Some(now);
        s.age
    }

    /// Asks the worker to stop: it finishes the unlink under way, puts back what it had not
    /// started, and returns.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.queue.lock().stop = true;
        self.cv.notify_all();
    }

    /// True once [`CleanupQueue::stop`] was called.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Lets the worker retry now instead of waiting out its failure delay (woken if anything
    /// is queued).
    pub(crate) fn retry_now(&self) {
        let mut q = self.queue.lock();
        q.retry_at = None;
        if !q.records.is_empty() || !q.sweeps.is_empty() {
            self.cv.notify_all();
        }
    }

    /// Up to `batch` records, delay or not, for the caller to delete on its own thread: only
    /// while the worker waits and when at most `most` are queued (else none). The caller puts
    /// them back with [`CleanupQueue::put_back`] as the worker does.
    pub(crate) fn take_while_idle(&self, most: usize, batch: usize) -> Vec<Record> {
        let mut q = self.queue.lock();
        if !q.worker_waits || q.records.len() > most {
            return Vec::new();
        }
        take(&mut q.records, batch)
    }

    /// The records queued now, oldest first (read-only: reports, `Engine::list_files`, tests
    /// of the rotation). A batch being deleted is not in the queue meanwhile.
    pub(crate) fn records(&self) -> Vec<Record> {
        self.queue.lock().records.iter().collect()
    }

    /// How long ago `r` was queued (whole seconds; see [`Record::since`]).
    pub(crate) fn age(&self, r: &Record) -> Duration {
        let now = self.epoch.elapsed().as_secs();
        Duration::from_secs(now.saturating_sub(u64::from(r.since)))
    }

    /// The worker's next work: up to `batch` ready records, else a sweep; waits for either
    /// (and out the retry delay after a failed batch). `None` once stopped. `before_take`, if
    /// given, runs once per wait, outside the lock, when work is ready (the `cleanup::take`
    /// fault point).
    #[cfg(test)]
    pub(crate) fn next_work(&self, batch: usize, before_take: Option<&dyn Fn()>) -> Option<Work> {
        self.next_work_until(batch, before_take, None)
    }

    /// [`next_work`](Self::next_work), but returns [`Work::Tick`] once `tick_at` has passed
    /// with nothing ready to take (ready work always goes first).
    pub(crate) fn next_work_until(
        &self,
        batch: usize,
        before_take: Option<&dyn Fn()>,
        tick_at: Option<Instant>,
    ) -> Option<Work> {
        let mut checked = false;
        let mut q = self.queue.lock();
        loop {
            if q.stop {
                return None;
            }
            let now = Instant::now();
            let waiting = q.retry_at.filter(|t| *t > now);
            let ready = waiting.is_none() && (!q.records.is_empty() || !q.sweeps.is_empty());
            if ready
                && !checked
                && let Some(f) = before_take
            {
                // Outside the lock: a fault point may pause.
                checked = true;
                parking_lot::MutexGuard::unlocked(&mut q, f);
                continue;
            }
            if !q.records.is_empty() && waiting.is_none() {
                return Some(Work::Records(take(&mut q.records, batch)));
            }
            if waiting.is_none()
                && let Some(p) = q.sweeps.pop_front()
            {
                return Some(Work::Sweep(p));
            }
            if tick_at.is_some_and(|t| t <= now) {
                return Some(Work::Tick);
            }
            q.worker_waits = true;
            match waiting.into_iter().chain(tick_at).min() {
                Some(t) => {
                    self.cv.wait_until(&mut q, t);
                }
                None => self.cv.wait(&mut q),
            }
            q.worker_waits = false;
        }
    }

    /// Puts a batch's failed records back at the end of the queue, with no attempt before
    /// `retry_at` (`None` after a batch with no failure: the next ready record goes at once).
    /// After a failure a waiting worker is woken to wait for the new `retry_at` (a caller's
    /// batch failed).
    pub(crate) fn put_back(&self, failed: &[Record], retry_at: Option<Instant>) {
        let mut q = self.queue.lock();
        for r in failed {
            q.records.push_back(*r);
        }
        q.retry_at = retry_at;
        if !failed.is_empty() {
            self.cv.notify_all();
        }
    }

    /// `n` records' deletes are confirmed: they are no longer pending.
    pub(crate) fn records_done(&self, n: u64) {
        self.pending.fetch_sub(n, Ordering::Relaxed);
        self.outstanding.fetch_sub(n, Ordering::SeqCst);
    }
}

/// The first `batch` records (all, if fewer), oldest first.
fn take(records: &mut RecordChunks, batch: usize) -> Vec<Record> {
    let n = records.len().min(batch);
    let mut taken = Vec::with_capacity(n);
    taken.extend(std::iter::from_fn(|| records.pop_front()).take(n));
    taken
}

/// The queue's bookkeeping step by step, without a worker thread (the engine tests drive it
/// through the worker; these pin what each method returns, which cargo-mutants showed the
/// engine tests left loose).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn rec(seg: u32) -> Record {
        Record {
            dir: 1,
            seg,
            pages: seg + 100,
            since: 0,
        }
    }

    /// The queue in order, as (directory index, segment number).
    fn snapshot(q: &CleanupQueue) -> Vec<(u32, u32)> {
        q.records().iter().map(|r| (r.dir, r.seg)).collect()
    }

    fn records(w: Option<Work>) -> Vec<u32> {
        match w {
            Some(Work::Records(v)) => v.iter().map(|r| r.seg).collect(),
            other => panic!("want records, got {other:?}"),
        }
    }

    #[test]
    fn records_come_out_in_batches_in_order_and_count_as_work() {
        let q = CleanupQueue::new(64);
        assert_eq!((q.pending(), q.outstanding()), (0, 0));
        for seg in 0..5 {
            q.push(rec(seg));
        }
        assert_eq!((q.pending(), q.outstanding()), (5, 5));
        assert_eq!(snapshot(&q), (0..5).map(|s| (1, s)).collect::<Vec<_>>());
        let (queued, sweeps) = (q.records(), q.sweeps_pending());
        assert_eq!(queued, (0..5).map(rec).collect::<Vec<_>>());
        assert_eq!(sweeps, 0);
        assert_eq!(records(q.next_work(2, None)), [0, 1]);
        assert_eq!(records(q.next_work(2, None)), [2, 3]);
        // Taken is not done: still pending until confirmed.
        assert_eq!(q.pending(), 5);
        q.records_done(1);
        assert_eq!((q.pending(), q.outstanding()), (4, 4));
        // A failed batch goes to the back; with no retry delay it is ready at once.
        q.put_back(&[rec(0), rec(1)], None);
        assert_eq!(snapshot(&q), [(1, 4), (1, 0), (1, 1)]);
        assert_eq!(records(q.next_work(10, None)), [4, 0, 1]);
    }

    #[test]
    fn begin_and_end_count_units_of_work() {
        let q = CleanupQueue::new(64);
        q.begin(3);
        assert_eq!(q.outstanding(), 3);
        q.end();
        assert_eq!(q.outstanding(), 2);
        q.end();
        q.end();
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn a_failed_batch_waits_out_its_retry_delay_unless_told_to_retry_now() {
        let q = CleanupQueue::new(64);
        q.push(rec(1));
        let taken = records(q.next_work(8, None));
        let delay = Duration::from_millis(300);
        q.put_back(&[rec(1)], Some(Instant::now() + delay));
        let t0 = Instant::now();
        assert_eq!(records(q.next_work(8, None)), taken);
        let waited = t0.elapsed();
        assert!(waited >= delay - Duration::from_millis(5), "{waited:?}");
        // Again, but `retry_now` lets it go at once.
        q.put_back(&[rec(1)], Some(Instant::now() + Duration::from_secs(60)));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                q.retry_now();
            });
            let t0 = Instant::now();
            assert_eq!(records(q.next_work(8, None)), taken);
            assert!(t0.elapsed() < Duration::from_secs(30));
        });
    }

    /// Waits until a worker thread waits on the queue's condvar.
    fn until_the_worker_waits(q: &CleanupQueue) {
        let t0 = Instant::now();
        while !q.queue.lock().worker_waits {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the worker never waited"
            );
            std::thread::yield_now();
        }
    }

    /// `retry_now`'s caller takes a batch itself only while the worker waits, only when at
    /// most `most` records are queued, at most `batch` of them, their delay or not; what it
    /// puts back wakes the waiting worker for the new delay.
    #[test]
    fn a_caller_takes_a_small_batch_only_while_the_worker_waits() {
        let q = CleanupQueue::new(64);
        for seg in 0..3 {
            q.push(rec(seg));
        }
        assert!(q.take_while_idle(8, 8).is_empty(), "no worker waits");
        let taken = records(q.next_work(8, None));
        assert_eq!(taken, [0, 1, 2]);
        let later = Instant::now() + Duration::from_secs(60);
        q.put_back(&[rec(0), rec(1), rec(2)], Some(later));
        let tick = Instant::now() + Duration::from_millis(300);
        std::thread::scope(|s| {
            let worker = s.spawn(|| q.next_work_until(8, None, Some(tick)));
            until_the_worker_waits(&q);
            assert!(
                q.take_while_idle(2, 8).is_empty(),
                "3 queued, at most 2 asked"
            );
            let mine: Vec<u32> = q.take_while_idle(3, 2).iter().map(|r| r.seg).collect();
            assert_eq!(
                mine,
                [0, 1],
                "a batch of at most 2, the delay notwithstanding"
            );
            assert!(
                matches!(worker.join().unwrap(), Some(Work::Tick)),
                "record 2 still waits out its delay"
            );
        });
        // A failed caller's batch goes back with a delay shorter than the worker's wait: the
        // worker is woken and takes it then, not at its tick.
        let t0 = Instant::now();
        let tick = t0 + Duration::from_secs(20);
        std::thread::scope(|s| {
            let worker = s.spawn(|| q.next_work_until(8, None, Some(tick)));
            until_the_worker_waits(&q);
            q.put_back(&[rec(0)], Some(Instant::now() + Duration::from_millis(50)));
            assert_eq!(records(worker.join().unwrap()), [2, 0]);
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        });
    }

    /// `retry_now` ends a sweep's retry delay too: a worker waiting it out is woken.
    #[test]
    fn retry_now_wakes_a_worker_waiting_out_a_sweeps_delay() {
        let q = CleanupQueue::new(64);
        q.sweep_later(PathBuf::from("/s"), Duration::from_secs(60));
        let t0 = Instant::now();
        let tick = t0 + Duration::from_secs(30);
        std::thread::scope(|s| {
            let worker = s.spawn(|| q.next_work_until(8, None, Some(tick)));
            until_the_worker_waits(&q);
            q.retry_now();
            assert!(matches!(worker.join().unwrap(), Some(Work::Sweep(_))));
        });
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    /// A record's age counts from its `since` (its chunk's oldest) to now, in whole seconds.
    #[test]
    fn a_records_age_counts_from_its_since() {
        let q = CleanupQueue {
            epoch: Instant::now() - Duration::from_secs(100),
            ..CleanupQueue::new(64)
        };
        q.push(Record {
            since: 40,
            ..rec(1)
        });
        assert_eq!(q.age(&q.records()[0]), Duration::from_secs(60));
        let later = Record {
            since: 200,
            ..rec(2)
        };
        assert_eq!(q.age(&later), Duration::ZERO, "never negative");
    }

    #[test]
    fn sweeps_come_after_ready_records_and_are_counted() {
        let q = CleanupQueue::new(64);
        q.sweep(PathBuf::from("/a"));
        q.push(rec(3));
        assert_eq!((q.sweeps_pending(), q.outstanding()), (1, 2));
        assert_eq!(q.sweeps_pending(), 1);
        assert_eq!(records(q.next_work(8, None)), [3]);
        match q.next_work(8, None) {
            Some(Work::Sweep(p)) => assert_eq!(p, PathBuf::from("/a")),
            other => panic!("{other:?}"),
        }
        assert_eq!(q.sweeps_pending(), 0);
        // A sweep that failed again waits out the delay.
        q.sweep_later(PathBuf::from("/b"), Duration::from_millis(200));
        assert_eq!(q.sweeps_pending(), 1);
        let t0 = Instant::now();
        assert!(matches!(q.next_work(8, None), Some(Work::Sweep(_))));
        assert!(
            t0.elapsed() >= Duration::from_millis(190),
            "{:?}",
            t0.elapsed()
        );
        // One a shutdown interrupted is only put back for reports.
        q.sweep_left(std::path::Path::new("/c"));
        assert_eq!(q.sweeps_pending(), 1);
        assert_eq!(
            q.outstanding(),
            2,
            "sweep_later and sweep_left count no new work"
        );
    }

    #[test]
    fn the_take_hook_runs_once_per_wait_when_work_is_ready() {
        let q = CleanupQueue::new(64);
        let calls = AtomicU64::new(0);
        let hook = || {
            calls.fetch_add(1, Ordering::SeqCst);
        };
        q.push(rec(1));
        assert_eq!(records(q.next_work(8, Some(&hook))), [1]);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_tick_comes_when_its_time_passes_with_nothing_ready_and_never_before_ready_work() {
        let q = CleanupQueue::new(64);
        let t0 = Instant::now();
        let at = t0 + std::time::Duration::from_millis(30);
        assert!(matches!(
            q.next_work_until(8, None, Some(at)),
            Some(Work::Tick)
        ));
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(30),
            "not before its time"
        );
        // Ready work goes first, even past the tick's time.
        q.push(rec(7));
        assert_eq!(records(q.next_work_until(8, None, Some(t0))), [7]);
        assert!(matches!(
            q.next_work_until(8, None, Some(t0)),
            Some(Work::Tick)
        ));
        q.stop();
        assert!(
            q.next_work_until(8, None, Some(t0)).is_none(),
            "a stop ends it"
        );
    }

    #[test]
    fn a_stop_ends_the_wait_and_is_seen_without_the_lock() {
        let q = CleanupQueue::new(64);
        assert!(!q.stopping());
        std::thread::scope(|s| {
            let w = s.spawn(|| q.next_work(8, None));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!w.is_finished(), "an empty queue waits");
            q.stop();
            assert!(w.join().unwrap().is_none());
        });
        assert!(q.stopping());
        q.push(rec(1));
        assert!(q.next_work(8, None).is_none(), "stopped: no more work");
    }

    #[test]
    fn the_oldest_age_is_the_oldest_record_sampled_once_a_second() {
        let q = CleanupQueue::new(64);
        assert_eq!(q.oldest_age(), 0.0, "no record: age 0");
        let q = CleanupQueue {
            epoch: Instant::now() - Duration::from_secs(100),
            ..CleanupQueue::new(64)
        };
        assert_eq!(q.now_secs(), 100);
        q.push(Record {
            since: 40,
            ..rec(1)
        });
        q.push(Record {
            since: 90,
            ..rec(2)
        });
        let age = q.oldest_age();
        assert!((60.0..61.0).contains(&age), "{age}");
        // Within the second the sample stands, even after the record went.
        let _ = q.next_work(8, None);
        assert_eq!(q.oldest_age(), age);
    }
}
