//! The psync backend: each op is a plain syscall (`pwrite`, `pwritev`, `unlinkat`) on an I/O
//! thread of the engine's, so callers keep write-behind semantics without io_uring.

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{
    Deadline, LaneRx, Msg, Op, OpKind, WriteData, abandoned, enter_lane, injected, pwrite_all,
    skip_len, take_overflow,
};
use crate::fault::FaultPlan;

pub(crate) fn spawn(
    index: usize,
    lane: usize,
    lane_rx: LaneRx,
    fault: Option<Arc<FaultPlan>>,
    deadline: Arc<Deadline>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("spillring-psync-{index}"))
        .spawn(move || {
            enter_lane(lane);
            let rx = &lane_rx.rx;
            let mut own = std::collections::VecDeque::new();
            let mut stopping = false;
            loop {
                // Ops this thread queued to itself (from completions) come first.
                take_overflow(&mut own);
                if let Some(op) = own.pop_front() {
                    run(op, &fault, &deadline);
                    continue;
                }
                let msg = if stopping {
                    match rx.try_recv() {
                        Ok(m) => m,
                        Err(_) => break,
                    }
                } else {
                    match rx.recv() {
                        Ok(m) => m,
                        Err(_) => break,
                    }
                };
                match msg {
                    Msg::Op(op) => run(op, &fault, &deadline),
                    Msg::Shutdown => stopping = true,
                }
            }
            lane_rx.close();
        })
}

fn run(op: Op, fault: &Option<Arc<FaultPlan>>, deadline: &Deadline) {
    let Some(mut op) = op.resolve() else { return };
    if deadline.passed() {
        // A shutdown's budget ran out before this op started: it is not started at all.
        return op.complete(Err(abandoned()));
    }
    op.apply_fills();
    let res = perform(&op, fault);
    op.complete(res);
}

/// Runs `op` with plain syscalls on the calling thread, through its fault point.
pub(crate) fn perform(op: &Op, fault: &Option<Arc<FaultPlan>>) -> io::Result<usize> {
    injected(fault, op).run(skip_len(&op.kind), || execute(&op.kind))
}

/// Runs one op with plain syscalls.
pub(crate) fn execute(kind: &OpKind) -> io::Result<usize> {
    match kind {
        OpKind::Write { file, offset, data } => match data {
            WriteData::Staged(buf) => pwrite_all(file.as_fd(), buf.filled(), &[], *offset),
            WriteData::Framed { frame, payload } => {
                pwrite_all(file.as_fd(), frame, payload, *offset)
            }
        },
        OpKind::Unlink { dir, name, .. } => {
            crate::sys::fs::unlinkat(dir.as_fd(), name.as_cstr(), false).map(|()| 0)
        }
        // Resolved before it runs (`Op::resolve`): never executed itself.
        OpKind::InSlot(_) => Err(io::Error::from(io::ErrorKind::InvalidInput)),
    }
}
