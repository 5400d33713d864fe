//! Stage 3: the reader. Opens each segment lazily, one at a time, and hands out records as
//! `Bytes` that point into it (or, for a compressed block, into a pooled buffer it is decoded
//! into once), each block's CRC-32C checked first. A segment of up to
//! `read_buffer_max` written bytes (a configuration field) is read with one `pread` into a
//! buffer of its own
//! (cheaper than map + unmap at that size, and such records hold no mapping); a larger one is
//! mapped, and its records are zero-copy views of the map.
//!
//! In buffered mode, with the segment pool on, a map is kept with its file (within a bound:
//! `io/keptmap.rs`) and the reader of the pooled file's next use reads through it: no map, no
//! page fault and no unmap per use (its page tables still point at the file's page cache,
//! which the next writer filled in place). It is used only through the fd the file kept
//! (the same inode) and only when it covers the use's bytes.
//!
//! Safety of the maps: segment files are private (0600, in a 0700 directory, opened with
//! `O_NOFOLLOW`), and the engine never writes or truncates a segment while a record of a map
//! of it is alive (a segment goes back to the pool, where a writer may take it, only once no
//! record of it is). A kept map is only dereferenced through the records of a reader of the
//! sealed segment. A map may outlive the state (a `Bytes` kept after the reader is gone): the
//! file's name is deleted on schedule, its blocks are freed when the last `Bytes` goes, and
//! that final unmap runs on the engine's reaper thread.
//!
//! # SIGBUS: what a caller must not do
//!
//! A record of a mapped segment is a `Bytes` into a shared file mapping, so touching it reads
//! the file. Two things
//! turn that read into a `SIGBUS` (which kills the process unless it handles the signal), and
//! the engine cannot turn either into an error:
//! - **A media error** under the mapped range (the disk fails to read a page): the page fault
//!   cannot be satisfied. A `read` would have returned `EIO`; a map cannot.
//! - **Shrinking a file while records of it are alive**: truncating a segment, or a file that
//!   [`crate::SpilledState::publish`] handed to the caller, while `Bytes` from an earlier
//!   reader of it still exist, leaves those `Bytes` pointing past the end of the file.
//!
//! So: never truncate, overwrite or `fallocate` a published file while `Bytes` read from the
//! state before its publish are alive (drop them first, or copy what must outlive the
//! publish); never let another process of the same user change files under the spill root;
//! and on hardware where media errors are expected, copy records out
//! (`Bytes::copy_from_slice`) inside a `SIGBUS` handler's protection or read published files
//! with plain `read` instead of through the engine.

use std::future::poll_fn;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use memmap2::{Advice, Mmap};

use crate::error::{Result, SpillError};
use crate::fault::fault_point;
use crate::format::cursor::{Expected, SegmentCursor};
use crate::format::segment::{Damage, SegmentFileName};
use crate::io::{DECODE_POOL, DecodePool, FileHandle, Offloaded, Reaped, Reaper, SharedMap};
use crate::metrics::Counters;
use crate::spill::budget::Budget;
use crate::spill::grant::{Grant, StateShared, open_error};
use crate::store::proc::ProcDir;

/// A segment's map: made for one reader, or kept with its file across uses (`io/keptmap.rs`).
enum MapRef {
    Own(Mmap),
    Kept(SharedMap),
}

/// Owns a segment's map for `Bytes::from_owner` (its first `len` bytes are the records'); an
/// own map is unmapped on the reaper thread, a kept one when its last holder lets go.
struct MapOwner {
    map: Option<MapRef>,
    len: usize,
    reaper: Reaper,
    /// The state's count of live mappings of this segment (see `StateShared::maps`).
    maps: Arc<[AtomicUsize]>,
    index: usize,
}

impl AsRef<[u8]> for MapOwner {
    fn as_ref(&self) -> &[u8] {
        let all: &[u8] = match &self.map {
            Some(MapRef::Own(m)) => m,
            Some(MapRef::Kept(m)) => m.bytes(),
            None => &[],
        };
        &all[..self.len.min(all.len())]
    }
}

impl Drop for MapOwner {
    fn drop(&mut self) {
        // A kept map is let go here; an own one is unmapped on the reaper.
        if let Some(MapRef::Own(m)) = self.map.take() {
            self.reaper.reap(Reaped::Map(m));
        }
        if let Some(c) = self.maps.get(self.index) {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A segment being read: its bytes (a read buffer or a map, up to its written length) and the
/// codec's walk over them.
struct Segment {
    cursor: SegmentCursor<&'static DecodePool>,
    /// Shorter than the written length if the file was truncated.
    bytes: Bytes,
    /// The segment's directory, for the path in an error (built only then).
    dir: Arc<ProcDir>,
}

/// What a reader does next ([`SpillReader::step`]).
enum Next {
    Record(Option<Bytes>),
    Open(usize),
}

/// Reads a [`crate::SpilledState`]'s records in write order. Holds one grant; dropping the
/// reader releases it. Also an [`Iterator`] of `Result<Bytes>`.
///
/// ```
/// use spillring::{Bytes, Engine, EngineConfig};
/// # fn main() -> spillring::Result<()> {
/// # let root = std::env::temp_dir().join(format!("spillring-doc-reader-{}", std::process::id()));
/// # let engine = Engine::open(EngineConfig::new(&root))?;
/// # let task = engine.task("t")?;
/// # let mut w = task.writer()?;
/// # w.write_all((0..3u8).map(|i| vec![i; 10]))?;
/// # let state = w.finish()?;
/// let mut r = state.reader()?;
/// while let Some(rec) = r.next_record()? {
///     assert_eq!(rec.len(), 10); // block CRC checked; zero-copy for a mapped segment
/// }
/// // Or as an iterator, which ends after the first error.
/// let recs: Vec<Bytes> = state.reader()?.collect::<spillring::Result<_>>()?;
/// assert_eq!(recs.len(), 3);
/// # drop((r, recs, state, task, engine));
/// # let _ = std::fs::remove_dir(&root);
/// # Ok(()) }
/// ```
///
/// Records are zero-copy `Bytes` into a mapping of the segment file: see the module docs for
/// the two ways reading one can raise `SIGBUS` (a media error, or a file shrunk under live
/// records) and what a caller must not do.
pub struct SpillReader {
    // Field order: the map is released before the grant.
    cur: Option<Segment>,
    next_seg: usize,
    /// The iterator returned an error: it ends there (`next` gives `None` from then on).
    iter_failed: bool,
    /// Async reads: the open of segment `.0` running on the offload pool (read-ahead).
    ahead: Option<(usize, Offloaded<Result<Segment>>)>,
    /// The work `next_record_async` may do before it yields (`spill/budget.rs`); made at the
    /// first async call (its slice starts then), so a reader only ever read by blocking calls
    /// never reads the clock for it.
    budget: Option<Budget>,
    grant: Grant,
}

/// Records in write order, as `Result<Bytes>`: the same as calling
/// [`SpillReader::next_record`] until it returns `None`, except that the iterator ends after
/// the first error (so a `for` loop that skips errors cannot spin on one).
///
/// ```no_run
/// # fn f(state: &spillring::SpilledState) -> spillring::Result<()> {
/// let total: usize = state
///     .reader()?
///     .map(|rec| rec.map(|b| b.len()))
///     .sum::<spillring::Result<usize>>()?;
/// # Ok(()) }
/// ```
impl Iterator for SpillReader {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        if self.iter_failed {
            return None;
        }
        let r = self.next_record().transpose();
        self.iter_failed = matches!(r, Some(Err(_)));
        r
    }
}

impl std::fmt::Debug for SpillReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpillReader")
            .field("segment", &self.next_seg)
            .finish()
    }
}

impl SpillReader {
    pub(crate) fn new(grant: Grant) -> Self {
        SpillReader {
            cur: None,
            next_seg: 0,
            iter_failed: false,
            ahead: None,
            budget: None,
            grant,
        }
    }

    /// The next record, `None` after the last. `Aborted` once the task scope closed the state;
    /// `Corrupt` (with segment and offset) for a torn, truncated or damaged segment, in which
    /// case no byte of the bad record is returned.
    pub fn next_record(&mut self) -> Result<Option<Bytes>> {
        let r = self.next_record_uncounted();
        if let Err(e) = &r {
            self.grant.0.core().counters.count_error(e);
        }
        r
    }

    fn next_record_uncounted(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.step()? {
                Next::Record(rec) => return Ok(rec),
                Next::Open(i) => self.enter(open_segment(&self.grant.0, i, false))?,
            }
        }
    }

    /// The async form of [`SpillReader::next_record`]: opening a segment (the `open`, `pread`
    /// or `mmap`, and the page faults of a cold map, taken by touching each page) runs on the
    /// engine's offload pool, never in a poll, and the next segment is opened there while this
    /// one is read (read-ahead: a reader holds at most two segments then).
    ///
    /// A loop of calls that each find their record at once (a segment mapped or read already)
    /// yields to the runtime after a short slice of work (`Pending`, the task woken once a tokio
    /// runtime has polled its timers and I/O, at once on another runtime), so the
    /// runtime's timers and other tasks run; see the crate docs' async rules.
    ///
    /// Dropping the future leaves the reader usable: an open under way ends on its own and is
    /// used by the next call if it is still the segment needed.
    pub async fn next_record_async(&mut self) -> Result<Option<Bytes>> {
        poll_fn(|cx| self.poll_next_record(cx)).await
    }

    fn poll_next_record(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>>> {
        std::task::ready!(self.budget.get_or_insert_with(Budget::new).poll_ready(cx));
        let r = self.poll_next_record_budgeted(cx);
        let budget = self.budget.get_or_insert_with(Budget::new);
        match &r {
            Poll::Ready(Ok(Some(rec))) => budget.spend(rec.len()),
            Poll::Ready(Err(e)) => {
                self.grant.0.core().counters.count_error(e);
                budget.spend(0)
            }
            Poll::Ready(_) => budget.spend(0),
            Poll::Pending => budget.yielded(),
        }
        r
    }

    fn poll_next_record_budgeted(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>>> {
        loop {
            let i = match self.step()? {
                Next::Record(rec) => return Poll::Ready(Ok(rec)),
                Next::Open(i) => i,
            };
            let job = match self.ahead.take() {
                Some((j, job)) if j == i => job,
                _ => self.open_ahead(i),
            };
            let opened = std::task::ready!(self.ahead.insert((i, job)).1.poll(cx));
            self.ahead = None;
            self.enter(opened)?;
            if i + 1 < self.grant.0.segments {
                self.ahead = Some((i + 1, self.open_ahead(i + 1)));
            }
        }
    }

    /// Starts opening segment `i` on the offload pool. The job holds a grant of its own, so
    /// the files stay while it maps and touches them even if this reader goes meanwhile.
    fn open_ahead(&self, i: usize) -> Offloaded<Result<Segment>> {
        let grant = self.grant.clone();
        let offload = self.grant.0.core().io.offload();
        offload.run(move || open_segment(&grant.0, i, true))
    }

    /// What comes next: a record of the segment being read, `None` after the last, or the
    /// open of the next segment (once the one being read is done, and let go).
    fn step(&mut self) -> Result<Next> {
        if self.grant.0.is_aborted() {
            return Err(self.aborted());
        }
        if let Some(m) = self.cur.as_mut() {
            let core = self.grant.0.core();
            match m
                .cursor
                .next_in(&m.bytes, core.key.as_ref(), Some(&core.counters))
            {
                Ok(Some(rec)) => {
                    Counters::add(&core.counters.bytes_read, rec.len() as u64);
                    Counters::add(&core.counters.records_read, 1);
                    return Ok(Next::Record(Some(rec)));
                }
                Ok(None) => self.cur = None,
                Err(d) => {
                    let seg = m.cursor.header().segment;
                    return Err(d.error(segment_path(&m.dir, seg), seg));
                }
            }
        }
        Ok(if self.next_seg < self.grant.0.segments {
            Next::Open(self.next_seg)
        } else {
            Next::Record(None)
        })
    }

    /// Makes the segment just opened (`opened`, the next one) the current one.
    fn enter(&mut self, opened: Result<Segment>) -> Result<()> {
        match opened {
            Ok(m) => {
                self.cur = Some(m);
                self.next_seg += 1;
                Ok(())
            }
            Err(e) if e.is_aborted() => Err(self.aborted()),
            Err(e) => Err(e),
        }
    }

    fn aborted(&mut self) -> SpillError {
        self.cur = None;
        self.ahead = None;
        Counters::add(&self.grant.0.core().counters.aborts_observed, 1);
        self.grant.0.why_gone(SpillError::Aborted)
    }
}

fn segment_path(dir: &ProcDir, seg: u32) -> PathBuf {
    dir.path.join(SegmentFileName::new(seg).as_str())
}

/// Opens segment `i` of `state`: one `pread` into a buffer of its own, or a map of its written
/// length; checks its header. `warm` (async reads, on an offload thread) touches every page
/// of a map, so that the caller's thread takes no page fault of a cold map. An abort is
/// `Aborted` (the caller counts it).
fn open_segment(state: &StateShared, i: usize, warm: bool) -> Result<Segment> {
    let started = std::time::Instant::now();
    let r = open_segment_timed(state, i, warm);
    state.core().counters.latency.read.record_since(started);
    r
}

fn open_segment_timed(state: &StateShared, i: usize, warm: bool) -> Result<Segment> {
    // Gone only through an abort: a reader's grant keeps the files otherwise.
    let at = match state.segment(i) {
        Some(at) if !state.is_aborted() => at,
        _ => return Err(SpillError::Aborted),
    };
    let (seg, end) = (at.seg, at.len);
    let path = || segment_path(&at.dir, seg);
    fault_point!(ReaderOpen, state.core().fault, task: state.task().and_then(|t| t.fault_plan()));
    let core = state.core();
    // The fd the writer left with the file (held here, so the fd bound cannot close it
    // under the read), or the file opened by name.
    let file =
        match at.fd {
            // A cancel since the check above deleted the file: its fd still reads it, but the
            // state is gone (an open by name finds no file then).
            Some(_) if state.is_aborted() => return Err(SpillError::Aborted),
            Some(h) => SegmentFd::Kept(h),
            // EMFILE/ENFILE: the engine closes an idle writer fd of its own and retries.
            // The name is made only here: a kept fd (a writer's segment) needs none.
            None => {
                let name = SegmentFileName::new(seg);
                match core.io.fds().open_with(|| {
                    crate::sys::fs::open_file_at(at.dir.as_fd(), name.as_cstr(), false)
                }) {
                    Ok(fd) => SegmentFd::Opened(fd),
                    Err(e) => return Err(open_error(state, path(), e)),
                }
            }
        };
    // A truncated file is read (or mapped) as far as it goes: records before the cut are
    // returned, the one crossing it is reported at its offset.
    let bytes = if end <= core.cfg.read_buffer_max as u64 {
        read_small(core, file.as_fd(), end as usize)
            .map_err(|e| SpillError::io("read", path(), e))?
    } else {
        let size = crate::sys::fs::file_size(file.as_fd())
            .map_err(|e| SpillError::io("stat", path(), e))?;
        let len = usize::try_from(end.min(size)).map_err(|_| {
            let d = Damage {
                offset: 0,
                detail: "segment larger than the address space",
            };
            d.error(path(), seg)
        })?;
        // Shorter than its header, even empty, it is mapped too: the walk reports it.
        map(state, i, at.generation, at.map, &file, len, warm)
            .map_err(|e| SpillError::io("mmap", path(), e))?
    };
    drop(file);
    let want = Expected {
        segment: Some(seg),
        engine: Some(core.id),
        generation: Some(at.generation),
        key_id: core.key_id(),
    };
    let cursor =
        SegmentCursor::open(&bytes, end, want, &DECODE_POOL).map_err(|d| d.error(path(), seg))?;
    Ok(Segment {
        cursor,
        bytes,
        dir: at.dir,
    })
}

/// A map of the first `len` bytes of segment `i` (use `generation`) of `state`, read through
/// `file`: the map a reader of the file's last use left with it (`kept`), or a new one, kept
/// with the file if it may be pooled. `warm` touches every page.
fn map(
    state: &StateShared,
    i: usize,
    generation: u32,
    kept: Option<SharedMap>,
    file: &SegmentFd,
    len: usize,
    warm: bool,
) -> std::io::Result<Bytes> {
    let core = state.core();
    let through_kept_fd = matches!(file, SegmentFd::Kept(_));
    let map = match kept {
        // The map a reader of the file's last use left with it: the same file (its fd was
        // kept throughout), whose page cache this use's writer filled in place. No map,
        // no page fault.
        Some(m) if through_kept_fd && m.len() >= len => MapRef::Kept(m),
        _ => {
            // See the module docs: the file is private, opened without following links,
            // and never written or truncated by the engine while a record of a mapping
            // of it is alive (a mapped segment does not go back to the pool); the map
            // covers only bytes that exist (`len <= size`).
            let map = crate::sys::mem::map_segment(file.as_fd(), len)?;
            // Sequential doubles the readahead window. (WillNeed on the whole segment was
            // tried: cold direct-mode reads got slower, 0.97-0.98 against 1.24-1.66 GB/s.)
            let _ = map.advise(Advice::Sequential);
            // Kept with a file the pool may reuse, for the reader of its next use.
            if through_kept_fd && core.store.pool.enabled() {
                match core.io.kept_maps().keep(map, core.io.reaper()) {
                    Ok(shared) => {
                        state.keep_map(i, generation, shared.clone());
                        MapRef::Kept(shared)
                    }
                    Err(map) => MapRef::Own(map),
                }
            } else {
                MapRef::Own(map)
            }
        }
    };
    if let Some(c) = state.maps().get(i) {
        c.fetch_add(1, Ordering::AcqRel);
    }
    let bytes = Bytes::from_owner(MapOwner {
        map: Some(map),
        len,
        reaper: core.io.reaper().clone(),
        maps: state.maps().clone(),
        index: i,
    });
    if warm {
        // One byte of every page: the page faults of a cold map are taken here (on an
        // offload thread), so the async reader's caller finds the pages resident.
        let mut acc = 0u8;
        for i in (0..len).step_by(4096) {
            acc ^= bytes[i];
        }
        std::hint::black_box(acc);
    }
    Ok(bytes)
}

/// A segment's fd for one open: the writer's, kept with the file, or one opened here (closed
/// when the open is done: a map needs no fd).
enum SegmentFd {
    Kept(Arc<FileHandle>),
    Opened(OwnedFd),
}

impl AsFd for SegmentFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            SegmentFd::Kept(h) => h.as_fd(),
            SegmentFd::Opened(fd) => fd.as_fd(),
        }
    }
}

/// One `pread` of a small segment's first `len` bytes into a kept read buffer
/// (`core.read_bufs`), which comes back when the last record pointing into it goes; a file
/// that ends sooner gives fewer (a truncated file, which the walk reports; no fstat).
fn read_small(
    core: &crate::shared::EngineShared,
    file: BorrowedFd<'_>,
    len: usize,
) -> std::io::Result<Bytes> {
    let mut buf = core.read_bufs.take(len);
    let space = buf.space();
    let mut got = 0;
    while got < space.len() {
        match crate::sys::rw::pread(file, &mut space[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(Bytes::from_owner(buf))
}
