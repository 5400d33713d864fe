//! Deleting files: the normal delete path ([`delete_segments`]: one unlink per file queued to
//! an I/O thread; confirmed or absent names release their tickets, the others go to the
//! cleanup worker's queue, `store/queue.rs`, tickets held), the segment pool's trims, the one
//! reading of an unlink's outcome ([`Unlinked`]), the cleanup worker that retries the queued
//! names (`worker`) and the crash sweep (`sweep`).

pub(crate) mod sweep;
mod worker;

pub(crate) use worker::{retry_now, worker_loop};

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::fault::FaultPoint;
use crate::io::{NameBuf, Op, OpKind, OpSink};
use crate::metrics::Counters;
use crate::shared::EngineShared;
use crate::store::entry::SegmentEntry;
use crate::sys::errno;

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

/// What the cleanup worker still holds, with up to five of the oldest paths.
pub(crate) fn report(core: &EngineShared) -> CleanupReport {
    let queue = &core.store.cleanup;
    let mut oldest = queue.records();
    oldest.sort_by_key(|r| r.since);
    let examples = oldest.iter().take(5);
    let examples =
        examples.filter_map(|r| Some(core.store.dir(r.dir as usize)?.segment_path(r.seg)));
    CleanupReport {
        pending: queue.pending(),
        oldest_age_secs: queue.oldest_age(),
        examples: examples.collect(),
        sweeps_pending: queue.sweeps_pending(),
    }
}

/// Queues the deletes of `entries` on an I/O thread and returns at once. Confirmed (or absent)
/// names release their tickets; the others go to the cleanup worker with their tickets.
pub(crate) fn delete_segments(core: &Arc<EngineShared>, lane: usize, entries: Vec<SegmentEntry>) {
    if entries.is_empty() {
        return;
    }
    let n = entries.len();
    core.store.cleanup.begin(n as u64);
    Counters::add(&core.counters.deletes_in_flight, n as u64);
    let batch = Arc::new(DeleteBatch {
        core: core.clone(),
        mark: core.store.delete_marks.begin(),
        left: std::sync::atomic::AtomicUsize::new(n),
        started: std::time::Instant::now(),
        // `Option<SegmentEntry>` has the size of `SegmentEntry`: this reuses the allocation.
        entries: Mutex::new(entries.into_iter().map(Some).collect()),
    });
    for i in 0..n {
        // Read under the lock: a completion may already have taken an earlier entry.
        let target = batch.entries.lock()[i]
            .as_ref()
            .map(|e| (e.dir.fd.clone(), NameBuf::segment(e.seg)));
        let Some((dir, name)) = target else { continue };
        core.io.submit(
            lane,
            Op {
                kind: OpKind::Unlink {
                    dir,
                    name,
                    point: FaultPoint::IoUnlink,
                },
                sink: batch.clone(),
                token: i as u64,
            },
        );
    }
}

/// A batch of segment deletes in flight on the normal path.
struct DeleteBatch {
    core: Arc<EngineShared>,
    /// Its number in `Store::delete_marks`, ended when its last file has an outcome.
    mark: u64,
    /// Files without an outcome yet.
    left: std::sync::atomic::AtomicUsize,
    /// When the batch was queued (each unlink's latency counts from here).
    started: std::time::Instant,
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
        c.latency.delete.record_since(self.started);
        let outcome = Unlinked::of(&res);
        if outcome.count(c) {
            drop(entry.release());
        } else {
            if outcome == Unlinked::NotStarted {
                tracing::debug!(path = %entry.path().display(),
                    "segment delete not started before shutdown's deadline; left for the next open");
            } else {
                tracing::warn!(path = %entry.path().display(), error = ?res.err(),
                    "segment delete failed; handing its name to the cleanup worker");
            }
            entry.retain(&self.core.store.cleanup);
        }
        // Last: until the outcome is recorded (ticket released or record queued),
        // the delete counts as in flight, so `pending_deletes` and `settle` never see a gap.
        Counters::add(&c.deletes_in_flight, u64::MAX); // -1
        self.core.store.cleanup.end();
        if self.left.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            self.core.store.delete_marks.end(self.mark);
        }
    }
}

/// The mark of every delete queued so far (see `store/marks.rs`), for [`wait_freed`].
pub(crate) fn delete_mark(core: &EngineShared) -> u64 {
    core.store.delete_marks.mark()
}

/// Longest a writer that failed with `StorageFull` waits for its deletes: the space is back
/// when the error returns unless the device takes longer than this to free it.
pub(crate) const FREED_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits (until `deadline`, at most [`FREED_WAIT`] from the failure) until every delete
/// queued before `mark` has an outcome and the reaper closed what those files held (the last
/// close of a deleted file frees its blocks): the space of the files deleted is back. True if
/// it is. The caller first waits for its own writes in flight, which hold their files too.
pub(crate) fn wait_freed(core: &EngineShared, mark: u64, deadline: std::time::Instant) -> bool {
    core.store.delete_marks.wait_reached(mark, deadline) && core.io.reaper().flush_until(deadline)
}

/// The longest emptied file list [`recycle`] keeps for reuse (segments).
const MAX_KEPT_LIST: usize = 4;

/// Returns a finished state's files to the segment pool, the ones it has room for and that no
/// live mapping points into (`mapped(i)`: a `Bytes` a caller holds must never change), and
/// queues the deletes of the rest. Never waits.
pub(crate) fn recycle(
    core: &Arc<EngineShared>,
    lane: usize,
    mut entries: Vec<SegmentEntry>,
    mapped: impl Fn(usize) -> bool,
) {
    let pool = &core.store.pool;
    if !pool.enabled() {
        return delete_segments(core, lane, entries);
    }
    let mut rest = Vec::new();
    for (i, e) in entries.drain(..).enumerate() {
        if mapped(i) {
            rest.push(e);
            continue;
        }
        if let Err(e) = pool.put(e) {
            Counters::add(&core.counters.pool_trims, 1);
            rest.push(e);
        }
    }
    // The emptied list of a small state serves the next writer (no allocation for its file
    // list); a long one is freed.
    if entries.capacity() <= MAX_KEPT_LIST {
        let _ = core.entry_lists.put(entries);
    }
    delete_segments(core, lane, rest);
}

/// Deletes every pooled file (`Engine::trim_pool`; at shutdown, `close_pool`); returns how
/// many.
pub(crate) fn trim_pool(core: &Arc<EngineShared>) -> usize {
    let all = core.store.pool.drain();
    delete_pooled(core, all)
}

/// Deletes every pooled file and closes the pool: the shutdown's part.
pub(crate) fn close_pool(core: &Arc<EngineShared>) -> usize {
    let all = core.store.pool.close();
    delete_pooled(core, all)
}

fn delete_pooled(core: &Arc<EngineShared>, all: Vec<SegmentEntry>) -> usize {
    let n = all.len();
    Counters::add(&core.counters.pool_trims, n as u64);
    delete_segments(core, 0, all);
    n
}

/// A file is confirmed gone: release its ticket.
/// What an unlink's outcome means for the ticket of the file it named: the one reading that
/// the delete batch, the cleanup worker and a rotation's pool trim share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlinked {
    /// Removed: its ticket may go.
    Deleted,
    /// Already absent (`ENOENT`): gone as well, its ticket may go.
    Absent,
    /// Not started before shutdown's deadline: the name stays queued, not a failure.
    NotStarted,
    /// Failed: the name goes (or stays) with the worker, its ticket held.
    Failed,
}

impl Unlinked {
    /// Reads an unlink's result.
    pub(crate) fn of<T>(res: &io::Result<T>) -> Self {
        match res {
            Ok(_) => Unlinked::Deleted,
            Err(e) if e.raw_os_error() == Some(errno::ENOENT) => Unlinked::Absent,
            Err(e) if crate::io::is_abandoned(e) => Unlinked::NotStarted,
            Err(_) => Unlinked::Failed,
        }
    }

    /// Counts it (`files_deleted`, `files_already_absent` or `delete_failures`); true when the
    /// file is gone.
    pub(crate) fn count(self, c: &Counters) -> bool {
        let counter = match self {
            Unlinked::Deleted => &c.files_deleted,
            Unlinked::Absent => &c.files_already_absent,
            Unlinked::Failed => &c.delete_failures,
            Unlinked::NotStarted => return false,
        };
        Counters::add(counter, 1);
        matches!(self, Unlinked::Deleted | Unlinked::Absent)
    }
}

#[cfg(all(test, not(loom)))]
mod unlinked_tests {
    use super::*;

    #[test]
    fn an_unlinks_outcome_is_read_and_counted_once() {
        let c = Counters::default();
        let err = |n| Err::<(), _>(io::Error::from_raw_os_error(n));
        let cases = [
            (Ok(()), Unlinked::Deleted, true),
            (err(errno::ENOENT), Unlinked::Absent, true),
            (err(errno::ECANCELED), Unlinked::NotStarted, false),
            (Err(io::Error::other("no errno")), Unlinked::Failed, false),
            (err(errno::EIO), Unlinked::Failed, false),
        ];
        for (res, want, gone) in cases {
            assert_eq!(Unlinked::of(&res), want);
            assert_eq!(want.count(&c), gone);
        }
        let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(n(&c.files_deleted), 1);
        assert_eq!(n(&c.files_already_absent), 1);
        assert_eq!(n(&c.delete_failures), 2);
    }
}
