//! What other threads touch: the writer's abort hook and file list, and its in-flight
//! accounting.
//!
//! The abort protocol (invariant 2 in ARCHITECTURE.md): the writer's abort hook, registered with the task
//! scope, sets the abort flag and takes the file list under one lock, then deletes the files.
//! After every file creation the writer takes that lock and checks the flag: if set, it deletes
//! the file it just made and fails with `Aborted`; if not, it records the file under the same
//! lock. Every file has exactly one deleter, and the writer never creates anything in a
//! directory it does not hold open (so a deleted directory is never re-created).

use std::io;
use std::sync::Arc;
use std::task::Waker;

use parking_lot::{Condvar, Mutex};

use super::stage::Queued;
use crate::cleanup::delete_segments;
use crate::io::{Compress, CompressSink, OpSink, OpSlot};
use crate::shared::EngineShared;
use crate::spill::task::Member;
use crate::store::entry::SegmentEntry;
use crate::sync;

/// The files a writer created, shared with its abort hook: the abort protocol (see the module
/// docs) on a list of `T`, so loom can check it alone (`loom_abortable_files_*` below). Every
/// `T` recorded or refused has exactly one owner: the hook ([`AbortableFiles::abort`]), the
/// hand-off ([`AbortableFiles::take_for_hand_off`]), the writer's own cleanup
/// ([`AbortableFiles::take_own`]), or, when refused by [`AbortableFiles::record`], the writer
/// that made it.
#[derive(Debug)]
pub(super) struct AbortableFiles<T> {
    list: sync::Mutex<FileList<T>>,
    /// The hook ran. Set under the lock and never cleared, so it also serves checks that need
    /// no lock. `FileList::state` says who holds the files; this flag says whether the hook
    /// ever ran, which a hook running after a release (leaving the list `Released`) sets too.
    aborted: sync::AtomicBool,
}

/// The list behind [`AbortableFiles`]' lock.
#[derive(Debug)]
pub(super) struct FileList<T> {
    pub(super) entries: Vec<T>,
    state: Files,
}

/// Where the file list is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Files {
    /// The writer records files; nobody took them yet.
    Open,
    /// The hook ran: everything in `entries` was taken and deleted by it.
    Aborted,
    /// The files went to a `SpilledState` or were deleted by the writer itself. A hook that
    /// runs later finds nothing to take, and the list stays `Released`.
    Released,
}

impl<T> AbortableFiles<T> {
    #[cfg(test)]
    pub(super) fn new() -> Self {
        Self::with_list(Vec::new())
    }

    /// A new list that records into `entries` (empty; its capacity is reused).
    pub(super) fn with_list(entries: Vec<T>) -> Self {
        debug_assert!(entries.is_empty());
        AbortableFiles {
            list: sync::Mutex::new(FileList {
                entries,
                state: Files::Open,
            }),
            aborted: sync::AtomicBool::new(false),
        }
    }

    /// The list, locked: to read or update entries already recorded.
    pub(super) fn lock(&self) -> sync::MutexGuard<'_, FileList<T>> {
        self.list.lock()
    }

    /// True once the hook ran (no lock: a hint for early exits; decisions take the lock).
    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(sync::Ordering::Acquire)
    }

    /// The writer, after each file creation: records the file and returns its index, or
    /// gives it back (`Err`) if the hook already ran, or if the writer already gave its files
    /// up (an async rotation that ended on an offload thread after its writer failed or was
    /// dropped): then the caller deletes it.
    pub(super) fn record(&self, t: T) -> std::result::Result<usize, T> {
        let mut l = self.list.lock();
        if (self.hook_ran(&l) && !cfg!(feature = "broken-skip-abort-check"))
            || l.state == Files::Released
        {
            return Err(t);
        }
        l.entries.push(t);
        Ok(l.entries.len() - 1)
    }

    /// Whether the hook ran: `Aborted`, or `Released` before the hook came (which then only
    /// set the flag). Takes the locked list (`_held`) because the hook sets the flag under that
    /// lock: read there, it decides.
    fn hook_ran(&self, _held: &FileList<T>) -> bool {
        self.is_aborted()
    }

    /// The abort hook: sets the flag and takes the files to delete, under one lock; `None`
    /// if the writer already released them (handed off or deleted).
    pub(super) fn abort(&self) -> Option<Vec<T>> {
        let mut l = self.list.lock();
        // Set the flag first, under the lock the writer checks after each creation.
        self.aborted.store(true, sync::Ordering::Release);
        match l.state {
            Files::Released => None,
            Files::Open | Files::Aborted => {
                l.state = Files::Aborted;
                Some(std::mem::take(&mut l.entries))
            }
        }
    }

    /// `finish`: takes the files to hand them to a state; `None` if the hook ran (it deletes
    /// them).
    pub(super) fn take_for_hand_off(&self) -> Option<Vec<T>> {
        let mut l = self.list.lock();
        if self.hook_ran(&l) {
            return None;
        }
        l.state = Files::Released;
        Some(std::mem::take(&mut l.entries))
    }

    /// Takes back the file recorded last, at `index`, if the list is still the writer's (a
    /// segment opened ahead of need that `finish` did not use): then the caller owns it.
    /// `None` if the hook or a release took the list, or `index` is not the last entry.
    pub(super) fn take_last(&self, index: usize) -> Option<T> {
        let mut l = self.list.lock();
        if l.state != Files::Open || self.hook_ran(&l) || l.entries.len() != index + 1 {
            return None;
        }
        l.entries.pop()
    }

    /// A failed or dropped writer: takes its files to delete them; `None` if the hook ran or
    /// they were already released.
    pub(super) fn take_own(&self) -> Option<Vec<T>> {
        let mut l = self.list.lock();
        match l.state {
            Files::Aborted | Files::Released => None,
            Files::Open => {
                l.state = Files::Released;
                Some(std::mem::take(&mut l.entries))
            }
        }
    }
}

/// The writer's abort hook and file list.
pub(super) struct WriterShared {
    core: Arc<EngineShared>,
    lane: usize,
    pub(super) files: AbortableFiles<SegmentEntry>,
    /// The writes in flight. The ops' completion sink: an I/O thread holds it (not the whole
    /// spare) until it dropped a completed op, so the spare can be recycled the moment the
    /// writer is done, and the tracker with it once nothing is in flight.
    pub(super) tracker: Arc<Tracker>,
    /// The write a blocking `finish` may take back while it is still queued (see
    /// `io::OpSlot`); kept with the spare like the tracker.
    pub(super) claim: Arc<OpSlot>,
    /// Bytes handed to writes in the open segment (its length so far), for the scope's
    /// usage: the open segment counts what it holds, not the whole segment its ticket
    /// reserves.
    pub(super) open_written: std::sync::atomic::AtomicU64,
}

impl WriterShared {
    /// A writer's shared part on `lane`: a recycled one (from `core.writer_spares`) if there
    /// is one, else a new one; its file list has room for one segment when a recycled list
    /// (`core.entry_lists`) is there.
    pub(super) fn make(core: &Arc<EngineShared>, lane: usize) -> Arc<Self> {
        if let Some(spare) = core.writer_spares.take()
            && let Ok(mut shared) = spare.downcast::<WriterShared>()
            && let Some(w) = Arc::get_mut(&mut shared)
        {
            // Kept as new (see `keep_spare`): only the lane is the new writer's.
            w.lane = lane;
            return shared;
        }
        Arc::new(WriterShared::fresh(
            core.clone(),
            lane,
            Arc::default(),
            Arc::default(),
        ))
    }

    fn fresh(
        core: Arc<EngineShared>,
        lane: usize,
        tracker: Arc<Tracker>,
        claim: Arc<OpSlot>,
    ) -> Self {
        let list = core.entry_lists.take().unwrap_or_default();
        WriterShared {
            core,
            lane,
            files: AbortableFiles::with_list(list),
            tracker,
            claim,
            open_written: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The writer is done with `this` (its files handed off, deleted or taken by the hook):
    /// if nobody else holds it (no op in flight, no registry entry), it is reset as new and
    /// kept for the next writer. A list still holding files is never reset.
    pub(super) fn keep_spare(this: &mut Arc<Self>) {
        if Arc::weak_count(this) != 0 {
            return;
        }
        let Some(w) = Arc::get_mut(this) else { return };
        if !w.files.lock().entries.is_empty() {
            return;
        }
        let core = w.core.clone();
        // With nothing in flight the tracker is reset and kept: an I/O thread may still hold
        // it for a moment, only to drop it (a completion's last steps, `notify_all` and the
        // waker it took, touch no state the reset clears). With writes or compressions still
        // in flight (a writer dropped mid-write) they will complete into it: the spare gets a
        // new one. Its codec stage is empty (written, or given up) and keeps its slots.
        let tracker = {
            let mut st = w.tracker.st.lock();
            if st.inflight == 0 && st.compressing == 0 {
                st.error = None;
                st.waker = None;
                st.closed = false;
                None
            } else {
                Some(Arc::default())
            }
        }
        .unwrap_or_else(|| w.tracker.clone());
        // The claim slot stays too: an op still in it is this writer's, and a claim still
        // queued runs it; the next writer's claims go past a full slot.
        let claim = w.claim.clone();
        *w = WriterShared::fresh(core, w.lane, tracker, claim);
        let spare: crate::shared::Spare = this.clone();
        // A full or closed spare list gives the clone back; it drops here.
        let _ = this.core.writer_spares.put(spare);
    }
}

impl OpSink for Tracker {
    fn complete(&self, token: u64, res: io::Result<usize>) {
        self.op_done(token, res);
    }
}

impl CompressSink for Tracker {
    /// A buffer of the writer's codec stage comes back from the codec pool: into its slot, to
    /// be written in order (the writer is woken), or dropped (back to the buffer pool) if the
    /// writer gave its stage up.
    fn compressed(&self, job: Compress) {
        let (waker, dropped) = {
            let mut s = self.st.lock();
            let s = &mut *s;
            s.compressing -= 1;
            let n = s.stage.len().max(1);
            match s.stage.get_mut(job.seq as usize % n) {
                Some(Some(q)) if !s.closed => {
                    q.done = Some(job);
                    (s.waker.take(), None)
                }
                _ => (None, Some(job)),
            }
        };
        drop(dropped);
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl Member for WriterShared {
    fn usage(&self) -> crate::spill::task::SpillUsage {
        let l = self.files.lock();
        // An open segment's length is set when it is sealed: until then it counts what was
        // handed to its writes, or its allocation when larger (direct mode, `preallocate`).
        // Before, it counted the reservation of a whole segment (issue 25).
        let open = self.open_written.load(std::sync::atomic::Ordering::Relaxed);
        let bytes = l
            .entries
            .iter()
            .map(|e| {
                if e.len > 0 {
                    e.len.max(e.allocated)
                } else {
                    open.max(e.allocated)
                }
            })
            .sum();
        crate::spill::task::SpillUsage::of_writer(l.entries.len() as u64, bytes)
    }

    fn files(&self, out: &mut Vec<crate::store::entry::EntryView>) {
        let l = self.files.lock();
        out.extend(l.entries.iter().map(SegmentEntry::view));
    }

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

/// In-flight write accounting: completions arrive here from an I/O thread, and compressed
/// buffers of the writer's codec stage (`stage.rs`) from the codec pool.
#[derive(Default)]
pub(super) struct Tracker {
    pub(super) st: Mutex<TrackState>,
    pub(super) cv: Condvar,
}

#[derive(Default)]
pub(super) struct TrackState {
    pub(super) inflight: usize,
    /// Bytes the device has written for this writer so far: `Auto` measures the device's
    /// rate from them ([`super::codec::CodecState::completed`]).
    pub(super) completed: u64,
    /// First failure: the segment it hit and the OS error.
    pub(super) error: Option<(u32, io::Error)>,
    pub(super) waker: Option<Waker>,
    /// Compressions handed to the codec pool and not back yet.
    pub(super) compressing: usize,
    /// The codec stage's buffers, by their number modulo `queue_depth` (the slots, made at
    /// the first use, are kept with the tracker).
    pub(super) stage: Vec<Option<Queued>>,
    /// The writer gave its stage up (failed, cancelled, dropped): compressions coming back
    /// drop their buffers.
    pub(super) closed: bool,
}

impl Tracker {
    /// Waits until none of the writer's writes is in flight, or until `deadline`; true if
    /// none is. An op lets go of its file before it counts itself done (`Op::complete`).
    pub(super) fn wait_idle(&self, deadline: std::time::Instant) -> bool {
        let mut s = self.st.lock();
        while s.inflight > 0 {
            if self.cv.wait_until(&mut s, deadline).timed_out() {
                return s.inflight == 0;
            }
        }
        true
    }

    fn op_done(&self, token: u64, res: io::Result<usize>) {
        let waker = {
            let mut s = self.st.lock();
            s.inflight -= 1;
            match res {
                Ok(n) => s.completed += n as u64,
                Err(e) if s.error.is_none() => s.error = Some((token as u32, e)),
                Err(_) => {}
            }
            s.waker.take()
        };
        self.cv.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The abort list and the write tracker step by step, on plain numbers (the loom model checks
/// the interleavings; these pin each method's outcome, which cargo-mutants showed only the
/// engine tests touched, and those race).
#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    #[test]
    fn records_are_numbered_in_order_until_the_hook_runs() {
        let f = AbortableFiles::new();
        assert!(!f.is_aborted());
        assert_eq!(f.record(10), Ok(0));
        assert_eq!(f.record(11), Ok(1));
        assert_eq!(f.record(12), Ok(2));
        assert_eq!(f.lock().entries, [10, 11, 12]);
        assert_eq!(
            f.abort(),
            Some(vec![10, 11, 12]),
            "the hook takes every file"
        );
        assert!(f.is_aborted());
        assert_eq!(
            f.record(13),
            Err(13),
            "a file made after the hook is refused"
        );
        assert!(f.lock().entries.is_empty());
        assert_eq!(f.take_for_hand_off(), None, "no hand-off after the hook");
        assert_eq!(f.take_own(), None, "the hook owns the cleanup");
        assert_eq!(f.abort(), Some(vec![]), "a second abort finds nothing left");
    }

    #[test]
    fn a_hand_off_takes_every_file_and_the_hook_then_nothing() {
        let f = AbortableFiles::new();
        assert_eq!(f.record(1), Ok(0));
        assert_eq!(f.record(2), Ok(1));
        assert_eq!(f.take_for_hand_off(), Some(vec![1, 2]));
        assert_eq!(f.abort(), None, "handed-off files are the state's");
        assert!(f.is_aborted(), "the flag is set all the same");
        assert_eq!(f.take_own(), None);
    }

    #[test]
    fn a_failed_writer_takes_its_own_files_once() {
        let f = AbortableFiles::new();
        assert_eq!(f.record(5), Ok(0));
        assert_eq!(f.take_own(), Some(vec![5]));
        assert_eq!(f.take_own(), None, "taken once");
        assert_eq!(f.abort(), None, "the hook finds them released");
    }

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_tracker_counts_completions_and_keeps_the_first_error() {
        let t = Tracker::default();
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        {
            let mut s = t.st.lock();
            s.inflight = 4;
            s.waker = Some(Waker::from(woken.clone()));
        }
        t.complete(7, Ok(4096));
        {
            let s = t.st.lock();
            assert_eq!(s.inflight, 3);
            assert_eq!(s.completed, 4096, "the device's bytes are counted");
            assert!(s.error.is_none(), "a success is no error");
            assert!(s.waker.is_none(), "the waker is taken");
        }
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the writer is woken");
        t.complete(10, Ok(1000));
        assert_eq!(t.st.lock().completed, 5096, "and summed");
        t.complete(8, Err(io::Error::from_raw_os_error(libc::EIO)));
        t.complete(9, Err(io::Error::from_raw_os_error(libc::ENOSPC)));
        let s = t.st.lock();
        assert_eq!(s.inflight, 0);
        assert_eq!(s.completed, 5096, "a failed write completes no bytes");
        let (token, e) = s.error.as_ref().unwrap();
        assert_eq!(
            (*token, e.raw_os_error()),
            (8, Some(libc::EIO)),
            "the first error wins"
        );
    }

    /// A compression comes back into its slot (number modulo the slots) and wakes the writer;
    /// into a closed stage, or a slot not waiting for it, its buffer goes back to the pool.
    #[test]
    fn the_tracker_takes_compressions_back_into_their_slots_until_closed() {
        use crate::format::block::Codec;
        use crate::io::BufferPool;
        let pool = BufferPool::new(4096, 0, 4, 1 << 20);
        let held = || pool.stats().3;
        let job = |seq| Compress {
            buf: pool.try_get(0).unwrap(),
            from: 0,
            codec: Codec::Lz4,
            nanos: 7,
            seq,
        };
        let waiting = || Queued {
            block: None,
            pad: false,
            last: false,
            bound: 0,
            done: None,
        };
        let t = Tracker::default();
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        {
            let mut s = t.st.lock();
            s.stage.resize_with(2, || None);
            s.stage[1] = Some(waiting());
            s.compressing = 3;
            s.waker = Some(Waker::from(woken.clone()));
        }
        t.compressed(job(5));
        {
            let s = t.st.lock();
            assert_eq!(s.compressing, 2);
            let back = s.stage[1].as_ref().and_then(|q| q.done.as_ref());
            assert_eq!(
                back.map(|d| (d.seq, d.nanos)),
                Some((5, 7)),
                "in slot 5 % 2"
            );
            assert!(s.stage[0].is_none());
            assert!(s.waker.is_none(), "the waker is taken");
        }
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "the writer is woken");
        assert_eq!(held(), 4096, "the buffer waits in its slot");
        t.compressed(job(4));
        assert_eq!(t.st.lock().compressing, 1);
        assert_eq!(
            held(),
            4096,
            "slot 0 waits for nothing: its buffer is dropped"
        );
        t.st.lock().closed = true;
        t.st.lock().stage[0] = Some(waiting());
        t.compressed(job(2));
        let s = t.st.lock();
        assert_eq!(s.compressing, 0);
        assert!(s.stage[0].as_ref().is_some_and(|q| q.done.is_none()));
        assert_eq!(held(), 4096, "a closed stage drops what comes back");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
    }

    /// `wait_idle` returns at once with nothing in flight, waits for the last completion,
    /// and gives up at its deadline (false) while writes are still in flight.
    #[test]
    fn wait_idle_waits_for_the_last_write_or_its_deadline() {
        use std::time::{Duration, Instant};
        let t = Arc::new(Tracker::default());
        let start = Instant::now();
        assert!(t.wait_idle(start + Duration::from_secs(5)));
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "nothing in flight: no wait"
        );

        t.st.lock().inflight = 2;
        let start = Instant::now();
        assert!(
            !t.wait_idle(start + Duration::from_millis(30)),
            "two still in flight"
        );
        assert!(start.elapsed() >= Duration::from_millis(30));

        let done = {
            let t = t.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                t.complete(1, Ok(1));
                std::thread::sleep(Duration::from_millis(20));
                t.complete(2, Ok(1));
            })
        };
        let start = Instant::now();
        assert!(
            t.wait_idle(start + Duration::from_secs(5)),
            "both completed"
        );
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(40) && waited < Duration::from_secs(4),
            "{waited:?}"
        );
        done.join().unwrap();
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
