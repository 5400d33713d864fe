//! A segment file and its ticket, owned by one holder at a time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::io::{CachedFile, FileHandle, SharedMap};
use crate::store::ledger::Ticket;
use crate::store::proc::ProcDir;
use crate::store::queue::CleanupQueue;

/// One segment file owned by whoever holds this: its directory, number and ticket. It ends by
/// a confirmed delete or publish ([`SegmentEntry::release`]) or by a hand-off of its name to
/// the cleanup worker ([`SegmentEntry::retain`]); dropped any other way (a bug, or an op that
/// never completed), its name goes to the cleanup worker with its ticket, so the file is
/// never forgotten while it may exist.
#[derive(Debug)]
pub(crate) struct SegmentEntry {
    pub dir: Arc<ProcDir>,
    pub seg: u32,
    /// Written length (set when the segment is sealed).
    pub len: u64,
    /// Bytes allocated to the file up front (direct mode, `preallocate`) that the writer has
    /// not yet given back; 0 once trimmed or if none. The ticket holds at least this much.
    pub allocated: u64,
    /// Which use of the file this is (in its header and every frame's checksum).
    pub generation: u32,
    /// `None` only once the entry ended (release or retain).
    ticket: Option<Ticket>,
    /// When the entry took its present role (created or reused by a writer; put in the pool),
    /// for operators (`Engine::list_files`).
    pub since: Instant,
    /// The fd its writer had, kept with the file once the segment is sealed (counted in the
    /// engine's fd bound, which may close it while it is idle): the state's reader and the
    /// pool's next writer use it instead of opening the file by name. Closed (on the reaper)
    /// when the entry ends, after the file's delete was queued.
    pub file: Option<CachedFile>,
    /// The map its last reader made (buffered mode, within the engine's bound on kept maps:
    /// `io/keptmap.rs`), kept with the file for the reader of its next use. Only records of a
    /// reader of a sealed segment read through it.
    pub map: Option<SharedMap>,
}

/// What an operator sees of one segment file the engine owns (`Engine::list_files`).
#[derive(Debug, Clone)]
pub(crate) struct EntryView {
    pub root: usize,
    pub path: PathBuf,
    /// Bytes of quota its ticket holds (the ledger's accounting).
    pub reserved: u64,
    /// How long it has been in its present role.
    pub age: Duration,
}

impl SegmentEntry {
    pub(crate) fn new(dir: Arc<ProcDir>, seg: u32, ticket: Ticket) -> Self {
        SegmentEntry {
            dir,
            seg,
            len: 0,
            allocated: 0,
            generation: 0,
            ticket: Some(ticket),
            since: Instant::now(),
            file: None,
            map: None,
        }
    }

    /// The kept fd, if the engine's fd bound has not closed it.
    pub(crate) fn kept_fd(&self) -> Option<Arc<FileHandle>> {
        self.file.as_ref().and_then(CachedFile::get)
    }

    /// The entry as an operator sees it.
    pub(crate) fn view(&self) -> EntryView {
        EntryView {
            root: self.dir.root,
            path: self.path(),
            reserved: self.reserved(),
            age: self.since.elapsed(),
        }
    }

    /// The same entry for use `generation` of its file, with the map its last use's reader
    /// left (if any).
    pub(crate) fn with_generation(mut self, generation: u32, map: Option<SharedMap>) -> Self {
        self.generation = generation;
        self.map = map;
        self
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.segment_path(self.seg)
    }

    /// Bytes of quota the entry's ticket holds (0 once it ended).
    pub(crate) fn reserved(&self) -> u64 {
        self.ticket.as_ref().map_or(0, Ticket::bytes)
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
    pub(crate) fn release(mut self) -> Arc<ProcDir> {
        drop(self.ticket.take());
        self.dir.clone()
    }

    /// Takes the entry apart for a new use of its file (the segment pool's reuse): its
    /// directory, number and ticket (its kept fd, if any, closes unless the caller took it).
    /// The caller records the file again under the abort check.
    pub(crate) fn into_reuse(mut self) -> Option<(Arc<ProcDir>, u32, Ticket)> {
        let t = self.ticket.take()?;
        Some((self.dir.clone(), self.seg, t))
    }

    /// Hands the name to the cleanup worker, ticket held.
    pub(crate) fn retain(mut self, cleanup: &CleanupQueue) {
        if let Some(t) = self.ticket.take() {
            cleanup.retain_file(self.dir.root, self.seg, t.retain());
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
                .retain_file(self.dir.root, self.seg, t.retain());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{FileHandle, Reaper};
    use crate::store::ledger::Ledger;
    use std::path::Path;

    fn task_dir(cleanup: &Arc<CleanupQueue>) -> Arc<ProcDir> {
        let fd = crate::sys::fs::open_dir(Path::new("/")).unwrap();
        let fd = FileHandle::new(fd, Reaper::inline());
        Arc::new(ProcDir::new(PathBuf::from("/"), fd, 0, cleanup.clone()))
    }

    /// A segment dropped without a hand-off keeps its ticket and sends its name to the cleanup
    /// worker: the file may exist, so it is never silently forgotten.
    #[test]
    fn a_segment_dropped_without_a_hand_off_goes_to_the_cleanup_worker() {
        let cleanup = Arc::new(CleanupQueue::new(16));
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
        let queued: Vec<_> = cleanup.records().iter().map(|r| (r.dir, r.seg)).collect();
        assert_eq!(queued, vec![(dir.root as u32, 7)]);
        // Released or retained entries end for good: no second record.
        SegmentEntry::new(dir.clone(), 8, ledger.reserve(1).unwrap()).retain(&cleanup);
        assert_eq!(cleanup.pending(), 2);
        drop(SegmentEntry::new(dir, 9, ledger.reserve(1).unwrap()).release());
        assert_eq!(cleanup.pending(), 2);
        assert_eq!(ledger.used(), 2);
    }
}
