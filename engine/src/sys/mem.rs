//! The one file mapping the engine makes: a finished segment, mapped read-only for the
//! zero-copy reader (`spill/reader.rs`). (The staging buffers are anonymous maps, which
//! `memmap2` makes without `unsafe`.)

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use memmap2::{Mmap, MmapOptions};

/// Maps the first `len` bytes of the segment file `fd` read-only and shared.
///
/// For segment files only, under the contract in `spill/reader.rs`'s module docs: the file is
/// private to the engine (0600, in a 0700 directory, opened with `O_NOFOLLOW`), its writer has
/// finished, and the engine never writes, truncates or `fallocate`s it again while a record
/// (a reference into the map) lives. (A map kept with a pooled file, `io/keptmap.rs`, lives
/// on while the pool's next writer writes the file, but nothing refers into it then: it is
/// read only through the records of a reader of a sealed use, each within that use's length
/// and the file's size.) The caller passes `len <= ` the file's size as it just read it
/// (`fstat`), so the map covers only bytes that exist.
pub(crate) fn map_segment(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mmap> {
    // SAFETY: `Mmap` hands out `&[u8]` into the file's pages, which is sound only while
    // nothing changes the mapped bytes and the file is not shrunk under the map while such a
    // reference lives. Under the contract above the engine does neither: a segment is private, opened without following
    // links, and never written, truncated or `fallocate`d after its writer finished, and the
    // map covers only bytes that existed when it was made. What the engine cannot exclude is
    // documented in `spill/reader.rs` ("SIGBUS: what a caller must not do"): a media error
    // under the map, or a caller (or another process of the same user) truncating or
    // overwriting a published file while `Bytes` read from it are alive. A shrunk file or a
    // failed page-in raises `SIGBUS` on access rather than returning bytes.
    unsafe { MmapOptions::new().len(len).map(fd.as_raw_fd()) }
}
