//! Directories: the engine's locked process directory under each root, one directory per task
//! and root, and the table that lets name-only cleanup records refer to a directory by index.
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
use crate::sync::{AtomicU64, Ordering};
use crate::sys::fs::{self, Mode, OFlags};

/// Segment number that marks a cleanup record for the directory itself (its `rmdir`): the
/// segment numbers of a task directory stay below it ([`DirEntry::next_segment`]).
pub(crate) const DIR_RECORD: u32 = u32::MAX;

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

/// Creates a new private (0600) segment file; fails if the name exists or is a symlink.
pub(crate) fn create_file_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    direct: bool,
) -> io::Result<OwnedFd> {
    let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
    if direct {
        flags |= OFlags::DIRECT;
    }
    fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))
}

/// Opens an existing file for writing (never through a symlink).
pub(crate) fn open_write_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    fs::openat(dir, name, OFlags::WRONLY | OFlags::NOFOLLOW, Mode::empty())
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

/// Top bit of [`LiveFiles`]: the directory's task scope is closed.
const CLOSED: u64 = 1 << 63;

/// What [`DirEntry::file_gone`] or [`DirEntry::close`] says to do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DirNext {
    /// Nothing: files remain or the scope is open.
    Keep,
    /// The scope is closed and the last file is gone: remove the directory (exactly one caller
    /// ever gets this).
    Remove,
}

/// One task's directory under one root, as the engine's directory table knows it: no fd, so
/// name-only cleanup records can outlive every handle of the task without holding one open.
#[derive(Debug)]
pub(crate) struct DirEntry {
    /// Index in the engine's [`DirTable`].
    pub index: u32,
    pub path: PathBuf,
    /// Name within the process directory, for the final `rmdir`.
    pub name: NameBuf,
    pub parent: Arc<ProcDir>,
    next_segment: AtomicU32,
    live: LiveFiles,
}

/// A directory's file count and its close: `CLOSED` bit | number of files that exist or are
/// being created. Exactly one caller of [`LiveFiles::file_gone`] or [`LiveFiles::close`] ever
/// gets [`DirNext::Remove`], and only once the scope closed and no file is counted; a
/// refused [`LiveFiles::file_coming`] counts nothing. Model-checked with loom
/// (`loom_dir_count_*` below).
#[derive(Debug, Default)]
pub(crate) struct LiveFiles {
    live: AtomicU64,
}

impl DirEntry {
    /// The next unused segment number, or `None` when they ran out.
    pub(crate) fn next_segment(&self) -> Option<u32> {
        let n = self.next_segment.fetch_add(1, Ordering::Relaxed);
        (n < DIR_RECORD).then_some(n)
    }

    /// See [`LiveFiles::file_coming`].
    #[must_use]
    pub(crate) fn file_coming(&self) -> bool {
        self.live.file_coming()
    }

    /// See [`LiveFiles::file_gone`].
    #[must_use]
    pub(crate) fn file_gone(&self) -> DirNext {
        self.live.file_gone()
    }

    /// See [`LiveFiles::close`].
    #[must_use]
    pub(crate) fn close(&self) -> DirNext {
        self.live.close()
    }

    /// `<task dir>/<segment file>`, relative to the process directory: how the cleanup worker
    /// names a file without holding the task directory open.
    pub(crate) fn segment_rel(&self, seg: u32) -> NameBuf {
        NameBuf::joined(&self.name, seg)
    }
}

impl LiveFiles {
    /// Counts a file about to be created (before the create, so the directory cannot be
    /// removed under it). Refuses (returns false, counts nothing) once the scope closed the
    /// directory: its removal may already be queued, and exactly one caller ever removes it.
    #[must_use]
    pub(crate) fn file_coming(&self) -> bool {
        let mut cur = self.live.load(Ordering::Acquire);
        loop {
            if cur & CLOSED != 0 {
                return false;
            }
            match self
                .live
                .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Counts a file confirmed gone (deleted, absent, published, or never created).
    #[must_use]
    pub(crate) fn file_gone(&self) -> DirNext {
        let prev = self.live.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & !CLOSED > 0, "file_gone without a live file");
        if prev == CLOSED | 1 {
            DirNext::Remove
        } else {
            DirNext::Keep
        }
    }

    /// Marks the scope closed. Idempotent.
    #[must_use]
    pub(crate) fn close(&self) -> DirNext {
        let prev = self.live.fetch_or(CLOSED, Ordering::AcqRel);
        if prev == 0 {
            DirNext::Remove
        } else {
            DirNext::Keep
        }
    }
}

/// A task directory held open, for creating and opening its segments. Dereferences to its
/// [`DirEntry`].
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
            live: LiveFiles::default(),
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

    /// Frees `dir`'s slot, if the slot still holds `dir` (not a later directory that reused
    /// the index): a stale removal never takes a live directory's slot.
    pub(crate) fn remove(&self, dir: &Arc<DirEntry>) {
        let mut t = self.inner.lock();
        let idx = dir.index;
        if let Some(slot) = t.slots.get_mut(idx as usize)
            && slot.as_ref().is_some_and(|d| Arc::ptr_eq(d, dir))
        {
            *slot = None;
            t.free.push(idx);
        }
    }

    /// Directories still present (their scope open, or files or removal pending).
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

    fn table_with_parent() -> (DirTable, Arc<ProcDir>) {
        let fd = open_dir(Path::new("/")).unwrap();
        let parent = Arc::new(ProcDir {
            path: PathBuf::from("/"),
            fd: FileHandle::new(fd, crate::io::Reaper::inline()),
            root: 0,
        });
        (DirTable::default(), parent)
    }

    #[test]
    fn a_closed_directory_counts_no_new_file() {
        let (t, p) = table_with_parent();
        let d = t.insert(PathBuf::from("/a"), NameBuf::new(b"a").unwrap(), p);
        assert!(d.file_coming());
        assert_eq!(d.close(), DirNext::Keep);
        assert!(
            !d.file_coming(),
            "a closed directory must refuse a new file"
        );
        assert_eq!(
            d.file_gone(),
            DirNext::Remove,
            "the last file removes it once"
        );
        assert!(!d.file_coming());
        // A directory closed with no file is removed by its closer, once.
        let e = t.insert(
            PathBuf::from("/e"),
            NameBuf::new(b"e").unwrap(),
            t.get(0).unwrap().parent.clone(),
        );
        assert_eq!(e.close(), DirNext::Remove);
        assert_eq!(e.close(), DirNext::Keep);
        assert!(!e.file_coming());
    }

    #[test]
    fn a_stale_removal_never_frees_a_live_slot() {
        let (t, p) = table_with_parent();
        let a = t.insert(PathBuf::from("/a"), NameBuf::new(b"a").unwrap(), p.clone());
        t.remove(&a);
        let b = t.insert(PathBuf::from("/b"), NameBuf::new(b"b").unwrap(), p.clone());
        assert_eq!(a.index, b.index, "the freed index is reused");
        t.remove(&a); // a second, stale removal of a
        assert!(
            t.get(b.index).is_some_and(|d| Arc::ptr_eq(&d, &b)),
            "a stale removal freed a live directory's slot"
        );
        let c = t.insert(PathBuf::from("/c"), NameBuf::new(b"c").unwrap(), p);
        assert_ne!(c.index, b.index, "the live index was handed out twice");
        assert_eq!(t.len(), 2);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::Mutex;
    use loom::thread;

    /// What the model knows of the directory: files counted and created, and whether it was
    /// removed.
    #[derive(Default)]
    struct Disk {
        files: usize,
        removed: bool,
        removals: usize,
    }

    fn remove(disk: &Mutex<Disk>) {
        let mut d = disk.lock();
        assert_eq!(
            d.files, 0,
            "the directory was removed while a file was counted"
        );
        d.removed = true;
        d.removals += 1;
    }

    /// Two writers each count, create and delete a file (a refused count creates nothing)
    /// while the scope closes the directory (twice: `close` is idempotent). Exactly one caller
    /// gets `Remove`, never while a file is counted, and no file is counted after it.
    #[test]
    fn loom_dir_count_removes_once() {
        loom::model(|| {
            let live = Arc::new(LiveFiles::default());
            let disk = Arc::new(Mutex::new(Disk::default()));
            let writers: Vec<_> = (0..2)
                .map(|_| {
                    let (live, disk) = (live.clone(), disk.clone());
                    thread::spawn(move || {
                        if !live.file_coming() {
                            return;
                        }
                        {
                            let mut d = disk.lock();
                            assert!(!d.removed, "a file was counted in a removed directory");
                            d.files += 1;
                        }
                        disk.lock().files -= 1;
                        if live.file_gone() == DirNext::Remove {
                            remove(&disk);
                        }
                    })
                })
                .collect();
            for _ in 0..2 {
                if live.close() == DirNext::Remove {
                    remove(&disk);
                }
            }
            for w in writers {
                w.join().unwrap();
            }
            assert_eq!(
                disk.lock().removals,
                1,
                "the directory must be removed exactly once"
            );
            assert!(!live.file_coming(), "a closed directory counted a file");
        });
    }
}
