//! The I/O requests: an [`Op`] (a write or an unlink) and where its outcome goes ([`OpSink`]),
//! the shared fds ops use ([`FileHandle`]), and the vectored-write helpers both backends use.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use bytes::Bytes;

use crate::fault::{self, FaultPlan, FaultPoint, Injected};
use crate::format::block::LARGE_PREFIX_LEN;
use crate::format::segment::{NAME_CAP, SegmentFileName};

use super::*;

/// Where an operation's outcome goes. `res` is the bytes moved, or the OS error.
pub(crate) trait OpSink: Send + Sync {
    fn complete(&self, token: u64, res: io::Result<usize>);
}

/// A file descriptor shared by the ops that use it. When the last user drops it, the fd goes
/// to the reaper: the final close of an unlinked file frees its blocks, which can take tens of
/// milliseconds, and must not stall a caller or a ring thread.
#[derive(Debug)]
pub(crate) struct FileHandle {
    fd: Option<OwnedFd>,
    reaper: Reaper,
    /// Counts the fd in the engine's fd bound (a writer's segment fd), given back once the
    /// reaper closed the fd (see `fdcache.rs`).
    permit: Option<FdPermit>,
}

impl FileHandle {
    pub(crate) fn new(fd: OwnedFd, reaper: Reaper) -> Arc<Self> {
        Arc::new(FileHandle {
            fd: Some(fd),
            reaper,
            permit: None,
        })
    }

    /// A handle whose fd counts in the engine's fd bound until it drops.
    pub(crate) fn counted(fd: OwnedFd, reaper: Reaper, mut permit: FdPermit) -> Arc<Self> {
        permit.set_live();
        Arc::new(FileHandle {
            fd: Some(fd),
            reaper,
            permit: Some(permit),
        })
    }

    /// Empties `h` if nobody else holds it: its fd goes to the reaper (with its permit) as
    /// in its drop, and the empty handle comes back for [`FileHandle::from_spare`], so the next
    /// segment fd takes no allocation. `None` (and `h` dropped as usual) if others hold it.
    pub(crate) fn into_spare(mut h: Arc<Self>) -> Option<Arc<Self>> {
        let inner = Arc::get_mut(&mut h)?;
        if let Some(fd) = inner.fd.take() {
            inner.reaper.reap(Reaped::Fd(fd, inner.permit.take()));
        }
        Some(h)
    }

    /// [`FileHandle::counted`] in `spare`, an empty handle from [`FileHandle::into_spare`].
    pub(crate) fn from_spare(
        mut spare: Arc<Self>,
        fd: OwnedFd,
        reaper: Reaper,
        mut permit: FdPermit,
    ) -> Arc<Self> {
        match Arc::get_mut(&mut spare) {
            Some(h) if h.fd.is_none() => {
                permit.set_live();
                h.fd = Some(fd);
                h.reaper = reaper;
                h.permit = Some(permit);
                spare
            }
            _ => Self::counted(fd, reaper, permit),
        }
    }

    /// Closes the fd on this thread (not the reaper), then gives back its permit: for an fd
    /// evicted from the cache, whose descriptor the caller is about to reuse.
    pub(crate) fn close_now(mut self) {
        drop(self.fd.take());
        drop(self.permit.take());
    }

    pub(crate) fn raw(&self) -> RawFd {
        // `fd` is only None inside drop.
        self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
    }
}

impl AsFd for FileHandle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.fd {
            Some(fd) => fd.as_fd(),
            None => unreachable!("a FileHandle's fd is only taken in its drop"),
        }
    }
}

impl Drop for FileHandle {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            // The permit (if any) goes back once the reaper closed the fd.
            self.reaper.reap(Reaped::Fd(fd, self.permit.take()));
        }
    }
}

/// What a write op writes.
pub(crate) enum WriteData {
    /// `buf[..len]` of a staging buffer.
    Staged(IoBuf),
    /// A frame header followed by a caller's payload, written with no copy (vectored).
    Framed {
        frame: [u8; LARGE_PREFIX_LEN],
        payload: Bytes,
    },
}

impl WriteData {
    pub(crate) fn len(&self) -> usize {
        match self {
            WriteData::Staged(b) => b.len,
            WriteData::Framed { payload, .. } => LARGE_PREFIX_LEN + payload.len(),
        }
    }
}

/// A NUL-terminated name for `unlinkat`, stored inline so an op owns it until completion.
#[derive(Clone, Copy)]
pub(crate) struct NameBuf {
    buf: [u8; NAME_BUF],
}

const NAME_BUF: usize = 128;

impl std::fmt::Debug for NameBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let end = self.buf.iter().position(|&b| b == 0).unwrap_or(NAME_BUF);
        write!(f, "{:?}", String::from_utf8_lossy(&self.buf[..end]))
    }
}

impl NameBuf {
    /// The name of segment `seg`.
    pub(crate) fn segment(seg: u32) -> Self {
        let n = SegmentFileName::new(seg);
        let mut buf = [0u8; NAME_BUF];
        let b = n.as_cstr().to_bytes();
        buf[..b.len()].copy_from_slice(b);
        NameBuf { buf }
    }

    pub(crate) fn as_ptr(&self) -> *const libc::c_char {
        self.buf.as_ptr().cast()
    }

    /// The name up to its NUL (every constructor leaves one: names are shorter than the
    /// buffer).
    pub(crate) fn as_cstr(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).unwrap_or(c"")
    }
}

const _: () = assert!(NAME_CAP <= NAME_BUF);

/// One I/O request.
pub(crate) enum OpKind {
    /// Write `data` at `offset` of `file`; short writes are continued until all is written.
    Write {
        file: Arc<FileHandle>,
        offset: u64,
        data: WriteData,
    },
    /// `unlinkat(dir, name, 0)` (a segment's name; `point` is the path's fault point).
    Unlink {
        dir: Arc<FileHandle>,
        name: NameBuf,
        point: FaultPoint,
    },
    /// The op in the slot, unless its submitter took it back to run it itself (see
    /// [`OpSlot`]): an I/O thread runs what it finds there ([`Op::resolve`]); a claim's
    /// outcome, if it never runs (abandoned, refused), is the op's ([`Op::complete`]). A
    /// claim never reaches its own sink.
    InSlot(Arc<OpSlot>),
}

/// One op its submitter may take back before an I/O thread starts it: a blocking `finish`
/// whose last write is still queued runs it on its own thread, two thread wake-ups saved.
/// The slot's lock hands the op to exactly one of them.
pub(crate) struct OpSlot<T = Op>(crate::sync::Mutex<Option<T>>);

impl<T> Default for OpSlot<T> {
    fn default() -> Self {
        OpSlot(crate::sync::Mutex::new(None))
    }
}

impl<T> OpSlot<T> {
    /// Puts `op` in the empty slot; gives it back if the slot holds one already.
    pub(crate) fn put(&self, op: T) -> std::result::Result<(), T> {
        let mut s = self.0.lock();
        if s.is_some() {
            return Err(op);
        }
        *s = Some(op);
        Ok(())
    }

    /// The op, if nobody took it yet.
    pub(crate) fn take(&self) -> Option<T> {
        self.0.lock().take()
    }
}

pub(crate) struct Op {
    pub kind: OpKind,
    pub sink: Arc<dyn OpSink>,
    pub token: u64,
}

impl Op {
    /// Makes a write's deferred copies into its staging buffer (see
    /// [`IoBuf::push_deferred`]); every path that writes an op calls this first.
    pub(crate) fn apply_fills(&mut self) {
        if let OpKind::Write {
            data: WriteData::Staged(b),
            ..
        } = &mut self.kind
        {
            b.apply_fills();
        }
    }

    /// A write whose staging buffer holds deferred copies: [`Op::apply_fills`] costs its
    /// thread a copy (and checksum) of up to a buffer's bytes.
    pub(crate) fn has_fills(&self) -> bool {
        matches!(&self.kind, OpKind::Write { data: WriteData::Staged(b), .. } if b.has_fills())
    }

    fn fault_point(&self) -> FaultPoint {
        match &self.kind {
            OpKind::Write { .. } | OpKind::InSlot(_) => FaultPoint::IoWrite,
            OpKind::Unlink { point, .. } => *point,
        }
    }

    /// The op to run: this one, or for a claim the op in its slot (`None` once its submitter
    /// took it back; the claim then ends here, unreported).
    pub(crate) fn resolve(self) -> Option<Op> {
        match &self.kind {
            OpKind::InSlot(slot) => slot.take(),
            _ => Some(self),
        }
    }

    /// Drops the op (its buffer and file: the kernel is done with them), then reports the
    /// outcome to its sink. A panic in the sink (a host's waker, a debug assertion) is
    /// caught and logged: it must not take down an I/O thread, whose other ops' waiters would
    /// otherwise wait forever. Sinks update their own state before anything that can panic
    /// (a writer's in-flight count before its waker), so their waiters still see the outcome.
    pub(crate) fn complete(self, res: io::Result<usize>) {
        if let OpKind::InSlot(slot) = &self.kind {
            // A claim that never ran (abandoned at a deadline, refused by a closed lane):
            // the op in its slot, if its submitter did not take it back, ends the same way.
            if let Some(op) = slot.take() {
                op.complete(res);
            }
            return;
        }
        let Op { kind, sink, token } = self;
        // The op lets go of its file and buffer before its outcome is out: a sink that counts
        // the op done knows its fd was handed to the reaper (if this was the last user), so
        // a flush of the reaper after that closes it. A writer failing with `StorageFull`
        // relies on this to return only once its files' space is back (issue 25; before, an
        // fd the op still held was closed after the flush).
        drop(kind);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sink.complete(token, res);
        }));
        if let Err(p) = r {
            let what = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("a panic");
            tracing::error!(
                panic = what,
                "an I/O completion handler panicked; the I/O thread goes on"
            );
        }
    }
}

/// Consults the fault plan for an op about to run on a backend.
pub(crate) fn injected(plan: &Option<Arc<FaultPlan>>, op: &Op) -> Injected {
    fault::check(plan, op.fault_point())
}

/// What a skipped op reports: the bytes a write would have moved, 0 otherwise.
pub(crate) fn skip_len(kind: &OpKind) -> usize {
    match kind {
        OpKind::Write { data, .. } => data.len(),
        OpKind::Unlink { .. } | OpKind::InSlot(_) => 0,
    }
}

/// `head` then `tail` after their first `done` bytes.
fn slices_after<'a>(head: &'a [u8], tail: &'a [u8], done: usize) -> (&'a [u8], &'a [u8]) {
    if done < head.len() {
        (&head[done..], tail)
    } else {
        (&tail[done - head.len()..], &[])
    }
}

/// The iovecs of `head` then `tail` after the first `done` bytes, and how many are in use.
pub(crate) fn iovecs_after(head: &[u8], tail: &[u8], done: usize) -> ([libc::iovec; 2], u32) {
    let (a, b) = slices_after(head, tail, done);
    let iov = |s: &[u8]| libc::iovec {
        iov_base: s.as_ptr() as *mut libc::c_void,
        iov_len: s.len(),
    };
    ([iov(a), iov(b)], if b.is_empty() { 1 } else { 2 })
}

/// Writes `head` then `tail` at `offset` with `pwritev`, continuing short writes.
pub(crate) fn pwrite_all(
    fd: BorrowedFd<'_>,
    head: &[u8],
    tail: &[u8],
    offset: u64,
) -> io::Result<usize> {
    let total = head.len() + tail.len();
    let mut done = 0usize;
    while done < total {
        let (a, b) = slices_after(head, tail, done);
        let iov = [io::IoSlice::new(a), io::IoSlice::new(b)];
        let cnt = if b.is_empty() { 1 } else { 2 };
        let n = match crate::sys::rw::pwritev(fd, &iov[..cnt], offset + done as u64) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        done += n;
    }
    Ok(total)
}

#[cfg(all(test, not(loom)))]
mod claim_tests {
    use super::*;

    /// Records each outcome it is given.
    #[derive(Default)]
    struct Outcomes(parking_lot::Mutex<Vec<Option<i32>>>);

    impl OpSink for Outcomes {
        fn complete(&self, _token: u64, res: io::Result<usize>) {
            self.0.lock().push(res.err().and_then(|e| e.raw_os_error()));
        }
    }

    fn write_op(sink: &Arc<Outcomes>) -> Op {
        let f = tempfile::tempfile().unwrap();
        Op {
            kind: OpKind::Write {
                file: FileHandle::new(OwnedFd::from(f), Reaper::inline()),
                offset: 0,
                data: WriteData::Framed {
                    frame: [0; LARGE_PREFIX_LEN],
                    payload: Bytes::from_static(b"x"),
                },
            },
            sink: sink.clone(),
            token: 7,
        }
    }

    fn claim_of(slot: &Arc<OpSlot>, sink: &Arc<Outcomes>) -> Op {
        Op {
            kind: OpKind::InSlot(slot.clone()),
            sink: sink.clone(),
            token: 0,
        }
    }

    /// Sees, when it hears an outcome, whether the op's file is still held by anyone.
    struct FileGone(
        std::sync::Weak<FileHandle>,
        parking_lot::Mutex<Option<bool>>,
    );

    impl OpSink for FileGone {
        fn complete(&self, _token: u64, _res: io::Result<usize>) {
            *self.1.lock() = Some(self.0.strong_count() == 0);
        }
    }

    /// An op lets go of its file before its sink hears the outcome: a writer that counts
    /// its last write done, then flushes the reaper, knows the fd was closed (the space of a
    /// deleted segment is back when `StorageFull` returns; issue 25). Before, the sink heard
    /// first and the fd went to the reaper after its flush.
    #[test]
    fn an_op_lets_go_of_its_file_before_its_outcome_is_heard() {
        let file = FileHandle::new(
            OwnedFd::from(tempfile::tempfile().unwrap()),
            Reaper::inline(),
        );
        let sink = Arc::new(FileGone(Arc::downgrade(&file), Default::default()));
        let op = Op {
            kind: OpKind::Write {
                file,
                offset: 0,
                data: WriteData::Framed {
                    frame: [0; LARGE_PREFIX_LEN],
                    payload: Bytes::from_static(b"x"),
                },
            },
            sink: sink.clone(),
            token: 1,
        };
        op.complete(Ok(1));
        assert_eq!(
            *sink.1.lock(),
            Some(true),
            "the sink heard before the file was let go"
        );
    }

    /// A claim resolves to the op in its slot once; after that (or after the submitter took
    /// the op back) it resolves to nothing, and it never reports to its own sink.
    #[test]
    fn a_claim_resolves_to_its_op_once() {
        let (inner, own) = (Arc::new(Outcomes::default()), Arc::new(Outcomes::default()));
        let slot = Arc::new(OpSlot::default());
        assert!(slot.put(write_op(&inner)).is_ok());
        assert!(
            slot.put(write_op(&inner)).is_err(),
            "a full slot gives the op back"
        );
        let op = claim_of(&slot, &own).resolve().expect("the op in the slot");
        assert_eq!(op.token, 7);
        assert!(
            claim_of(&slot, &own).resolve().is_none(),
            "the slot is empty now"
        );
        assert!(slot.put(write_op(&inner)).is_ok());
        assert!(slot.take().is_some(), "the submitter took it back");
        assert!(claim_of(&slot, &own).resolve().is_none());
        assert!(own.0.lock().is_empty() && inner.0.lock().is_empty());
    }

    /// A claim completed without running (abandoned, refused by a closed lane) completes the
    /// op still in its slot with the same outcome, once; an empty slot's claim reports nothing.
    #[test]
    fn a_claim_that_never_ran_ends_its_op_the_same_way() {
        let (inner, own) = (Arc::new(Outcomes::default()), Arc::new(Outcomes::default()));
        let slot = Arc::new(OpSlot::default());
        assert!(slot.put(write_op(&inner)).is_ok());
        claim_of(&slot, &own).complete(Err(io::Error::from_raw_os_error(libc::ECANCELED)));
        assert_eq!(*inner.0.lock(), vec![Some(libc::ECANCELED)]);
        claim_of(&slot, &own).complete(Err(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(inner.0.lock().len(), 1, "the op ended once");
        assert!(
            own.0.lock().is_empty(),
            "a claim never reaches its own sink"
        );
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// The I/O thread resolving a claim races the writer taking its op back: exactly one of
    /// them gets the op, whatever the interleaving.
    #[test]
    fn loom_op_slot_hands_its_op_to_one_taker() {
        loom::model(|| {
            let slot = Arc::new(OpSlot::<u32>::default());
            assert!(slot.put(5).is_ok());
            let io = {
                let slot = slot.clone();
                thread::spawn(move || slot.take())
            };
            let writer = slot.take();
            let io = io.join().unwrap();
            assert_eq!(
                u32::from(writer.is_some()) + u32::from(io.is_some()),
                1,
                "the op went to {writer:?} and {io:?}"
            );
            assert!(slot.take().is_none());
        });
    }
}
