//! The engine's one error type.

use std::io;
use std::path::PathBuf;

/// Everything a spillring call can fail with. Each variant names something a caller can act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// The task scope was cancelled or closed while this spill was in progress, and the spill's
    /// files were deleted. This is the expected outcome of a cancel, not a fault. (A reader
    /// whose state went with its scope's normal close gets [`SpillError::ScopeClosed`].)
    #[error("spill aborted: its task scope was closed")]
    Aborted,

    /// A reader's state was deleted because the task scope holding it closed normally: its
    /// producer's task ended, and a scope's close deletes what it still holds. A state that
    /// another task reads after its producer's scope ends must be adopted into the reader's
    /// scope first (`TaskSpill::adopt`). A cancel (or the engine's shutdown) is `Aborted`.
    #[error(
        "spill state gone: its task scope `{task}` was closed, which deletes what it holds; \
         to read a state after its producer's scope ends, adopt it into the reader's scope \
         first (TaskSpill::adopt)"
    )]
    ScopeClosed {
        /// The id of the scope that closed.
        task: String,
    },

    /// The scope, writer or engine is closed and takes no new work.
    #[error("{what} is closed")]
    Closed {
        /// What was closed: "task scope", "engine", "writer".
        what: &'static str,
    },

    /// The ticket ledger is full: `capacity` segment files the engine must still delete exist.
    /// No file was created. Capacity returns as files are deleted.
    #[error("ticket ledger full: {capacity} segment files are outstanding; no file was created")]
    LedgerFull {
        /// The configured ledger capacity.
        capacity: usize,
    },

    /// The engine's byte quota (`max_spill_bytes`) would be exceeded. No file was created.
    /// Capacity returns as files are deleted.
    ///
    /// Every open segment holds a whole `segment_size` of quota until it is sealed (a finished
    /// segment then holds its written bytes): with `max_spill_bytes` below
    /// `writers × segment_size`, an open writer's next segment can be refused while little is
    /// written. See [`crate::EngineConfig::max_spill_bytes`].
    #[error(
        "spill quota exceeded: {in_use} of {limit} bytes in use, {requested} more requested (every open segment reserves a whole segment_size of quota; raise max_spill_bytes or lower segment_size if open writers alone fill it)"
    )]
    QuotaExceeded {
        /// The configured limit, in bytes.
        limit: u64,
        /// Bytes held by live segments when the request was refused.
        in_use: u64,
        /// Bytes the refused reservation asked for.
        requested: u64,
    },

    /// The device is full (ENOSPC or EDQUOT). Everything the failing spill created was deleted.
    #[error("storage full while {op} {path}: {source}")]
    StorageFull {
        /// The operation that failed.
        op: &'static str,
        /// The file or directory it failed on.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The process (EMFILE) or the system (ENFILE) has no file descriptor left. Nothing was
    /// created; a writer that got this at a segment's creation stays usable, and the call can
    /// be retried once descriptors are free (raise `RLIMIT_NOFILE`, or close spills).
    #[error("no file descriptor left while {op} {path}: {source}")]
    TooManyOpenFiles {
        /// The operation that failed.
        op: &'static str,
        /// The file or directory it failed on.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The staging buffers of every open writer use the whole `max_buffer_memory` budget and
    /// none is in flight, so no buffer would ever come back for this write (one thread writing
    /// to more open writers than the budget has 4 KiB buffers for). The writer failed and
    /// deleted its files. Raise `EngineConfig::max_buffer_memory`, or finish writers before
    /// opening more.
    #[error(
        "staging buffer budget exhausted: open writers hold {held} of max_buffer_memory {budget} bytes and no write is in flight; raise EngineConfig::max_buffer_memory or finish writers before opening more"
    )]
    BufferBudgetExhausted {
        /// `max_buffer_memory`.
        budget: usize,
        /// Bytes of staging buffers held by open writers.
        held: usize,
    },

    /// A segment does not hold what was written: a torn, truncated or corrupt file. No bytes of
    /// the bad record were returned.
    #[error("corrupt segment {segment} ({path}) at offset {offset}: {detail}")]
    Corrupt {
        /// The segment's path.
        path: PathBuf,
        /// The segment number.
        segment: u32,
        /// Byte offset in the segment file where the problem starts.
        offset: u64,
        /// What is wrong.
        detail: &'static str,
    },

    /// An I/O operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation: "create", "write", "open", "mmap", "unlink", ...
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The OS error (never a raw negative completion code).
        #[source]
        source: io::Error,
    },

    /// `BackendKind::Uring` was asked for and io_uring could not be set up: refused by a
    /// seccomp profile (Docker's default: `EPERM`), not built into the kernel (`ENOSYS`),
    /// turned off (`/proc/sys/kernel/io_uring_disabled`: `EPERM`) or short of locked memory
    /// (`ENOMEM`). Nothing was created. `BackendKind::Auto` falls back to psync instead.
    #[error(
        "io_uring unavailable (errno {}): {source}; BackendKind::Auto falls back to psync",
        errno.map_or_else(|| "none".to_string(), |e| e.to_string())
    )]
    UringUnavailable {
        /// The OS error number, when the refusal had one.
        errno: Option<i32>,
        /// The error of the setup.
        #[source]
        source: io::Error,
    },

    /// The configuration is invalid: `field` is outside `need` (its bounds, or how it must
    /// relate to another field), and `got` is the value given.
    #[error("invalid configuration: {field}: need {need}, got {got}")]
    InvalidConfig {
        /// The `EngineConfig` field (or publish option) at fault, as its setter is named.
        field: &'static str,
        /// What it must be.
        need: String,
        /// The value given.
        got: String,
    },

    /// A record is larger than the format can frame.
    #[error("record of {len} bytes exceeds the maximum of {max}")]
    RecordTooLarge {
        /// The record's length.
        len: u64,
        /// The largest record the format accepts.
        max: u64,
    },

    /// A name the caller passed is not a plain file name: a publish prefix or a task id that
    /// is empty, holds a `/` or a NUL, or is too long. Nothing was changed.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// What the name is for: "publish prefix", "task id".
        what: &'static str,
        /// The name as given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },

    /// `publish` needs the only grant on a state, and `grants` are alive (readers or clones).
    /// Nothing was changed: drop them and call again.
    #[error("publish needs the only grant on the state; {grants} are alive")]
    StateShared {
        /// Grants alive when publish was called, its own included.
        grants: usize,
    },

    /// A task directory ran out of segment numbers (the file name format's limit). The writer
    /// failed and deleted its files; a new task scope starts numbering afresh.
    #[error("segment numbers exhausted in task directory {path}")]
    SegmentsExhausted {
        /// The task directory.
        path: PathBuf,
    },

    /// This writer failed earlier (the error was returned then) and deleted its files; it takes
    /// no further writes.
    #[error("writer already failed; its files were deleted")]
    WriterFailed,

    /// A `write_async` future of this writer was dropped before it completed, so a record may
    /// be half placed in its stream: the writer failed and deleted its files, and takes no
    /// further writes. (Cancelling a future is fine; use a new writer after it.)
    #[error(
        "a write_async future of this writer was dropped before it completed; the record may be half written, so the writer failed and deleted its files"
    )]
    WriteFutureDropped,

    /// Admission can never succeed for this writer: the tickets (or quota bytes) it holds
    /// itself already fill the ledger (or the quota), so no other spill finishing can make
    /// room. Nothing was created; the writer keeps what it has (`finish` still works).
    #[error(
        "{resource} can never fit this writer: it holds {held} of {limit} itself and needs {requested} more; {fix}"
    )]
    WriterCannotFit {
        /// "ticket ledger" or "spill quota".
        resource: &'static str,
        /// Tickets (or quota bytes) this writer holds.
        held: u64,
        /// The configured limit (`ticket_capacity` or `max_spill_bytes`).
        limit: u64,
        /// What the refused segment asked for (1 ticket, or its quota bytes).
        requested: u64,
        /// The configuration change or call that makes it fit.
        fix: &'static str,
    },

    /// A configured spill root exists and is not a directory (a regular file, a symlink to
    /// nothing, or a path under a regular file): a configuration error, so `Engine::open`
    /// fails even if other roots work. Nothing was created.
    #[error("spill root {path} is not a directory: it is {found}")]
    RootNotADirectory {
        /// The root as configured.
        path: PathBuf,
        /// What is there instead.
        found: &'static str,
    },

    /// `publish` could not move every file into the destination, so it moved none: a name
    /// there is taken (`source` is `EEXIST`; publish never replaces a file), or a rename or
    /// the preparation of a file failed. The files already moved were moved back before this
    /// returned. Like `tempfile`'s `PersistError` hands the file back, the state is handed back
    /// whole: it still holds every file and stays readable; call `publish` again with another
    /// destination or prefix. (Only if moving a file back failed too, which needs a second
    /// fault, are its paths in `stranded`: see there.)
    #[error("{}", publish_failed_message(.path, .source, .stranded))]
    PublishFailed {
        /// The destination path the failure is about: the name taken, the rename that failed,
        /// or where the file that could not be prepared (trimmed, given its mode) would go.
        path: PathBuf,
        /// Every path the publish would have created, in order.
        targets: Vec<PathBuf>,
        /// Files that were moved and could not be moved back: they are at these destination
        /// paths, the caller's (the engine forgets them), and the state cannot read those
        /// segments any more (its reader fails there with `Io`). Empty unless a move back
        /// failed.
        stranded: Vec<PathBuf>,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// `publish` into a directory on another filesystem than the spill root that holds the
    /// files: a rename cannot cross filesystems (`EXDEV`). Nothing was moved; the state still
    /// holds its files and stays readable. Publish into a directory on the root's filesystem
    /// (and copy from there if the data must go elsewhere).
    #[error(
        "cannot publish into {dest}: it is on another filesystem than the spill root {root}, and a \
         rename cannot cross filesystems (EXDEV); nothing was moved, the state still holds its \
         files: publish into a directory on the root's filesystem"
    )]
    PublishCrossesFilesystems {
        /// The destination directory.
        dest: PathBuf,
        /// The directory (under a spill root) that holds the state's files.
        root: PathBuf,
    },

    /// `publish` of a state written by an engine with `encryption(true)`: its files are
    /// ciphertext under a key that lives only in this engine's memory, so no reader outside
    /// it could ever read them. Nothing was moved; the state still holds its files and stays
    /// readable through the engine.
    #[error(
        "cannot publish an encrypted spill state: its key lives only in this engine's memory, so \
         the published files could never be read; nothing was moved, the state stays readable"
    )]
    PublishEncrypted,
}

/// The message of [`SpillError::PublishFailed`].
fn publish_failed_message(
    path: &std::path::Path,
    source: &io::Error,
    stranded: &[PathBuf],
) -> String {
    let what = if source.kind() == io::ErrorKind::AlreadyExists {
        "the name is taken (publish never replaces a file)".to_owned()
    } else {
        source.to_string()
    };
    if stranded.is_empty() {
        format!(
            "publish failed at {}: {what}; nothing was moved, the state still holds its files",
            path.display()
        )
    } else {
        format!(
            "publish failed at {}: {what}; moving back failed for {} file(s), left at {:?} (the \
             caller's now; the state keeps its other files but cannot read those segments)",
            path.display(),
            stranded.len(),
            stranded
        )
    }
}

/// Result alias for spillring calls.
pub type Result<T, E = SpillError> = std::result::Result<T, E>;

impl SpillError {
    /// Builds the right variant for an OS error: ENOSPC and EDQUOT become
    /// [`SpillError::StorageFull`], EMFILE and ENFILE [`SpillError::TooManyOpenFiles`].
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        match source.raw_os_error() {
            Some(errno::ENOSPC) | Some(errno::EDQUOT) => {
                SpillError::StorageFull { op, path, source }
            }
            Some(errno::EMFILE) | Some(errno::ENFILE) => {
                SpillError::TooManyOpenFiles { op, path, source }
            }
            _ => SpillError::Io { op, path, source },
        }
    }

    /// True for [`SpillError::Aborted`]: the task was cancelled, which is not a fault.
    pub fn is_aborted(&self) -> bool {
        matches!(self, SpillError::Aborted)
    }

    /// The kind this error is counted under in `Metrics::errors` (one of
    /// `metrics::ERROR_KINDS`): `storage_full`; `quota` (the byte quota, the ticket ledger,
    /// `WriterCannotFit`, `BufferBudgetExhausted`); `too_many_open_files`; `corrupt`; `io`
    /// (other OS errors, `UringUnavailable`, publish failures); `aborted` (a cancel, a scope
    /// closed under a reader); `misuse` (a caller's mistake: bad config or name, a closed
    /// object, a record too large, a failed writer used again); `other`.
    pub fn kind(&self) -> &'static str {
        match self {
            SpillError::StorageFull { .. } => "storage_full",
            SpillError::QuotaExceeded { .. }
            | SpillError::LedgerFull { .. }
            | SpillError::WriterCannotFit { .. }
            | SpillError::BufferBudgetExhausted { .. } => "quota",
            SpillError::TooManyOpenFiles { .. } => "too_many_open_files",
            SpillError::Corrupt { .. } => "corrupt",
            SpillError::Io { .. }
            | SpillError::UringUnavailable { .. }
            | SpillError::PublishFailed { .. }
            | SpillError::PublishCrossesFilesystems { .. } => "io",
            SpillError::Aborted | SpillError::ScopeClosed { .. } => "aborted",
            SpillError::InvalidConfig { .. }
            | SpillError::InvalidName { .. }
            | SpillError::Closed { .. }
            | SpillError::RecordTooLarge { .. }
            | SpillError::WriterFailed
            | SpillError::WriteFutureDropped
            | SpillError::StateShared { .. }
            | SpillError::PublishEncrypted
            | SpillError::RootNotADirectory { .. } => "misuse",
            SpillError::SegmentsExhausted { .. } => "other",
        }
    }

    /// True when the device is full.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, SpillError::StorageFull { .. })
    }

    /// The OS error behind this error, if there is one.
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            SpillError::Io { source, .. }
            | SpillError::StorageFull { source, .. }
            | SpillError::TooManyOpenFiles { source, .. }
            | SpillError::PublishFailed { source, .. }
            | SpillError::UringUnavailable { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Turns a kernel completion code (`-errno` on failure) into a result. Never passes the negative
/// value on as an "unknown error".
pub(crate) fn cqe_result(res: i32) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as usize)
    }
}

/// The errno values the engine classifies `io::Error`s by (compare with
/// [`std::io::Error::raw_os_error`]), from rustix's `Errno`, so no caller needs `libc` for them.
pub(crate) mod errno {
    use rustix::io::Errno;

    /// The process has no file descriptor left.
    pub(crate) const EMFILE: i32 = Errno::MFILE.raw_os_error();
    /// The system has no file descriptor left.
    pub(crate) const ENFILE: i32 = Errno::NFILE.raw_os_error();
    /// No such file or directory.
    pub(crate) const ENOENT: i32 = Errno::NOENT.raw_os_error();
    /// I/O error (a device error).
    pub(crate) const EIO: i32 = Errno::IO.raw_os_error();
    /// No space left on the device.
    pub(crate) const ENOSPC: i32 = Errno::NOSPC.raw_os_error();
    /// Disk quota exceeded.
    pub(crate) const EDQUOT: i32 = Errno::DQUOT.raw_os_error();
    /// Read-only filesystem.
    pub(crate) const EROFS: i32 = Errno::ROFS.raw_os_error();
    /// Invalid argument (e.g. `O_DIRECT` on a filesystem without it).
    pub(crate) const EINVAL: i32 = Errno::INVAL.raw_os_error();
    /// The name exists.
    pub(crate) const EEXIST: i32 = Errno::EXIST.raw_os_error();
    /// Invalid cross-device link: a rename between two filesystems.
    pub(crate) const EXDEV: i32 = Errno::XDEV.raw_os_error();
    /// Operation cancelled: what an op that never started reports.
    pub(crate) const ECANCELED: i32 = Errno::CANCELED.raw_os_error();
    /// Not a directory.
    pub(crate) const ENOTDIR: i32 = Errno::NOTDIR.raw_os_error();
    /// Too many levels of symbolic links (`O_NOFOLLOW` met a symlink).
    pub(crate) const ELOOP: i32 = Errno::LOOP.raw_os_error();

    #[cfg(test)]
    mod tests {
        /// Each constant is the kernel's (and libc's) number, and an `io::Error` made from a
        /// rustix `Errno` reports that number as its `raw_os_error()`.
        #[test]
        fn errno_values_match_libc_and_survive_conversion() {
            use rustix::io::Errno;
            for (ours, libc, e) in [
                (super::ENOENT, libc::ENOENT, Errno::NOENT),
                (super::EIO, libc::EIO, Errno::IO),
                (super::ENOSPC, libc::ENOSPC, Errno::NOSPC),
                (super::EDQUOT, libc::EDQUOT, Errno::DQUOT),
                (super::EROFS, libc::EROFS, Errno::ROFS),
                (super::EINVAL, libc::EINVAL, Errno::INVAL),
                (super::ECANCELED, libc::ECANCELED, Errno::CANCELED),
                (super::EXDEV, libc::EXDEV, Errno::XDEV),
                (super::ENOTDIR, libc::ENOTDIR, Errno::NOTDIR),
                (super::ELOOP, libc::ELOOP, Errno::LOOP),
                (libc::EWOULDBLOCK, libc::EWOULDBLOCK, Errno::WOULDBLOCK),
                (libc::EOPNOTSUPP, libc::EOPNOTSUPP, Errno::OPNOTSUPP),
                (libc::EINTR, libc::EINTR, Errno::INTR),
                (super::EEXIST, libc::EEXIST, Errno::EXIST),
            ] {
                assert_eq!(ours, libc);
                let io = std::io::Error::from(e);
                assert_eq!(io.raw_os_error(), Some(libc));
                assert_eq!(io.kind(), std::io::Error::from_raw_os_error(libc).kind());
            }
        }
    }
}
