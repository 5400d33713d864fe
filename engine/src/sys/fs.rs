//! Filesystem syscalls: opening, creating, removing and renaming names relative to a
//! directory fd, advisory locks, allocation, truncation, and inode identity.

use std::ffi::{CStr, OsString};
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::{AtFlags, FallocateFlags, FlockOperation, RenameFlags};
use rustix::io::Errno;

use rustix::fs::{CWD, Mode, OFlags};

/// `openat(dir, name, flags | O_CLOEXEC, mode)`, retried while it fails with `EINTR`.
fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    loop {
        match rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, mode) {
            Ok(fd) => return Ok(fd),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Opens a directory, never through a symlink.
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
    openat(dir, name, flags, Mode::empty())
}

/// Opens a directory by path.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    openat(CWD, &c, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
}

/// Creates a private (0700) directory.
pub(crate) fn mkdir_private(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?)
}

/// Opens a segment file for reading and writing, never through a symlink: `create` makes a
/// new private (0600) file and fails if the name exists, otherwise the file must exist (a
/// reopen, or a pooled file's next use). Readable too: in buffered mode the fd stays with the
/// sealed segment for its reader.
pub(crate) fn open_segment_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    create: bool,
    direct: bool,
) -> io::Result<OwnedFd> {
    let mut flags = OFlags::RDWR | OFlags::NOFOLLOW;
    if create {
        flags |= OFlags::CREATE | OFlags::EXCL;
    }
    if direct {
        flags |= OFlags::DIRECT;
    }
    openat(dir, name, flags, Mode::from_raw_mode(0o600))
}

/// Opens an existing file for writing (`write`) or reading, never through a symlink.
pub(crate) fn open_file_at(dir: BorrowedFd<'_>, name: &CStr, write: bool) -> io::Result<OwnedFd> {
    let access = if write {
        OFlags::WRONLY
    } else {
        OFlags::RDONLY
    };
    openat(dir, name, access | OFlags::NOFOLLOW, Mode::empty())
}

/// `unlinkat(dir, name, rmdir ? AT_REMOVEDIR : 0)`.
pub(crate) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, rmdir: bool) -> io::Result<()> {
    let flags = if rmdir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    Ok(rustix::fs::unlinkat(dir, name, flags)?)
}

/// `renameat2(from_dir, from, to_dir, to, RENAME_NOREPLACE)`: fails with `EEXIST` rather than
/// replace an existing name.
pub(crate) fn renameat_noreplace(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    Ok(rustix::fs::renameat_with(
        from_dir,
        from,
        to_dir,
        to,
        RenameFlags::NOREPLACE,
    )?)
}

/// Whether `name` exists in `dir` (not following a symlink, so a dangling link exists too):
/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`, `Ok(false)` on `ENOENT`.
pub(crate) fn exists_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<bool> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The device and inode numbers of `fd` (`fstat`): the device tells two filesystems apart.
pub(crate) fn dev_ino(fd: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev as u64, st.st_ino as u64))
}

/// The number of names the file at `fd` has (`fstat`'s `st_nlink`): 0 once it was unlinked.
pub(crate) fn link_count(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_nlink as u64)
}

/// The size of the file at `fd` (`fstat`).
pub(crate) fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_size as u64)
}

/// Bytes an unprivileged writer may still allocate on the filesystem of `fd` (`fstatvfs`:
/// available blocks times the fragment size).
pub(crate) fn available_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let s = rustix::fs::fstatvfs(fd)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// `fchmod(fd, mode)`: sets the permission bits (the umask does not apply).
pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?)
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: `Ok(true)` if taken, `Ok(false)` if another open file
/// description holds it (`EWOULDBLOCK`).
pub(crate) fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `fallocate(fd, keep_size ? FALLOC_FL_KEEP_SIZE : 0, 0, len)`, retried while it fails with
/// `EINTR`. `Ok(false)` if the filesystem cannot (`EOPNOTSUPP`).
pub(crate) fn fallocate(fd: BorrowedFd<'_>, keep_size: bool, len: u64) -> io::Result<bool> {
    let mode = if keep_size {
        FallocateFlags::KEEP_SIZE
    } else {
        FallocateFlags::empty()
    };
    loop {
        match rustix::fs::fallocate(fd, mode, 0, len) {
            Ok(()) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(Errno::OPNOTSUPP) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// `ftruncate(fd, len)`.
pub(crate) fn ftruncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    Ok(rustix::fs::ftruncate(fd, len)?)
}

/// Whether `fd` and `path` (followed if a symlink, as `stat` does) are the same inode: the
/// same device and inode numbers, from `fstat(fd)` and `stat(path)`.
pub(crate) fn same_inode(fd: BorrowedFd<'_>, path: &Path) -> io::Result<bool> {
    let a = std::fs::metadata(path)?;
    let st = rustix::fs::fstat(fd)?;
    Ok(a.dev() == st.st_dev as u64 && a.ino() == st.st_ino as u64)
}

/// The names in a directory, without "." and "..".
pub(crate) fn list_dir(path: &Path) -> io::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(path)? {
        out.push(e?.file_name());
    }
    Ok(out)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn tmp() -> (tempfile::TempDir, OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let c = std::ffi::CString::new(t.path().as_os_str().as_encoded_bytes()).unwrap();
        let fd = openat(CWD, &c, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (t, fd)
    }

    #[test]
    fn errors_keep_their_errno() {
        let (t, d) = tmp();
        let d = d.as_fd();
        let e = openat(d, c"missing", OFlags::RDONLY, Mode::empty()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        mkdir_private(d, c"sub").unwrap();
        let e = mkdir_private(d, c"sub").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        let e = unlinkat(d, c"sub", false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EISDIR));
        drop(
            openat(
                d,
                c"f",
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                Mode::from_raw_mode(0o600),
            )
            .unwrap(),
        );
        let e = renameat_noreplace(d, c"f", d, c"sub").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        let e = openat(
            d,
            c"f",
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::empty(),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        unlinkat(d, c"sub", true).unwrap();
        // A dangling symlink is a name that exists.
        assert!(!exists_at(d, c"link").unwrap());
        std::os::unix::fs::symlink(t.path().join("nowhere"), t.path().join("link")).unwrap();
        assert!(exists_at(d, c"link").unwrap());
        unlinkat(d, c"link", false).unwrap();
        assert!(exists_at(d, c"f").unwrap());
        let e = exists_at(d, c"f/x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR));
        renameat_noreplace(d, c"f", d, c"g").unwrap();
        let mut names = list_dir(t.path()).unwrap();
        names.sort();
        assert_eq!(names, vec![OsString::from("g")]);
    }

    #[test]
    fn flock_is_exclusive_between_open_file_descriptions() {
        let (t, d) = tmp();
        let c = std::ffi::CString::new(t.path().as_os_str().as_encoded_bytes()).unwrap();
        let d2 = openat(CWD, &c, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert!(try_lock_exclusive(d.as_fd()).unwrap());
        assert!(!try_lock_exclusive(d2.as_fd()).unwrap());
        assert!(same_inode(d2.as_fd(), t.path()).unwrap());
        assert!(!same_inode(d2.as_fd(), Path::new("/")).unwrap());
        drop(d);
        assert!(try_lock_exclusive(d2.as_fd()).unwrap());
    }

    #[test]
    fn allocate_and_truncate_set_the_size() {
        let (_t, d) = tmp();
        let fd = openat(
            d.as_fd(),
            c"f",
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        let f = std::fs::File::from(fd);
        if fallocate(f.as_fd(), true, 8192).unwrap() {
            assert_eq!(f.metadata().unwrap().len(), 0, "KEEP_SIZE grew the file");
        }
        if fallocate(f.as_fd(), false, 8192).unwrap() {
            assert_eq!(f.metadata().unwrap().len(), 8192);
        }
        ftruncate(f.as_fd(), 100).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 100);
        fchmod(f.as_fd(), 0o640).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o7777, 0o640);
        let (dev, ino) = dev_ino(f.as_fd()).unwrap();
        let m = f.metadata().unwrap();
        assert_eq!((dev, ino), (m.dev(), m.ino()));
    }
}
