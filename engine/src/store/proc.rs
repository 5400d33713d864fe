//! Process directories (invariant 8 in ARCHITECTURE.md): each engine holds an advisory lock (`flock`) on
//! its own process directory under every root for its whole life. At open, sibling directories
//! whose lock can be taken belong to dead processes: they are renamed into the new engine's own
//! (locked) directory at once, and the cleanup worker deletes them in the background
//! (`cleanup::sweep`), so a large sweep never stalls start-up and a live engine's files are
//! never touched. Liveness is never decided by a PID (PIDs repeat across containers).

use std::ffi::CString;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, SpillError};
use crate::format::names::{PROC_PREFIX, proc_dir_name};
use crate::format::segment::SegmentFileName;
use crate::io::{FileHandle, Reaper};
use crate::store::queue::CleanupQueue;
use crate::sys::{errno, fs};

static ORPHAN_SEQ: AtomicU64 = AtomicU64::new(0);

/// The engine's own directory under one root, locked for the engine's life. Every segment
/// under that root lives flat in it, and a cleanup record names it by its root's index.
#[derive(Debug)]
pub(crate) struct ProcDir {
    pub path: PathBuf,
    pub fd: Arc<FileHandle>,
    /// Its root's index among the roots in use.
    pub root: usize,
    /// Where a segment of this directory dropped without a hand-off sends its name.
    pub cleanup: Arc<CleanupQueue>,
    /// Counted in 64 bits so it never wraps back to a number in use.
    next_segment: AtomicU64,
}

impl ProcDir {
    pub(crate) fn new(
        path: PathBuf,
        fd: Arc<FileHandle>,
        root: usize,
        cleanup: Arc<CleanupQueue>,
    ) -> Self {
        let next_segment = AtomicU64::new(0);
        ProcDir {
            path,
            fd,
            root,
            cleanup,
            next_segment,
        }
    }

    /// Where segment `seg` of this directory is.
    pub(crate) fn segment_path(&self, seg: u32) -> PathBuf {
        self.path.join(SegmentFileName::new(seg).as_str())
    }

    /// The next unused segment number, or `None` when they ran out (at `u32::MAX`).
    pub(crate) fn next_segment(&self) -> Option<u32> {
        let n = self.next_segment.fetch_add(1, Ordering::Relaxed);
        u32::try_from(n).ok().filter(|&n| n < u32::MAX)
    }
}

impl std::os::fd::AsFd for ProcDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Makes sure `root` is a directory. A missing root is created, with its missing parents
/// (mode 0777 less the umask, like `mkdir -p`); the directories created are returned, top
/// first, so that the engine removes them (when empty) at shutdown or after a failed open.
///
/// A root that exists and is not a directory (a regular file, a symlink to nothing, a path
/// under a file) is [`SpillError::RootNotADirectory`]: a configuration error. Any other
/// failure is an OS error ([`SpillError::io`]), which the engine treats like a root failing
/// at runtime (it skips the root if another works).
pub(crate) fn prepare_root(root: &Path) -> Result<Vec<PathBuf>> {
    let not_dir = |found| SpillError::RootNotADirectory {
        path: root.to_path_buf(),
        found,
    };
    match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => return Ok(Vec::new()),
        Ok(m) if m.is_file() => return Err(not_dir("a regular file")),
        Ok(_) => return Err(not_dir("a special file (device, socket or FIFO)")),
        Err(e) if e.raw_os_error() == Some(errno::ENOTDIR) => {
            return Err(not_dir("a path under a file that is not a directory"));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SpillError::io("examine root", root, e)),
    }
    if std::fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(not_dir("a symlink to nothing"));
    }
    // The missing directories, deepest first.
    let mut missing = Vec::new();
    let mut p = root;
    loop {
        match std::fs::symlink_metadata(p) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(p.to_path_buf()),
            Err(e) if e.raw_os_error() == Some(errno::ENOTDIR) => {
                return Err(not_dir("a path under a file that is not a directory"));
            }
            Err(e) => return Err(SpillError::io("examine root", p, e)),
        }
        match p.parent() {
            Some(q) if !q.as_os_str().is_empty() => p = q,
            _ => break,
        }
    }
    let mut created = Vec::new();
    for d in missing.iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => created.push(d.clone()),
            // Made meanwhile by someone else, or an alias (`a/..`) of one just made.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => {
                remove_created(created.iter());
                return Err(SpillError::io("create root", d, e));
            }
        }
    }
    if !created.is_empty() {
        tracing::info!(root = %root.display(), created = ?created,
            "spill root was missing; created it (it is removed at shutdown if empty)");
    }
    Ok(created)
}

/// Removes directories [`prepare_root`] created (given in creation order: for several roots,
/// their lists one after the other), last created first, each only if it is empty (one
/// holding another engine's directory or the caller's files stays, and so do its parents).
pub(crate) fn remove_created<'a>(created: impl DoubleEndedIterator<Item = &'a PathBuf>) {
    for d in created.rev() {
        let _ = std::fs::remove_dir(d);
    }
}

/// Creates and locks this engine's process directory under `root` (which exists).
pub(crate) fn make_own(
    root: &Path,
    index: usize,
    id: &mut u64,
    reaper: &Reaper,
    cleanup: &Arc<CleanupQueue>,
) -> Result<Arc<ProcDir>> {
    let root_err = |op, e| SpillError::io(op, root, e);
    let root_fd = fs::open_dir(root).map_err(|e| root_err("open root", e))?;
    // Make and lock our directory. Another engine's sweep can take the lock of a directory
    // between our mkdir and our flock (it looks dead then); if that happened, we see that the
    // lock is held, or that our path no longer names our directory, and start over.
    let mut tries = 0;
    let pd = loop {
        tries += 1;
        let name = proc_dir_name(*id);
        let cname = CString::new(name.clone())
            .map_err(|_| root_err("name", io::ErrorKind::InvalidInput.into()))?;
        let path = root.join(&name);
        match fs::mkdir_private(root_fd.as_fd(), &cname) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 8 => {
                *id = random_id();
                continue;
            }
            Err(e) => return Err(SpillError::io("create process directory", path, e)),
        }
        let fd = match fs::open_dir_at(root_fd.as_fd(), &cname) {
            Ok(fd) => fd,
            // Another engine's sweep took our new directory before we opened it (it had no
            // lock yet, so it looked dead): start over with a fresh name.
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 8 => {
                *id = random_id();
                continue;
            }
            Err(e) => return Err(SpillError::io("open process directory", path, e)),
        };
        let locked = match fs::try_lock_exclusive(fd.as_fd()) {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir(&path);
                return Err(SpillError::io("lock process directory", path, e));
            }
        };
        let ours = locked && same_inode(&fd, &path);
        if ours {
            let fd = FileHandle::new(fd, reaper.clone());
            break ProcDir::new(path, fd, index, cleanup.clone());
        }
        if tries >= 8 {
            return Err(SpillError::io(
                "lock process directory",
                path,
                io::Error::other("lost the directory to a concurrent sweep 8 times"),
            ));
        }
        *id = random_id();
    };
    Ok(Arc::new(pd))
}

/// Claims the directories of dead engines under `root` into `ours` and returns their new
/// paths (to be deleted in the background). Runs once the open can no longer fail, so a
/// failed open never moves another engine's directory. What cannot be examined is logged
/// and left alone.
pub(crate) fn claim_dead(root: &Path, ours: &ProcDir) -> Vec<PathBuf> {
    let mut claimed = Vec::new();
    let root_fd = match fs::open_dir(root) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(root = %root.display(), error = %e,
                "could not open a spill root to claim dead engines' directories; leaving them");
            return claimed;
        }
    };
    let names = match fs::list_dir(root) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(root = %root.display(), error = %e,
                "could not list a spill root to claim dead engines' directories; leaving them");
            return claimed;
        }
    };
    for name in names {
        let Some(s) = name.to_str() else { continue };
        if !s.starts_with(PROC_PREFIX) || root.join(s) == ours.path {
            continue;
        }
        match claim_one(&root_fd, s, ours) {
            Ok(Some(p)) => claimed.push(p),
            Ok(None) => {}
            Err(e) => tracing::warn!(dir = %root.join(s).display(), error = %e,
                "could not examine a spillring directory at open; leaving it"),
        }
    }
    claimed
}

fn same_inode(fd: &std::os::fd::OwnedFd, path: &Path) -> bool {
    fs::same_inode(fd.as_fd(), path).unwrap_or(false)
}

/// Takes `name`'s lock if its owner is dead, and moves it into our directory. `None` for a
/// live engine's directory (or a name that is not a directory).
fn claim_one(
    root_fd: &std::os::fd::OwnedFd,
    name: &str,
    ours: &ProcDir,
) -> io::Result<Option<PathBuf>> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let fd = match fs::open_dir_at(root_fd.as_fd(), &cname) {
        Ok(fd) => fd,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(errno::ENOTDIR) | Some(errno::ELOOP) | Some(errno::ENOENT)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    if !fs::try_lock_exclusive(fd.as_fd())? {
        return Ok(None); // alive
    }
    let to = format!(
        "orphan-{}-{}",
        ORPHAN_SEQ.fetch_add(1, Ordering::Relaxed),
        name
    );
    let cto = CString::new(to.clone()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // Still holding the dead engine's lock, so no other sweeper moves it at the same time.
    fs::renameat_noreplace(root_fd.as_fd(), &cname, ours.fd.as_fd(), &cto)?;
    drop(fd);
    Ok(Some(ours.path.join(to)))
}

/// A fresh random 64-bit id.
pub(crate) fn random_id() -> u64 {
    let mut b = [0u8; 8];
    let filled = crate::sys::rand::fill(&mut b);
    let mut v = u64::from_ne_bytes(b);
    if filled.is_err() {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t ^ (u64::from(std::process::id()) << 32) ^ SEQ.fetch_add(1, Ordering::Relaxed);
    }
    v
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_process_directory_numbers_its_segments_from_zero_until_they_run_out() {
        let fd = fs::open_dir(Path::new("/")).unwrap();
        let fd = FileHandle::new(fd, Reaper::inline());
        let d = ProcDir::new(PathBuf::from("/"), fd, 3, Arc::new(CleanupQueue::new(4)));
        assert_eq!((d.next_segment(), d.next_segment()), (Some(0), Some(1)));
        d.next_segment
            .store(u64::from(u32::MAX) - 1, Ordering::Relaxed);
        assert_eq!(d.next_segment(), Some(u32::MAX - 1));
        assert_eq!(d.next_segment(), None, "u32::MAX is never a segment number");
        assert_eq!(d.next_segment(), None);
    }
}
