//! How bytes move: the I/O request types, the handle the engine submits through, staging
//! buffers, and the reaper that closes files off the callers' threads.
//!
//! The backends live in [`uring`] (an io_uring ring thread) and [`psync`] (plain syscalls on an
//! I/O thread). Both take the same [`Op`]s over a crossbeam channel and report each one's
//! outcome to its [`OpSink`]. Nothing here knows about tickets, segments or scopes.

mod gate;
mod psync;
pub(crate) mod uring;

pub(crate) use gate::LaneGate;

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use memmap2::{Mmap, MmapMut};
use parking_lot::Mutex;

use crate::config::Backend;
use crate::fault::{self, FaultPlan, FaultPoint, Injected};
use crate::format::segment::{FRAME_LEN, NAME_CAP, SegmentFileName};
use crate::sys::errno;

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
}

impl FileHandle {
    pub(crate) fn new(fd: OwnedFd, reaper: Reaper) -> Arc<Self> {
        Arc::new(FileHandle {
            fd: Some(fd),
            reaper,
        })
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
            self.reaper.reap(Reaped::Fd(fd));
        }
    }
}

/// What a write op writes.
pub(crate) enum WriteData {
    /// `buf[..len]` of a staging buffer.
    Staged(IoBuf),
    /// A frame header followed by a caller's payload, written with no copy (vectored).
    Framed {
        frame: [u8; FRAME_LEN],
        payload: Bytes,
    },
}

impl WriteData {
    pub(crate) fn len(&self) -> usize {
        match self {
            WriteData::Staged(b) => b.len,
            WriteData::Framed { payload, .. } => FRAME_LEN + payload.len(),
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
    /// `None` when the name has a NUL or does not fit.
    /// The name of segment `seg`.
    pub(crate) fn segment(seg: u32) -> Self {
        let n = SegmentFileName::new(seg);
        let mut buf = [0u8; NAME_BUF];
        let b = n.as_cstr().to_bytes();
        buf[..b.len()].copy_from_slice(b);
        NameBuf { buf }
    }

    /// `dir/<segment file name>`.
    pub(crate) fn joined(dir: &NameBuf, seg: u32) -> Self {
        let n = SegmentFileName::new(seg);
        let d = dir.as_bytes();
        let f = n.as_cstr().to_bytes();
        let mut buf = [0u8; NAME_BUF];
        // A directory name is at most ~70 bytes (t<seq>-<48 chars>) and a segment name 28.
        let dl = d.len().min(NAME_BUF - 2 - f.len());
        buf[..dl].copy_from_slice(&d[..dl]);
        buf[dl] = b'/';
        buf[dl + 1..dl + 1 + f.len()].copy_from_slice(f);
        NameBuf { buf }
    }

    fn as_bytes(&self) -> &[u8] {
        let end = self.buf.iter().position(|&b| b == 0).unwrap_or(NAME_BUF);
        &self.buf[..end]
    }

    pub(crate) fn new(name: &[u8]) -> Option<Self> {
        if name.len() >= NAME_BUF || name.contains(&0) {
            return None;
        }
        let mut buf = [0u8; NAME_BUF];
        buf[..name.len()].copy_from_slice(name);
        Some(NameBuf { buf })
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
    /// `unlinkat(dir, name, rmdir ? AT_REMOVEDIR : 0)`.
    Unlink {
        dir: Arc<FileHandle>,
        name: NameBuf,
        rmdir: bool,
        point: FaultPoint,
    },
}

pub(crate) struct Op {
    pub kind: OpKind,
    pub sink: Arc<dyn OpSink>,
    pub token: u64,
}

impl Op {
    fn fault_point(&self) -> FaultPoint {
        match &self.kind {
            OpKind::Write { .. } => FaultPoint::IoWrite,
            OpKind::Unlink { point, .. } => *point,
        }
    }

    /// Reports the outcome to the op's sink, then drops the op (its buffer and file: the
    /// kernel is done with them). A panic in the sink (a host's waker, a debug assertion) is
    /// caught and logged: it must not take down an I/O thread, whose other ops' waiters would
    /// otherwise wait forever. Sinks update their own state before anything that can panic
    /// (a writer's in-flight count before its waker), so their waiters still see the outcome.
    pub(crate) fn complete(self, res: io::Result<usize>) {
        let Op { kind, sink, token } = self;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sink.complete(token, res);
        }));
        drop(kind);
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
        OpKind::Unlink { .. } => 0,
    }
}

pub(crate) enum Msg {
    Op(Op),
    Shutdown,
}

/// Wakes an I/O thread that may be asleep.
pub(crate) trait Wake: Send + Sync {
    fn wake(&self);
}

struct Lane {
    id: usize,
    tx: Sender<Msg>,
    wake: Arc<dyn Wake>,
    gate: Arc<LaneGate>,
}

static LANE_SEQ: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The lane this thread serves, if it is an I/O thread.
    static CURRENT_LANE: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
    /// Ops an I/O thread submitted to its own full lane (from a completion handler): it cannot
    /// wait for room in a channel only it drains.
    static OVERFLOW: std::cell::RefCell<std::collections::VecDeque<Op>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

/// Marks the calling thread as the I/O thread of lane `id`.
pub(crate) fn enter_lane(id: usize) {
    CURRENT_LANE.with(|c| c.set(id));
}

/// Takes the ops this I/O thread queued to itself.
pub(crate) fn take_overflow(into: &mut impl Extend<Op>) {
    OVERFLOW.with(|o| into.extend(o.borrow_mut().drain(..)));
}

/// A bounded channel for one lane: its slots are allocated once, so queuing an op allocates
/// nothing.
pub(crate) fn lane_channel(capacity: usize) -> LaneChannel {
    let (tx, rx) = crossbeam_channel::bounded(capacity);
    LaneChannel {
        id: LANE_SEQ.fetch_add(1, Ordering::Relaxed),
        tx,
        rx: LaneRx {
            rx,
            gate: Arc::default(),
        },
    }
}

/// Both ends of a lane.
pub(crate) struct LaneChannel {
    id: usize,
    tx: Sender<Msg>,
    rx: LaneRx,
}

/// The I/O thread's end of a lane: its receiver and the gate it closes when it leaves.
pub(crate) struct LaneRx {
    pub rx: Receiver<Msg>,
    gate: Arc<LaneGate>,
}

impl LaneRx {
    /// Closes the lane as its thread leaves: every op still queued, or sent by a submitter
    /// that got in before the close, completes with an error (see [`LaneGate`]).
    pub(crate) fn close(&self) {
        self.gate.close(|| fail_remaining(&self.rx));
    }
}

/// The engine's handle on its I/O threads.
pub(crate) struct IoHandle {
    lanes: Vec<Lane>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    next: AtomicUsize,
    kind: Backend,
    deadline: Arc<Deadline>,
    pool: Arc<BufferPool>,
    reaper: Reaper,
    fault: Option<Arc<FaultPlan>>,
}

impl std::fmt::Debug for IoHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoHandle")
            .field("backend", &self.kind)
            .field("lanes", &self.lanes.len())
            .finish()
    }
}

/// What starting a backend needs.
pub(crate) struct IoSetup {
    pub threads: usize,
    pub ring_entries: u32,
    /// Ops a lane's channel holds before senders wait.
    pub channel_capacity: usize,
    pub pool: Arc<BufferPool>,
    pub fault: Option<Arc<FaultPlan>>,
    pub deadline: Arc<Deadline>,
    pub reaper: Reaper,
}

impl IoHandle {
    /// Starts io_uring ring threads.
    pub(crate) fn start_uring(setup: &IoSetup) -> io::Result<Self> {
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..setup.threads {
            let LaneChannel { id, tx, rx } = lane_channel(setup.channel_capacity);
            let gate = rx.gate.clone();
            let (wake, join) = uring::spawn(i, id, rx, setup)?;
            lanes.push(Lane { id, tx, wake, gate });
            threads.push(join);
        }
        Ok(Self::assemble(lanes, threads, Backend::IoUring, setup))
    }

    /// Starts psync I/O threads.
    pub(crate) fn start_psync(setup: &IoSetup) -> io::Result<Self> {
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..setup.threads {
            let LaneChannel { id, tx, rx } = lane_channel(setup.channel_capacity);
            let gate = rx.gate.clone();
            let join = psync::spawn(i, id, rx, setup.fault.clone(), setup.deadline.clone())?;
            lanes.push(Lane {
                id,
                tx,
                wake: Arc::new(NoWake),
                gate,
            });
            threads.push(join);
        }
        Ok(Self::assemble(lanes, threads, Backend::Psync, setup))
    }

    fn assemble(
        lanes: Vec<Lane>,
        threads: Vec<JoinHandle<()>>,
        kind: Backend,
        setup: &IoSetup,
    ) -> Self {
        IoHandle {
            lanes,
            threads: Mutex::new(threads),
            next: AtomicUsize::new(0),
            kind,
            deadline: setup.deadline.clone(),
            pool: setup.pool.clone(),
            reaper: setup.reaper.clone(),
            fault: setup.fault.clone(),
        }
    }

    /// The staging buffers.
    pub(crate) fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// The reaper that closes fds off the hot path.
    pub(crate) fn reaper(&self) -> &Reaper {
        &self.reaper
    }

    /// Performs `op` on the calling thread, with the backends' fault points, and returns its
    /// result without completing it (the caller does, or uses the result itself). For work the
    /// caller would wait for anyway: a blocking `finish`'s last write, a small cleanup batch on
    /// the worker's own thread. Two thread hand-offs saved.
    pub(crate) fn run_inline(&self, op: &Op) -> io::Result<usize> {
        psync::perform(op, &self.fault)
    }

    /// From `at` on, queued ops fail with [`abandoned`] instead of starting, and a submit
    /// waiting for room in a full lane gives up.
    pub(crate) fn set_deadline(&self, at: Instant) {
        self.deadline.set(at);
        for lane in &self.lanes {
            lane.wake.wake();
        }
    }

    /// The backend that runs.
    pub(crate) fn kind(&self) -> Backend {
        self.kind
    }

    /// Picks a lane for a new writer (round-robin).
    pub(crate) fn pick_lane(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()
    }

    /// Queues `op` on `lane`. If the I/O threads are gone (engine shut down), the op completes
    /// at once with an error, on this thread.
    pub(crate) fn submit(&self, lane: usize, op: Op) {
        let lane = &self.lanes[lane % self.lanes.len()];
        let Some(_inside) = lane.gate.enter() else {
            // The lane's thread has left: nothing would ever take the op from its channel.
            return op.complete(Err(shut_down()));
        };
        let msg = match lane.tx.try_send(Msg::Op(op)) {
            Ok(()) => return lane.wake.wake(),
            Err(crossbeam_channel::TrySendError::Full(msg)) => msg,
            Err(crossbeam_channel::TrySendError::Disconnected(msg)) => {
                if let Msg::Op(op) = msg {
                    op.complete(Err(shut_down()));
                }
                return;
            }
        };
        let Msg::Op(op) = msg else { return };
        if CURRENT_LANE.with(|c| c.get()) == lane.id {
            // The lane's own thread, from a completion: it drains this before sleeping.
            OVERFLOW.with(|o| o.borrow_mut().push_back(op));
            return;
        }
        // Back-pressure: wait for room, unless a shutdown's deadline passes first.
        let mut msg = Msg::Op(op);
        loop {
            lane.wake.wake();
            match lane.tx.send_timeout(msg, Duration::from_millis(5)) {
                Ok(()) => return lane.wake.wake(),
                Err(crossbeam_channel::SendTimeoutError::Timeout(m)) => {
                    if self.deadline.passed() {
                        if let Msg::Op(op) = m {
                            op.complete(Err(abandoned()));
                        }
                        return;
                    }
                    msg = m;
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(m)) => {
                    if let Msg::Op(op) = m {
                        op.complete(Err(shut_down()));
                    }
                    return;
                }
            }
        }
    }

    /// Stops the I/O threads and waits for them: they leave once every op is done, started
    /// ops by the kernel, queued ones failed if the deadline (see [`IoHandle::set_deadline`])
    /// passed first.
    pub(crate) fn shutdown(&self) {
        for lane in &self.lanes {
            let _ = lane.tx.send(Msg::Shutdown);
            lane.wake.wake();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            if t.join().is_err() {
                tracing::error!("spillring I/O thread panicked");
            }
        }
    }
}

pub(crate) fn shut_down() -> io::Error {
    io::Error::other("spillring engine is shut down")
}

/// What an op that was queued but not started when the shutdown budget ran out reports.
/// (`ECANCELED`: the op never ran, so its effect did not happen.)
pub(crate) fn abandoned() -> io::Error {
    io::Error::from_raw_os_error(errno::ECANCELED)
}

/// True for the error of an op that was never started (see [`abandoned`]).
pub(crate) fn is_abandoned(e: &io::Error) -> bool {
    e.raw_os_error() == Some(errno::ECANCELED)
}

/// The instant after which queued ops are failed instead of started (set by a shutdown), so
/// `shutdown(budget)` waits only for what is already in the kernel.
#[derive(Debug)]
pub(crate) struct Deadline {
    base: Instant,
    /// Nanoseconds after `base`; `u64::MAX` while no shutdown set it.
    at: AtomicU64,
}

impl Default for Deadline {
    fn default() -> Self {
        Deadline {
            base: Instant::now(),
            at: AtomicU64::new(u64::MAX),
        }
    }
}

impl Deadline {
    /// Sets the deadline (the earliest one given wins).
    pub(crate) fn set(&self, at: Instant) {
        let ns = u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1);
        self.at.fetch_min(ns, Ordering::AcqRel);
    }

    /// True once a deadline was set and has passed. One atomic load while none is set.
    #[inline]
    pub(crate) fn passed(&self) -> bool {
        let at = self.at.load(Ordering::Acquire);
        at != u64::MAX && self.base.elapsed().as_nanos() >= u128::from(at)
    }
}

struct NoWake;
impl Wake for NoWake {
    fn wake(&self) {}
}

/// Drains a lane after shutdown was requested: anything still queued completes with an error.
pub(crate) fn fail_remaining(rx: &Receiver<Msg>) {
    while let Ok(m) = rx.try_recv() {
        if let Msg::Op(op) = m {
            op.complete(Err(shut_down()));
        }
    }
}

/// A page-aligned staging buffer. Dropping it returns it to its pool.
pub(crate) struct IoBuf {
    map: Option<MmapMut>,
    /// Bytes filled.
    pub len: usize,
    /// Index among the buffers registered with the rings, if it has one.
    pub slot: Option<u16>,
    pool: Arc<BufferPool>,
}

impl IoBuf {
    pub(crate) fn capacity(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.map.as_ref().map_or(std::ptr::null(), |m| m.as_ptr())
    }

    /// The whole buffer, for filling.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        match self.map.as_mut() {
            Some(m) => &mut m[..],
            None => &mut [],
        }
    }

    /// The first `n` bytes (filled or not).
    pub(crate) fn filled_to(&self, n: usize) -> &[u8] {
        match self.map.as_ref() {
            Some(m) => &m[..n.min(m.len())],
            None => &[],
        }
    }

    /// The filled part.
    pub(crate) fn filled(&self) -> &[u8] {
        match self.map.as_ref() {
            Some(m) => &m[..self.len],
            None => &[],
        }
    }

    /// Appends `data`; the caller checked it fits.
    #[inline]
    pub(crate) fn push(&mut self, data: &[u8]) {
        let at = self.len;
        self.space()[at..at + data.len()].copy_from_slice(data);
        self.len += data.len();
    }

    pub(crate) fn remaining(&self) -> usize {
        self.capacity() - self.len
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            self.pool.put(map, self.slot);
        }
    }
}

/// A pool of page-aligned staging buffers of one size. The first `max_slots` buffers it ever
/// makes get a registration slot and are kept for the engine's life (the rings register them
/// as fixed buffers); others are kept up to `retain` and unmapped beyond that.
#[derive(Debug)]
pub(crate) struct BufferPool {
    size: usize,
    max_slots: usize,
    retain: usize,
    slotted: Mutex<Vec<(MmapMut, u16)>>,
    plain: Mutex<Vec<MmapMut>>,
    next_slot: AtomicUsize,
}

impl BufferPool {
    pub(crate) fn new(size: usize, max_slots: usize, retain: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            size,
            max_slots,
            retain,
            slotted: Mutex::new(Vec::new()),
            plain: Mutex::new(Vec::new()),
            next_slot: AtomicUsize::new(0),
        })
    }

    /// Bytes in one buffer.
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.size
    }

    pub(crate) fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// A buffer, empty. Maps a new one when none is free.
    pub(crate) fn get(self: &Arc<Self>) -> io::Result<IoBuf> {
        if let Some((map, slot)) = self.slotted.lock().pop() {
            return Ok(self.wrap(map, Some(slot)));
        }
        if let Some(map) = self.plain.lock().pop() {
            return Ok(self.wrap(map, None));
        }
        let map = MmapMut::map_anon(self.size)?;
        let slot = if self.next_slot.load(Ordering::Relaxed) < self.max_slots {
            let s = self.next_slot.fetch_add(1, Ordering::Relaxed);
            (s < self.max_slots).then_some(s as u16)
        } else {
            None
        };
        Ok(self.wrap(map, slot))
    }

    fn wrap(self: &Arc<Self>, map: MmapMut, slot: Option<u16>) -> IoBuf {
        IoBuf {
            map: Some(map),
            len: 0,
            slot,
            pool: self.clone(),
        }
    }

    fn put(&self, map: MmapMut, slot: Option<u16>) {
        match slot {
            Some(s) => self.slotted.lock().push((map, s)),
            None => {
                let mut plain = self.plain.lock();
                if plain.len() < self.retain {
                    plain.push(map);
                }
            }
        }
    }
}

/// Something whose drop may be slow, dropped on the reaper thread.
#[derive(Debug)]
pub(crate) enum Reaped {
    Fd(#[expect(dead_code, reason = "held only to be closed on the reaper thread")] OwnedFd),
    Map(#[expect(dead_code, reason = "held only to be unmapped on the reaper thread")] Mmap),
    /// Ends the reaper thread that takes it (one per thread, sent by `ReaperThread::stop`).
    Stop,
    /// Barrier: see [`FlushGate`].
    Flush(Arc<FlushGate>),
}

/// Items the reaper queue holds before `reap` waits. Each is usually an fd or a map of a
/// file whose blocks are freed when it closes, so this bounds what the engine holds of
/// deleted files.
const REAPER_CAPACITY: usize = 256;

/// Threads closing and unmapping: the final close of a deleted file frees its blocks (tens of
/// ms with online discard), and several run in parallel.
const REAPER_THREADS: usize = 4;

/// Sends slow drops to the reaper thread; drops inline when the thread is gone.
#[derive(Debug, Clone)]
pub(crate) struct Reaper {
    tx: Option<Sender<Reaped>>,
    /// One flush at a time: a flush sends one gate per reaper thread, and two interleaved
    /// flushes would leave every thread waiting on a gate that cannot fill.
    flushing: Arc<Mutex<()>>,
}

impl Reaper {
    /// Starts the reaper threads.
    pub(crate) fn start() -> io::Result<(Self, ReaperThread)> {
        let (tx, rx) = crossbeam_channel::bounded::<Reaped>(REAPER_CAPACITY);
        let mut joins = Vec::with_capacity(REAPER_THREADS);
        for i in 0..REAPER_THREADS {
            let rx = rx.clone();
            joins.push(
                std::thread::Builder::new()
                    .name(format!("spillring-reaper-{i}"))
                    .spawn(move || reaper_loop(&rx))?,
            );
        }
        Ok((
            Reaper {
                tx: Some(tx.clone()),
                flushing: Arc::default(),
            },
            ReaperThread {
                tx: Mutex::new(Some(tx)),
                joins: Mutex::new(joins),
            },
        ))
    }

    /// A reaper with no threads: everything is dropped where it is reaped (unit tests).
    #[cfg(test)]
    pub(crate) fn inline() -> Self {
        Reaper {
            tx: None,
            flushing: Arc::default(),
        }
    }

    /// Hands `item` to the reaper threads. Waits while [`REAPER_CAPACITY`] items are queued
    /// (back-pressure, so the fds of deleted files the engine holds stay bounded); drops it
    /// here if the reapers are gone.
    pub(crate) fn reap(&self, item: Reaped) {
        if let Some(tx) = &self.tx
            && let Err(e) = tx.send(item)
        {
            drop(e.into_inner());
        }
    }

    /// Waits (up to 10 s) until everything reaped before this call was dropped.
    pub(crate) fn flush(&self) {
        self.flush_until(Instant::now() + FLUSH_LIMIT);
    }

    /// Waits until everything reaped before this call was dropped, or until `deadline`; true
    /// if everything was.
    pub(crate) fn flush_until(&self, deadline: Instant) -> bool {
        let Some(tx) = &self.tx else { return true };
        let Some(_one_at_a_time) = self.flushing.try_lock_until(deadline) else {
            return false;
        };
        let gate = Arc::new(FlushGate {
            left: Mutex::new(REAPER_THREADS),
            cv: parking_lot::Condvar::new(),
            deadline,
        });
        for _ in 0..REAPER_THREADS {
            if tx
                .send_deadline(Reaped::Flush(gate.clone()), deadline)
                .is_err()
            {
                // Gone, or full until the deadline: the gates sent so far expire at it.
                return false;
            }
        }
        gate.wait()
    }
}

/// A flush barrier: every reaper thread (and the flusher) waits until all threads reached it,
/// so everything queued before it was dropped. Waits are bounded, so a reaper that is gone
/// cannot hang anyone.
#[derive(Debug)]
pub(crate) struct FlushGate {
    left: Mutex<usize>,
    cv: parking_lot::Condvar,
    /// Nobody waits at the gate past this.
    deadline: Instant,
}

/// Longest a plain [`Reaper::flush`] waits.
const FLUSH_LIMIT: Duration = Duration::from_secs(10);

impl FlushGate {
    fn arrive(&self) {
        let mut left = self.left.lock();
        *left = left.saturating_sub(1);
        if *left == 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until every thread arrived (true) or the gate's deadline passed (false).
    fn wait(&self) -> bool {
        let mut left = self.left.lock();
        while *left > 0 {
            if self.cv.wait_until(&mut left, self.deadline).timed_out() {
                return *left == 0;
            }
        }
        true
    }
}

fn reaper_loop(rx: &Receiver<Reaped>) {
    // A plain `recv` (a `select!` over two channels allocates on every call).
    while let Ok(m) = rx.recv() {
        match m {
            Reaped::Stop => return,
            Reaped::Flush(gate) => {
                gate.arrive();
                let _ = gate.wait();
            }
            other => drop(other),
        }
    }
}

/// The reaper threads' stop handle.
#[derive(Debug)]
pub(crate) struct ReaperThread {
    tx: Mutex<Option<Sender<Reaped>>>,
    joins: Mutex<Vec<JoinHandle<()>>>,
}

impl ReaperThread {
    /// Stops the reaper threads once they dropped what was queued before this call, waiting
    /// for them until `deadline`: threads still closing files then are left to finish on
    /// their own (detached). Later reaps are dropped on the thread that makes them.
    pub(crate) fn stop(&self, deadline: Instant) {
        if let Some(tx) = self.tx.lock().take() {
            let threads = self.joins.lock().len();
            for _ in 0..threads {
                if tx.send_deadline(Reaped::Stop, deadline).is_err() {
                    // Full until the deadline: a thread that finds the channel closed (every
                    // sender gone) stops too.
                    break;
                }
            }
        }
        let joins = std::mem::take(&mut *self.joins.lock());
        for j in joins {
            while !j.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if j.is_finished() {
                let _ = j.join();
            }
        }
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
