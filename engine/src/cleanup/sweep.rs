//! The crash sweep's second half: deleting, on the cleanup worker's thread, the directory
//! trees of dead engines that `store::proc::claim_dead` moved into this engine's own directory
//! (at open, and then every `orphan_rescan`).

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::fault::fault_point;
use crate::metrics::Counters;
use crate::shared::EngineShared;

/// Claims the directories of dead engines under each of this engine's roots and queues their
/// trees for [`delete_tree`]. Runs once the open can no longer fail, and then every
/// `orphan_rescan` on the worker's thread (an engine may die, or be dropped with deletes left,
/// while this one runs).
pub(crate) fn claim_dead_engines(core: &EngineShared) {
    for pd in core.store.roots.proc_dirs() {
        if let Some(root) = pd.path.parent() {
            for p in crate::store::proc::claim_dead(root, pd) {
                core.store.cleanup.sweep(p);
            }
        }
    }
}

/// Deletes a claimed tree (on the cleanup worker's thread). Counts what it removed; whatever
/// it cannot remove is retried later, and if the engine stops first, the next open sweeps it
/// again (it sits inside this engine's process directory).
pub(crate) fn delete_tree(core: &Arc<EngineShared>, path: &Path) {
    let mut files = 0u64;
    let stop = || core.store.cleanup.stopping();
    let unlink =
        |p: &Path| fault_point!(SweepUnlink, core.fault).run((), || std::fs::remove_file(p));
    let r = remove_tree(path, &mut files, &stop, &unlink);
    Counters::add(&core.counters.orphan_files_swept, files);
    match r {
        Ok(()) => {
            Counters::add(&core.counters.orphan_dirs_swept, 1);
            core.store.cleanup.end();
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => core.store.cleanup.end(),
        // Stopped by a shutdown: the rest stays in our process directory for the next open.
        Err(e) if e.kind() == io::ErrorKind::Interrupted => core.store.cleanup.sweep_left(path),
        Err(e) => {
            Counters::add(&core.counters.delete_failures, 1);
            tracing::warn!(dir = %path.display(), error = %e, "sweep of an orphan directory failed; will retry");
            core.store
                .cleanup
                .sweep_later(path.to_path_buf(), core.cfg.cleanup_retry_delay);
        }
    }
}

/// Removes `path` and everything under it (files with `unlink`, counted in `files`); stops
/// with `Interrupted` as soon as `stop()` says so (checked before every unlink).
fn remove_tree(
    path: &Path,
    files: &mut u64,
    stop: &dyn Fn() -> bool,
    unlink: &dyn Fn(&Path) -> io::Result<()>,
) -> io::Result<()> {
    for entry in std::fs::read_dir(path)? {
        if stop() {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let entry = entry?;
        let p = entry.path();
        if entry.file_type()?.is_dir() {
            remove_tree(&p, files, stop, unlink)?;
        } else {
            match unlink(&p) {
                Ok(()) => *files += 1,
                // Gone since the readdir (another sweeper, an operator): what we wanted.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    std::fs::remove_dir(path)
}
