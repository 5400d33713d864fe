//! Reopening the open segment after the engine's fd bound (`max_open_files`, `io/fdcache.rs`)
//! closed its idle fd: by name, at the process directory's fd, with the flags it was created
//! with (`O_DIRECT` in direct mode), never creating. A segment the scope's cancel deleted
//! meanwhile is `Aborted` (the cancel owns its delete: the reopen never creates a file, so
//! every file still has exactly one deleter).

use std::os::fd::AsFd;
use std::sync::Arc;

use super::SpillWriter;
use crate::error::{Result, SpillError};
use crate::fault::{self, FaultPoint};
use crate::format::segment::SegmentFileName;
use crate::io::FileHandle;
use crate::store::dir;

impl SpillWriter {
    /// The open segment's fd for a write op: the cached one (the hot path: no syscall), or
    /// the segment reopened. A refusal here may come with part of a record already staged,
    /// so it fails the writer (its files are deleted) rather than leave it usable.
    pub(super) fn segment_file(&mut self) -> Result<Arc<FileHandle>> {
        if let Some(f) = self.seg.as_ref().and_then(|s| s.file.get()) {
            return Ok(f);
        }
        match self.reopen_segment() {
            Ok(f) => Ok(f),
            Err(e @ SpillError::TooManyOpenFiles { .. }) => Err(self.fail(e)),
            Err(e) => Err(e),
        }
    }

    /// Reopens the open segment under a new permit of the fd bound (waiting at the bound).
    pub(super) fn reopen_segment(&mut self) -> Result<Arc<FileHandle>> {
        let Some(seg) = self.seg.as_ref() else {
            return Err(SpillError::WriterFailed);
        };
        if self.shared.files.is_aborted() {
            return Err(SpillError::Aborted);
        }
        let found = {
            let f = self.shared.files.lock();
            f.entries
                .get(seg.entry_index)
                .map(|e| (e.dir.clone(), e.seg))
        };
        let Some((task_dir, num)) = found else {
            // The list was taken: by the cancel (then `Aborted`), or the writer failed.
            return Err(if self.shared.files.is_aborted() {
                SpillError::Aborted
            } else {
                SpillError::WriterFailed
            });
        };
        let task_plan = self.task.fault_plan();
        let _ = fault::check2(
            task_plan.as_ref(),
            &self.core.fault,
            FaultPoint::WriterReopen,
        );
        let fds = self.core.io.fds();
        let permit = fds.permit();
        let name = SegmentFileName::new(num);
        let direct = self.direct;
        let opened =
            fds.open_with(|| dir::reopen_segment_at(task_dir.as_fd(), name.as_cstr(), direct));
        match opened {
            Ok(fd) => Ok(seg.file.fill(fd, permit, self.core.io.reaper().clone())),
            // The cancel deleted it between the check above and the open.
            Err(_) if self.shared.files.is_aborted() => Err(SpillError::Aborted),
            Err(e) => Err(SpillError::io(
                "reopen",
                task_dir.path.join(name.as_str()),
                e,
            )),
        }
    }
}
