//! The io_uring backend: one ring per I/O thread. All of the engine's io_uring code is here.
//!
//! Requests arrive over a crossbeam channel; the thread moves as many as it has slots for into
//! the submission queue and submits them with one `io_uring_enter`. When it has nothing to do it
//! sleeps in `io_uring_enter` with a poll armed on an eventfd, and a sender writes the eventfd
//! only when the thread said it is going to sleep, so a busy ring costs senders no syscall.
//!
//! Every in-flight op lives in a slot of a fixed array (stable addresses for iovecs and names)
//! and owns its buffer and file until its completion arrives; the thread leaves only when no op
//! is in flight, so the kernel never writes from or to freed memory, whatever callers did.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::TryRecvError;
use io_uring::{IoUring, opcode, register::Probe, squeue, types};

mod wake;

use super::{
    Deadline, IoSetup, LaneRx, Msg, Op, OpKind, Wake, WriteData, abandoned, injected, skip_len,
};
use crate::error::cqe_result;
use crate::fault::{FaultPlan, Injected};
use wake::EventWake;

const WAKE_TOKEN: u64 = u64::MAX;

/// Unlinks in the kernel at once per ring. io-wq runs at most 4 of them in parallel anyway (its
/// worker cap), and each can take tens of milliseconds on a disk with online discard: what is
/// in the kernel is what a shutdown must wait for, so only a few go there at a time.
const MAX_UNLINKS: usize = 8;

struct Slot {
    op: Option<Op>,
    /// Bytes of a write already done (short writes are continued).
    done: usize,
    /// Report this errno after the op completes (an injected ambiguous outcome).
    fail_after: Option<i32>,
    iov: [libc::iovec; 2],
}

impl Slot {
    fn empty() -> Self {
        Slot {
            op: None,
            done: 0,
            fail_after: None,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        }
    }
}

struct Ring {
    ring: IoUring,
    lane: LaneRx,
    wake: Arc<EventWake>,
    slots: Box<[Slot]>,
    free: Vec<usize>,
    backlog: VecDeque<Op>,
    /// Unlinks waiting for one of the [`MAX_UNLINKS`] unlink slots.
    unlinks: VecDeque<Op>,
    unlinks_inflight: usize,
    inflight: usize,
    deadline: Arc<Deadline>,
    fixed: bool,
    registered: Vec<bool>,
    fault: Option<Arc<FaultPlan>>,
    cqes: Vec<(u64, i32)>,
    /// Writes go to the page cache: made here with `pwritev` (see [`Ring::start`]).
    page_cache_writes: bool,
}

// SAFETY: the raw pointers in `Slot::iov` point into buffers owned by the slot's own op, which
// moves with the ring; nothing else refers to them.
unsafe impl Send for Ring {}

/// Sets up a ring (on the calling thread, so a refusal is returned to `Engine::open`) and starts
/// its thread.
pub(crate) fn spawn(
    index: usize,
    lane: usize,
    rx: LaneRx,
    setup: &IoSetup,
) -> io::Result<(Arc<dyn Wake>, JoinHandle<()>)> {
    let entries = setup.ring_entries;
    let ring = IoUring::builder()
        .setup_cqsize(entries * 2)
        .setup_clamp()
        .build(entries)?;
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [
        (opcode::Write::CODE, "write"),
        (opcode::Writev::CODE, "writev"),
        (opcode::UnlinkAt::CODE, "unlinkat"),
        (opcode::PollAdd::CODE, "poll_add"),
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring lacks the {name} opcode"),
            ));
        }
    }
    // Buffered writes to one inode are serialised in io-wq anyway; cap its workers so a burst
    // of punted requests does not spawn a thread each (both limits: bounded, unbounded).
    let mut max = [4u32, 4u32];
    let _ = ring.submitter().register_iowq_max_workers(&mut max);

    let nslots = setup.pool.max_slots();
    let fixed = probe.is_supported(opcode::WriteFixed::CODE)
        && nslots > 0
        && ring
            .submitter()
            .register_buffers_sparse(nslots as u32)
            .is_ok();

    let wake = Arc::new(EventWake::new()?);
    // One slot less than the SQ: the eventfd poll is always in flight too.
    let nops = entries as usize - 1;
    let mut r = Ring {
        ring,
        lane: rx,
        wake: wake.clone(),
        slots: (0..nops).map(|_| Slot::empty()).collect(),
        free: (0..nops).rev().collect(),
        // Sized once: it never holds more than the free slots (plus ops the thread sends itself).
        backlog: VecDeque::with_capacity(nops),
        unlinks: VecDeque::new(),
        unlinks_inflight: 0,
        inflight: 0,
        deadline: setup.deadline.clone(),
        fixed,
        registered: vec![false; if fixed { nslots } else { 0 }],
        fault: setup.fault.clone(),
        page_cache_writes: setup.page_cache_writes,
        cqes: Vec::with_capacity(entries as usize * 2),
    };
    let join = std::thread::Builder::new()
        .name(format!("spillring-ring-{index}"))
        .spawn(move || {
            super::enter_lane(lane);
            r.run()
        })?;
    Ok((wake, join))
}

impl Ring {
    fn run(&mut self) {
        let mut shutting_down = false;
        if let Err(e) = self.arm_wake() {
            tracing::error!(error = %e, "spillring ring thread cannot arm its wake poll");
        }
        loop {
            super::take_overflow(&mut self.backlog);
            // Take only what free slots can start: the rest waits in the bounded channel,
            // which holds its senders back, instead of growing a queue here.
            while self.backlog.len() + self.unlinks.len() < self.free.len() {
                match self.lane.rx.try_recv() {
                    Ok(Msg::Op(op)) => self.backlog.push_back(op),
                    Ok(Msg::Shutdown) => shutting_down = true,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        shutting_down = true;
                        break;
                    }
                }
            }
            self.start_unlinks();
            while !self.free.is_empty() {
                let Some(op) = self.backlog.pop_front() else {
                    break;
                };
                self.start(op);
            }
            if self.backlog.is_empty() && self.backlog.capacity() > 4096 {
                self.backlog.shrink_to(64);
            }
            if shutting_down
                && self.inflight == 0
                && self.backlog.is_empty()
                && self.unlinks.is_empty()
                && self.lane.rx.is_empty()
            {
                break;
            }
            let mut want = usize::from(self.ring.completion().is_empty());
            if want == 1 {
                self.wake.sleeping.announce_sleep();
                let waiting = !self.backlog.is_empty()
                    || !self.lane.rx.is_empty()
                    || (!self.unlinks.is_empty() && self.unlinks_inflight < MAX_UNLINKS);
                if waiting && !self.free.is_empty() {
                    want = 0;
                }
            }
            let r = self.ring.submit_and_wait(want);
            self.wake.sleeping.awake();
            match r {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {} // reap below, then retry
                Err(e) => {
                    tracing::error!(error = %e, "io_uring_enter failed");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.reap();
        }
        self.lane.close();
        // The eventfd poll may still be armed; it holds no buffer, so dropping the ring is safe.
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let e = opcode::PollAdd::new(types::Fd(self.wake.efd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(WAKE_TOKEN);
        self.push(&e)
    }

    fn push(&mut self, e: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every pointer in `e` refers to memory owned by an in-flight slot (or to
            // the eventfd, which lives as long as the ring); slots are not reused until their
            // completion is reaped.
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return Ok(());
            }
            // The SQ is full of unsubmitted entries: hand them to the kernel and retry.
            self.ring.submit()?;
        }
    }

    /// Starts waiting unlinks while unlink slots are free.
    fn start_unlinks(&mut self) {
        while self.unlinks_inflight < MAX_UNLINKS && !self.free.is_empty() {
            let Some(op) = self.unlinks.pop_front() else {
                break;
            };
            self.start(op);
        }
    }

    fn start(&mut self, op: Op) {
        let Some(mut op) = op.resolve() else { return };
        if self.deadline.passed() {
            // A shutdown's budget ran out before this op started: it is not started at all.
            return op.complete(Err(abandoned()));
        }
        if op.has_fills() && !self.ring.submission().is_empty() {
            // The copy below takes this thread ~0.1-0.4 ms per MiB: hand the kernel the writes
            // already queued first. Without this, the writes of a batch (the buffers a writer
            // queued while this thread was busy or preempted) reached the device only once
            // every buffer of the batch was copied, and the device idled meanwhile
            // (results/fio-gap/). An error leaves the entries queued for the loop's
            // `submit_and_wait`, which handles it.
            let _ = self.ring.submit();
        }
        op.apply_fills();
        let is_unlink = matches!(op.kind, OpKind::Unlink { .. });
        if is_unlink && self.unlinks_inflight >= MAX_UNLINKS {
            self.unlinks.push_back(op);
            return;
        }
        let fail_after = match injected(&self.fault, &op) {
            Injected::Fail(e) => {
                op.complete(Err(io::Error::from_raw_os_error(e)));
                return;
            }
            Injected::FailAfter(e) => Some(e),
            Injected::Skip => {
                let n = skip_len(&op.kind);
                op.complete(Ok(n));
                return;
            }
            Injected::None => None,
        };
        if self.page_cache_writes && !is_unlink {
            // A page-cache write: io_uring tries it without blocking, fails (ext4 and tmpfs
            // cannot), and hands it to an io-wq worker, whose completion wakes this thread,
            // which wakes the writer: four wake-ups per write where the psync backend has two,
            // and a wake-up of an idle vCPU costs tens of µs on a VM. Made here, the write
            // blocks this ring for its copy into the page cache (io-wq serialises writes to
            // one inode anyway); its unlinks still go through the ring.
            let res = super::psync::execute(&op.kind);
            let res = match fail_after {
                Some(e) => res.and(Err(io::Error::from_raw_os_error(e))),
                None => res,
            };
            return op.complete(res);
        }
        let Some(idx) = self.free.pop() else {
            self.backlog.push_front(op);
            return;
        };
        self.register_buffer_for(&op);
        if is_unlink {
            self.unlinks_inflight += 1;
        }
        let slot = &mut self.slots[idx];
        slot.op = Some(op);
        slot.done = 0;
        slot.fail_after = fail_after;
        self.inflight += 1;
        self.submit_slot(idx);
    }

    /// Registers a pooled buffer with this ring the first time it is used here.
    fn register_buffer_for(&mut self, op: &Op) {
        let OpKind::Write {
            data: WriteData::Staged(buf),
            ..
        } = &op.kind
        else {
            return;
        };
        let Some(s) = buf.slot else { return };
        let s = s as usize;
        if !self.fixed || s >= self.registered.len() || self.registered[s] {
            return;
        }
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.capacity(),
        };
        // SAFETY: the buffer is a pooled mapping that the pool keeps for the engine's life (it
        // has a registration slot); the kernel pins its pages while it is registered.
        match unsafe {
            self.ring
                .submitter()
                .register_buffers_update(s as u32, &[iov], None)
        } {
            Ok(()) => self.registered[s] = true,
            Err(e) => {
                tracing::info!(error = %e, "io_uring buffer registration refused; using unregistered buffers");
                self.fixed = false;
            }
        }
    }

    /// Builds and pushes the SQE for the slot's op at its current progress.
    fn submit_slot(&mut self, idx: usize) {
        let fixed = self.fixed;
        let registered = &self.registered;
        let slot = &mut self.slots[idx];
        let Some(op) = slot.op.as_ref() else { return };
        let entry = match &op.kind {
            OpKind::Write { file, offset, data } => {
                let fd = types::Fd(file.raw());
                let off = offset + slot.done as u64;
                match data {
                    WriteData::Staged(buf) => {
                        // SAFETY: `done < buf.len <= capacity`, so the pointer stays inside the
                        // buffer the slot owns.
                        let ptr = unsafe { buf.as_ptr().add(slot.done) };
                        let len = (buf.len - slot.done) as u32;
                        match buf.slot {
                            Some(s) if fixed && registered.get(s as usize) == Some(&true) => {
                                opcode::WriteFixed::new(fd, ptr, len, s).offset(off).build()
                            }
                            _ => opcode::Write::new(fd, ptr, len).offset(off).build(),
                        }
                    }
                    WriteData::Framed { frame, payload } => {
                        let (iov, cnt) = super::iovecs_after(frame, payload, slot.done);
                        slot.iov = iov;
                        opcode::Writev::new(fd, slot.iov.as_ptr(), cnt)
                            .offset(off)
                            .build()
                    }
                }
            }
            OpKind::Unlink { dir, name, .. } => {
                opcode::UnlinkAt::new(types::Fd(dir.raw()), name.as_ptr()).build()
            }
            // Resolved in `start`: a claim never takes a slot.
            OpKind::InSlot(_) => opcode::Nop::new().build(),
        }
        .user_data(idx as u64);
        if let Err(e) = self.push(&entry) {
            self.finish(idx, Err(e));
        }
    }

    fn reap(&mut self) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(ud, res) in &cqes {
            if ud == WAKE_TOKEN {
                self.drain_eventfd();
                if let Err(e) = self.arm_wake() {
                    tracing::error!(error = %e, "spillring ring thread cannot re-arm its wake poll");
                }
                continue;
            }
            self.on_complete(ud as usize, res);
        }
        cqes.clear();
        self.cqes = cqes;
    }

    fn drain_eventfd(&self) {
        // Its outcome does not matter: the poll fired, and the counter only has to be reset.
        let _ = crate::sys::event::eventfd_drain(self.wake.efd.as_fd());
    }

    fn on_complete(&mut self, idx: usize, res: i32) {
        let Some(slot) = self.slots.get_mut(idx) else {
            tracing::error!(idx, "completion for an unknown slot");
            return;
        };
        let Some(op) = slot.op.as_ref() else {
            tracing::error!(idx, "completion for an empty slot");
            return;
        };
        match &op.kind {
            OpKind::Write { data, .. } => {
                let total = data.len();
                match cqe_result(res) {
                    Err(e) => self.finish(idx, Err(e)),
                    Ok(0) => self.finish(idx, Err(io::Error::from(io::ErrorKind::WriteZero))),
                    Ok(n) => {
                        slot.done += n;
                        if slot.done >= total {
                            self.finish(idx, Ok(total));
                        } else {
                            self.submit_slot(idx);
                        }
                    }
                }
            }
            OpKind::Unlink { .. } | OpKind::InSlot(_) => self.finish(idx, cqe_result(res)),
        }
    }

    fn finish(&mut self, idx: usize, mut res: io::Result<usize>) {
        let slot = &mut self.slots[idx];
        let Some(op) = slot.op.take() else { return };
        if matches!(op.kind, OpKind::Unlink { .. }) {
            self.unlinks_inflight -= 1;
        }
        if let Some(e) = slot.fail_after.take()
            && res.is_ok()
        {
            res = Err(io::Error::from_raw_os_error(e));
        }
        self.free.push(idx);
        self.inflight -= 1;
        op.complete(res);
    }
}
