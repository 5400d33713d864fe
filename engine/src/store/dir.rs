//! Directories: the engine's locked process directory under each root (segments live flat in
//! it), and the table that lets name-only cleanup records refer to a directory by index.
//! Also the few `*at` syscalls the engine uses, so every file is opened relative to a
//! directory fd, with `O_NOFOLLOW`, and created with `O_EXCL` and private permissions.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use parking_lot::Mutex;

use crate::io::{FileHandle, NameBuf};
use crate::sync::Ordering;
use crate::sys::fs::{self, Mode, OFlags};

/// Segment numbers of a directory stay below this ([`DirEntry::next_segment`]).
pub(crate) const SEGMENT_LIMIT: u32 = u32::MAX;

/// Opens a directory (never through a symlink).
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        Mode::empty(),
    )
}

/// Opens a directory by path.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    fs::openat(
        fs::CWD,
        &c,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
}

/// Creates a private (0700) directory.
pub(crate) fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))
}

/// Creates a new private (0600) segment file; fails if the name exists or is a symlink. Open
/// for reading too: in buffered mode the fd stays with the sealed segment for its reader.
pub(crate) fn create_file_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    direct: bool,
) -> io::Result<OwnedFd> {
    let mut flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
    if direct {
        flags |= OFlags::DIRECT;
    }
    fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))
}

/// Opens an existing file for writing (never through a symlink).
pub(crate) fn open_write_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    fs::openat(dir, name, OFlags::WRONLY | OFlags::NOFOLLOW, Mode::empty())
}

/// Reopens an existing segment file for a new use (never through a symlink, never creating),
/// for reading too (see [`create_file_at`]).
pub(crate) fn reopen_segment_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    direct: bool,
) -> io::Result<OwnedFd> {
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW;
    if direct {
        flags |= OFlags::DIRECT;
    }
    fs::openat(dir, name, flags, Mode::empty())
}

/// Opens a file for reading (never through a symlink).
pub(crate) fn open_read_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    fs::openat(dir, name, OFlags::RDONLY | OFlags::NOFOLLOW, Mode::empty())
}

/// `unlinkat` on the calling thread.
pub(crate) fn unlink_at(dir: BorrowedFd<'_>, name: &CStr, rmdir: bool) -> io::Result<()> {
    fs::unlinkat(dir, name, rmdir)
}

/// `renameat2(RENAME_NOREPLACE)` on the calling thread: never replaces an existing name.
pub(crate) fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    fs::renameat_noreplace(from_dir, from, to_dir, to)
}

/// Takes an exclusive advisory lock (`flock`) without waiting; `Ok(false)` if another open file
/// description holds it. The lock lives as long as the fd: it dies with its process, whatever
/// the PID, which is why liveness is never decided by a PID.
pub(crate) fn try_lock(fd: BorrowedFd<'_>) -> io::Result<bool> {
    fs::try_lock_exclusive(fd)
}

/// `fallocate(KEEP_SIZE)` the first `len` bytes. `Ok(false)` if the filesystem cannot.
pub(crate) fn preallocate(fd: BorrowedFd<'_>, len: u64) -> io::Result<bool> {
    fs::fallocate(fd, true, len)
}

/// `fallocate` the first `len` bytes, growing the file to `len`. `Ok(false)` if the
/// filesystem cannot.
pub(crate) fn allocate(fd: BorrowedFd<'_>, len: u64) -> io::Result<bool> {
    fs::fallocate(fd, false, len)
}

/// `ftruncate` to `len`.
pub(crate) fn truncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    fs::ftruncate(fd, len)
}

pub(crate) fn cpath(p: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// The engine's own directory under one root, locked for the engine's life.
#[derive(Debug)]
pub(crate) struct ProcDir {
    pub path: PathBuf,
    pub fd: Arc<FileHandle>,
    pub root: usize,
}

/// One directory segments live in (the process directory under a root), as the engine's
/// directory table knows it: no fd, so name-only cleanup records can outlive every handle
/// without holding one open.
#[derive(Debug)]
pub(crate) struct DirEntry {
    /// Index in the engine's [`DirTable`].
    pub index: u32,
    pub path: PathBuf,
    /// Name relative to `parent` that segment names are joined to (".": the directory itself).
    pub name: NameBuf,
    pub parent: Arc<ProcDir>,
    next_segment: AtomicU32,
}

impl DirEntry {
    /// The next unused segment number, or `None` when they ran out.
    pub(crate) fn next_segment(&self) -> Option<u32> {
        let n = self.next_segment.fetch_add(1, Ordering::Relaxed);
        (n < SEGMENT_LIMIT).then_some(n)
    }

    /// A segment's name relative to `parent`: how the cleanup worker names a file without
    /// holding anything but the parent open.
    pub(crate) fn segment_rel(&self, seg: u32) -> NameBuf {
        NameBuf::joined(&self.name, seg)
    }
}

/// A directory segments live in, held open, for creating and opening its segments.
/// Dereferences to its [`DirEntry`].
#[derive(Debug)]
pub(crate) struct TaskDir {
    pub entry: Arc<DirEntry>,
    pub fd: Arc<FileHandle>,
    /// Where a segment of this directory dropped without a hand-off sends its name.
    pub cleanup: Arc<crate::store::queue::CleanupQueue>,
}

impl std::ops::Deref for TaskDir {
    type Target = DirEntry;
    fn deref(&self) -> &DirEntry {
        &self.entry
    }
}

impl AsFd for TaskDir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Directories by index, so a cleanup record needs four bytes to name one.
#[derive(Debug, Default)]
pub(crate) struct DirTable {
    inner: Mutex<DirSlots>,
}

#[derive(Debug, Default)]
struct DirSlots {
    slots: Vec<Option<Arc<DirEntry>>>,
    free: Vec<u32>,
}

impl DirTable {
    /// Adds a directory entry and returns it with its new index.
    pub(crate) fn insert(
        &self,
        path: PathBuf,
        name: NameBuf,
        parent: Arc<ProcDir>,
    ) -> Arc<DirEntry> {
        let mut t = self.inner.lock();
        let index = match t.free.pop() {
            Some(i) => i,
            None => {
                t.slots.push(None);
                (t.slots.len() - 1) as u32
            }
        };
        let d = Arc::new(DirEntry {
            index,
            path,
            name,
            parent,
            next_segment: AtomicU32::new(0),
        });
        t.slots[index as usize] = Some(d.clone());
        d
    }

    pub(crate) fn get(&self, idx: u32) -> Option<Arc<DirEntry>> {
        self.inner
            .lock()
            .slots
            .get(idx as usize)
            .and_then(|s| s.clone())
    }

    /// [`DirTable::get`] through `last`, the entry the caller looked up before: the table is
    /// locked only when `idx` names another directory (a cleanup batch's records mostly share
    /// one, so a batch of eight takes one lock, not sixteen).
    pub(crate) fn get_via<'a>(
        &self,
        idx: u32,
        last: &'a mut Option<Arc<DirEntry>>,
    ) -> Option<&'a Arc<DirEntry>> {
        if last.as_ref().is_none_or(|d| d.index != idx) {
            *last = self.get(idx);
        }
        last.as_ref()
    }

    /// Directories in the table.
    pub(crate) fn len(&self) -> usize {
        let t = self.inner.lock();
        t.slots.len() - t.free.len()
    }
}

/// Lists the names in a directory (without "." and "..").
pub(crate) fn list_dir(path: &Path) -> io::Result<Vec<std::ffi::OsString>> {
    fs::list_dir(path)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_index_and_number_segments_from_zero() {
        let fd = open_dir(Path::new("/")).unwrap();
        let parent = Arc::new(ProcDir {
            path: PathBuf::from("/"),
            fd: FileHandle::new(fd, crate::io::Reaper::inline()),
            root: 0,
        });
        let t = DirTable::default();
        let a = t.insert(PathBuf::from("/a"), NameBuf::dot(), parent.clone());
        let b = t.insert(PathBuf::from("/b"), NameBuf::dot(), parent);
        assert_ne!(a.index, b.index);
        assert!(t.get(b.index).is_some_and(|d| Arc::ptr_eq(&d, &b)));
        assert_eq!(t.len(), 2);
        // Through a cache: the entry asked for, whichever was cached; none for a free index.
        let mut last = None;
        for want in [&a, &a, &b, &a] {
            let got = t.get_via(want.index, &mut last);
            assert!(got.is_some_and(|d| Arc::ptr_eq(d, want)));
        }
        assert!(t.get_via(99, &mut last).is_none());
        assert!(last.is_none(), "a miss leaves nothing cached");
        assert!(
            t.get_via(b.index, &mut last)
                .is_some_and(|d| Arc::ptr_eq(d, &b))
        );
        assert_eq!((a.next_segment(), a.next_segment()), (Some(0), Some(1)));
        assert_eq!(
            a.segment_rel(7).as_cstr().to_bytes(),
            b"./spill-segment-000007.bin"
        );
    }
}
