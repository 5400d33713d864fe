//! Disk allocation of segments (direct mode, `preallocate`): a writer's first segment grows in
//! steps as its writes reach them, later ones are allocated whole at creation; `finish` gives
//! back what was allocated past the written length.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use super::SpillWriter;
use super::hook::WriterShared;
use crate::config::DIRECT_ALIGN;
use crate::format::segment::{HEADER_LEN, SegmentFileName};
use crate::shared::EngineShared;
use crate::sys::fs;

impl SpillWriter {
    /// What a new segment allocates at its creation: a writer's first segment starts small
    /// ([`first_step`]) and grows in steps, so a small spill holds disk in proportion to what
    /// it wrote; a writer that already filled a segment is a long spill, and its next segments
    /// are allocated whole, once, as before the steps (an extending `fallocate` takes the inode
    /// lock that the segment's O_DIRECT writes in flight share).
    pub(super) fn first_allocation(&self, need: u64, reserve: u64) -> u64 {
        if self.segments() > 0 {
            reserve
        } else {
            first_step(need, reserve)
        }
    }
}

/// The first allocation step of a segment: room for its header and first record, at least
/// [`ALLOC_STEP_MIN`], whole blocks, at most the segment's reservation.
pub(super) fn first_step(need: u64, reserve: u64) -> u64 {
    (HEADER_LEN as u64 + need)
        .max(ALLOC_STEP_MIN)
        .next_multiple_of(DIRECT_ALIGN as u64)
        .min(reserve)
}

/// The smallest allocation step (direct mode, `preallocate`).
pub(super) const ALLOC_STEP_MIN: u64 = 1 << 20;

/// The next allocation of a segment holding `allocated` bytes whose writes reach `end`: double
/// what it has, at least to `end`, at most its reservation (or `end` past that).
pub(super) fn next_step(allocated: u64, end: u64, reserve: u64) -> u64 {
    (allocated * 2)
        .max(ALLOC_STEP_MIN)
        .min(reserve)
        .max(end.next_multiple_of(DIRECT_ALIGN as u64))
}

/// `fallocate`s the first `len` bytes of a segment: growing the file (direct mode: O_DIRECT
/// writes inside the file size run in parallel under a shared inode lock, where extending
/// writes serialise) or keeping its size (`preallocate`: a full disk fails here rather than
/// mid-record). The bytes allocated: `len`, or 0 if the mode allocates nothing or the
/// filesystem cannot.
pub(super) fn allocate_step(
    fd: BorrowedFd<'_>,
    direct: bool,
    preallocate: bool,
    len: u64,
) -> io::Result<u64> {
    let done = if direct {
        fs::fallocate(fd, false, len)?
    } else if preallocate {
        fs::fallocate(fd, true, len)?
    } else {
        false
    };
    Ok(if done { len } else { 0 })
}

/// What a segment of `len` written bytes keeps on disk after its trim: whole 4 KiB blocks
/// (direct mode pads its last write to them).
pub(super) fn trimmed_len(len: u64) -> u64 {
    len.next_multiple_of(DIRECT_ALIGN as u64)
}

/// Gives back the unused tails of segments allocated up front (direct mode, `preallocate`),
/// then shrinks each ticket to the written length. Runs after every write of the writer completed, so it never waits for
/// one, and outside the file-list lock, so a cancel never waits for it. A segment whose
/// trim fails keeps its whole ticket: the quota still counts what is allocated.
pub(super) fn trim_allocations(core: &EngineShared, shared: &WriterShared, direct: bool) {
    if !needs_trim(shared) {
        return;
    }
    for i in 0.. {
        let target = {
            let f = shared.files.lock();
            let Some(e) = f.entries.get(i) else { break };
            (e.allocated > 0).then(|| (e.dir.clone(), e.seg, e.len, e.allocated, e.kept_fd()))
        };
        let Some((dir, seg, len, allocated, kept)) = target else {
            continue;
        };
        // Direct mode padded the last write to whole blocks; a buffered file is exactly
        // `len` long. Truncating to the size it has frees the blocks allocated past it
        // (ext4 and tmpfs truncate preallocated blocks even when the size does not change;
        // punching a hole past the end is a no-op on ext4).
        let keep = if direct { trimmed_len(len) } else { len };
        let name = SegmentFileName::new(seg);
        let r = match kept {
            // The writer's fd, kept with the file: no open.
            Some(h) => fs::ftruncate(h.as_fd(), keep.min(allocated)),
            None => core
                .io
                .fds()
                .open_with(|| fs::open_file_at(dir.as_fd(), name.as_cstr(), true))
                .and_then(|fd| fs::ftruncate(fd.as_fd(), keep.min(allocated))),
        };
        match r {
            Ok(()) => {
                let mut f = shared.files.lock();
                if let Some(e) = f.entries.get_mut(i) {
                    e.allocated = 0;
                    e.shrink_to(len);
                }
            }
            // Only disk space is at stake: the reader uses the written length.
            Err(e) => {
                tracing::debug!(error = %e, "trimming a segment failed; keeping its ticket")
            }
        }
    }
}

/// True if a segment of the writer still holds an allocation past its written length.
pub(super) fn needs_trim(shared: &WriterShared) -> bool {
    shared.files.lock().entries.iter().any(|e| e.allocated > 0)
}
