//! Getting a segment's bytes for the reader: the fd to read through (the writer's, kept with the
//! file, or one opened by name), one `pread` of a small segment into a kept read buffer, and the
//! page touch of an async reader's map. Walking them is the segment codec's (`format/cursor.rs`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytes::Bytes;

use crate::io::FileHandle;

/// Touches one byte of every page of `map` (read-ahead for async readers, on an offload
/// thread): the page faults of a cold map are taken here, so the reader's caller finds the
/// pages resident.
pub(super) fn touch_pages(map: &[u8]) {
    let mut acc = 0u8;
    for i in (0..map.len()).step_by(4096) {
        acc ^= map[i];
    }
    std::hint::black_box(acc);
}

/// A segment's fd for one open: the writer's, kept with the file, or one opened here (closed
/// when the open is done: a map needs no fd).
pub(super) enum SegmentFd {
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
pub(super) fn read_small(
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
