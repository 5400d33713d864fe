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
use crate::io::{FileHandle, Reaper};
use crate::store::dir::{self, ProcDir};
use crate::sys::{self, errno};

static ORPHAN_SEQ: AtomicU64 = AtomicU64::new(0);

/// Creates and locks this engine's process directory under `root`, then claims the
/// directories of dead engines there. Returns the directory and the claimed paths (to be
/// deleted in the background).
pub(crate) fn claim(
    root: &Path,
    index: usize,
    id: &mut u64,
    reaper: &Reaper,
) -> Result<(Arc<ProcDir>, Vec<PathBuf>)> {
    let root_err = |op, e| SpillError::io(op, root, e);
    std::fs::create_dir_all(root).map_err(|e| root_err("create root", e))?;
    let root_fd = dir::open_dir(root).map_err(|e| root_err("open root", e))?;
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
        match dir::mkdir_at(root_fd.as_fd(), &cname) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 8 => {
                *id = random_id();
                continue;
            }
            Err(e) => return Err(SpillError::io("create process directory", path, e)),
        }
        let fd = match dir::open_dir_at(root_fd.as_fd(), &cname) {
            Ok(fd) => fd,
            // Another engine's sweep took our new directory before we opened it (it had no
            // lock yet, so it looked dead): start over with a fresh name.
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 8 => {
                *id = random_id();
                continue;
            }
            Err(e) => return Err(SpillError::io("open process directory", path, e)),
        };
        let locked = dir::try_lock(fd.as_fd())
            .map_err(|e| SpillError::io("lock process directory", path.clone(), e))?;
        let ours = locked && same_inode(&fd, &path);
        if ours {
            break ProcDir {
                path,
                fd: FileHandle::new(fd, reaper.clone()),
                root: index,
            };
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
    let pd = Arc::new(pd);
    let mut claimed = Vec::new();
    let names = dir::list_dir(root).map_err(|e| root_err("list root", e))?;
    for name in names {
        let Some(s) = name.to_str() else { continue };
        if !s.starts_with(PROC_PREFIX) || root.join(s) == pd.path {
            continue;
        }
        match claim_one(&root_fd, s, &pd) {
            Ok(Some(p)) => claimed.push(p),
            Ok(None) => {}
            Err(e) => tracing::warn!(dir = %root.join(s).display(), error = %e,
                "could not examine a spillring directory at open; leaving it"),
        }
    }
    Ok((pd, claimed))
}

fn same_inode(fd: &std::os::fd::OwnedFd, path: &Path) -> bool {
    sys::fs::same_inode(fd.as_fd(), path).unwrap_or(false)
}

/// Takes `name`'s lock if its owner is dead, and moves it into our directory. `None` for a
/// live engine's directory (or a name that is not a directory).
fn claim_one(
    root_fd: &std::os::fd::OwnedFd,
    name: &str,
    ours: &ProcDir,
) -> io::Result<Option<PathBuf>> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let fd = match dir::open_dir_at(root_fd.as_fd(), &cname) {
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
    if !dir::try_lock(fd.as_fd())? {
        return Ok(None); // alive
    }
    let to = format!(
        "orphan-{}-{}",
        ORPHAN_SEQ.fetch_add(1, Ordering::Relaxed),
        name
    );
    let cto = CString::new(to.clone()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // Still holding the dead engine's lock, so no other sweeper moves it at the same time.
    dir::rename_at(root_fd.as_fd(), &cname, ours.fd.as_fd(), &cto)?;
    drop(fd);
    Ok(Some(ours.path.join(to)))
}

/// A fresh random 64-bit id.
pub(crate) fn random_id() -> u64 {
    let mut b = [0u8; 8];
    let n = crate::sys::rand::getrandom(&mut b);
    let mut v = u64::from_ne_bytes(b);
    if !matches!(n, Ok(8)) {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        v = t ^ (u64::from(std::process::id()) << 32) ^ SEQ.fetch_add(1, Ordering::Relaxed);
    }
    v
}
