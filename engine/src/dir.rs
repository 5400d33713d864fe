//! Directories: the engine's locked process directory under each root, one directory per task
//! and root, and the table that lets name-only cleanup records refer to a directory by index.
//! Also the few `*at` syscalls the engine uses, so every file is opened relative to a
//! directory fd, with `O_NOFOLLOW`, and created with `O_EXCL` and private permissions.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use parking_lot::Mutex;

use crate::io::{FileHandle, NameBuf};
use crate::sync::{AtomicU64, Ordering};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `openat` returning an owned fd.
fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `name` is NUL-terminated and outlives the call; the returned fd is checked.
        let r = unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        match cvt(r) {
            // SAFETY: a successful openat returns a new fd nothing else owns.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Opens a directory (never through a symlink).
pub(crate) fn open_dir_at(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

/// Opens a directory by path.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    open_at(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// Creates a private (0700) directory.
pub(crate) fn mkdir_at(dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe { libc::mkdirat(dir, name.as_ptr(), 0o700) }).map(drop)
}

/// Creates a new private (0600) segment file; fails if the name exists or is a symlink.
pub(crate) fn create_file_at(dir: RawFd, name: &CStr, direct: bool) -> io::Result<OwnedFd> {
    let mut flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    if direct {
        flags |= libc::O_DIRECT;
    }
    open_at(dir, name, flags, 0o600)
}

/// Opens an existing file for writing (never through a symlink).
pub(crate) fn open_write_at(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_WRONLY | libc::O_NOFOLLOW, 0)
}

/// Opens a file for reading (never through a symlink).
pub(crate) fn open_read_at(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    open_at(dir, name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)
}

/// `unlinkat` on the calling thread.
pub(crate) fn unlink_at(dir: RawFd, name: &CStr, rmdir: bool) -> io::Result<()> {
    let flags = if rmdir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is NUL-terminated and outlives the call.
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) }).map(drop)
}

/// `renameat2(RENAME_NOREPLACE)` on the calling thread: never replaces an existing name.
pub(crate) fn rename_at(from_dir: RawFd, from: &CStr, to_dir: RawFd, to: &CStr) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated and outlive the call.
    cvt(unsafe {
        libc::renameat2(
            from_dir,
            from.as_ptr(),
            to_dir,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
    .map(drop)
}

/// Takes an exclusive advisory lock (`flock`) without waiting; `Ok(false)` if another open file
/// description holds it. The lock lives as long as the fd: it dies with its process, whatever
/// the PID, which is why liveness is never decided by a PID.
pub(crate) fn try_lock(fd: RawFd) -> io::Result<bool> {
    // SAFETY: flock on an fd has no memory-safety preconditions.
    let r = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// `fallocate(KEEP_SIZE)` the first `len` bytes. `Ok(false)` if the filesystem cannot.
pub(crate) fn preallocate(fd: RawFd, len: u64) -> io::Result<bool> {
    fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, len)
}

/// `fallocate` the first `len` bytes, growing the file to `len`. `Ok(false)` if the
/// filesystem cannot.
pub(crate) fn allocate(fd: RawFd, len: u64) -> io::Result<bool> {
    fallocate(fd, 0, len)
}

fn fallocate(fd: RawFd, mode: libc::c_int, len: u64) -> io::Result<bool> {
    loop {
        // SAFETY: fallocate on an fd has no memory-safety preconditions.
        let r = unsafe { libc::fallocate(fd, mode, 0, len as libc::off_t) };
        match cvt(r) {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

/// `ftruncate` to `len`.
pub(crate) fn truncate(fd: RawFd, len: u64) -> io::Result<()> {
    // SAFETY: ftruncate on an fd has no memory-safety preconditions.
    cvt(unsafe { libc::ftruncate(fd, len as libc::off_t) }).map(drop)
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
        (n < crate::cleanup::DIR_RECORD).then_some(n)
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
    pub cleanup: Arc<crate::cleanup::Cleanup>,
}

impl std::ops::Deref for TaskDir {
    type Target = DirEntry;
    fn deref(&self) -> &DirEntry {
        &self.entry
    }
}

impl TaskDir {
    pub(crate) fn raw(&self) -> RawFd {
        self.fd.raw()
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
    let mut out = Vec::new();
    for e in std::fs::read_dir(path)? {
        out.push(e?.file_name());
    }
    Ok(out)
}

/// Raw fd of an owned fd (for the few places that need it).
pub(crate) fn raw(fd: &OwnedFd) -> RawFd {
    fd.as_raw_fd()
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
