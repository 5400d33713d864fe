//! The spill roots: this engine's locked process directory under each, and each root's health
//! (a root whose creates or writes fail with a device error is skipped for a while).
//!
//! At open (`Engine::open`, with [`crate::store::proc`]): a missing root is created with its
//! missing parents, and what was created is removed at shutdown if empty; a root that is not a
//! directory fails the open ([`SpillError::RootNotADirectory`]); a root that fails with an OS
//! error (read-only, no permission, a device error) is skipped for the engine's life with a
//! warning and the `roots_unusable` metric, as long as another root works. `Roots` holds only
//! the roots in use, indexed in configuration order among them.
//!
//! Placement: a new segment goes to the healthy root with the fewest segments being written
//! ([`Roots::pick`]; ties in turn). A writer holds its open segment's [`RootUse`], so a slow
//! root, whose writers stay on it longer, gets fewer of the new segments and the other roots'
//! bandwidth is not held back by it (issue 27, point 2).

use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Result, SpillError};
use crate::metrics::Counters;
use crate::store::proc::ProcDir;
use crate::sys::errno;
use crate::sys::fs;

/// Health of one spill root.
#[derive(Debug, Default)]
struct RootHealth {
    skip_until: Mutex<Option<Instant>>,
}

/// The roots in configuration order, with this engine's process directory under each.
#[derive(Debug)]
pub(crate) struct Roots {
    paths: Vec<PathBuf>,
    proc_dirs: Vec<Arc<ProcDir>>,
    /// Directories the open created for missing roots (top first, per root), removed at
    /// shutdown when empty.
    created: Vec<Vec<PathBuf>>,
    health: Vec<RootHealth>,
    /// How long a failed root is skipped.
    skip: Duration,
    next: AtomicUsize,
    /// Segments being written on each root: each open segment's [`RootUse`] counts one.
    writing: Arc<[AtomicUsize]>,
}

/// One segment being written on a root, counted in [`Roots::pick`]'s placement until dropped.
#[derive(Debug)]
pub(crate) struct RootUse {
    writing: Arc<[AtomicUsize]>,
    root: usize,
}

impl Drop for RootUse {
    fn drop(&mut self) {
        self.writing[self.root].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Roots {
    pub(crate) fn new(
        paths: Vec<PathBuf>,
        proc_dirs: Vec<Arc<ProcDir>>,
        created: Vec<Vec<PathBuf>>,
        skip: Duration,
    ) -> Self {
        let n = proc_dirs.len();
        Roots {
            created,
            health: proc_dirs.iter().map(|_| RootHealth::default()).collect(),
            paths,
            proc_dirs,
            skip,
            next: AtomicUsize::new(0),
            writing: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// Directories the open created for missing roots, in creation order (a root created
    /// inside another one comes after it).
    pub(crate) fn created(&self) -> impl DoubleEndedIterator<Item = &PathBuf> {
        self.created.iter().flatten()
    }

    /// This engine's process directories, one per root.
    /// The roots in use, in configuration order (indexes as everywhere else).
    pub(crate) fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    pub(crate) fn proc_dirs(&self) -> &[Arc<ProcDir>] {
        &self.proc_dirs
    }

    /// The root for the next segment: of the roots not being skipped, the one with the fewest
    /// segments being written, ties taken in turn (every root, in turn, if all are skipped).
    pub(crate) fn pick(&self) -> usize {
        let n = self.health.len();
        if n == 1 {
            return 0;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let now = Instant::now();
        let mut best: Option<(usize, usize)> = None;
        for k in 0..n {
            let i = (start + k) % n;
            let skip = *self.health[i].skip_until.lock();
            let writing = self.writing[i].load(Ordering::Relaxed);
            if skip.is_none_or(|t| t <= now) && best.is_none_or(|(w, _)| writing < w) {
                best = Some((writing, i));
            }
        }
        best.map_or(start, |(_, i)| i)
    }

    /// Counts a segment being written on `root` until the returned [`RootUse`] drops.
    pub(crate) fn writing_on(&self, root: usize) -> RootUse {
        self.writing[root].fetch_add(1, Ordering::Relaxed);
        RootUse {
            writing: self.writing.clone(),
            root,
        }
    }

    /// Notes a failed create or write on `root`. A device error (EIO, ENOSPC, EDQUOT, EROFS)
    /// skips the root for the configured `root_skip`; returns true for those.
    pub(crate) fn failed(&self, root: usize, e: &io::Error, counters: &Counters) -> bool {
        let device = matches!(
            e.raw_os_error(),
            Some(errno::EIO) | Some(errno::ENOSPC) | Some(errno::EDQUOT) | Some(errno::EROFS)
        );
        if !device {
            return false;
        }
        let Some(h) = self.health.get(root) else {
            return true;
        };
        let now = Instant::now();
        let mut skip = h.skip_until.lock();
        if skip.is_none_or(|t| t <= now) {
            Counters::add(&counters.root_skips, 1);
            let path = self.paths.get(root).cloned().unwrap_or_default();
            tracing::warn!(root = %path.display(), error = %e,
                skip = ?self.skip, "spill root failed; skipping it");
        }
        *skip = Some(now + self.skip);
        true
    }
}

/// Checks that every root takes `O_DIRECT`, with a probe file in our directory.
pub(crate) fn probe_direct(proc_dirs: &[Arc<ProcDir>]) -> Result<()> {
    for pd in proc_dirs {
        let name = c".spillring-direct-probe";
        match fs::open_segment_at(pd.fd.as_fd(), name, true, true) {
            Ok(fd) => {
                drop(fd);
                let _ = fs::unlinkat(pd.fd.as_fd(), name, false);
            }
            Err(e) if e.raw_os_error() == Some(errno::EINVAL) => {
                return Err(SpillError::InvalidConfig {
                    field: "mode",
                    need: "Buffered on a filesystem without O_DIRECT".into(),
                    got: format!("Direct on {}", pd.path.display()),
                });
            }
            Err(e) => return Err(SpillError::io("probe O_DIRECT", pd.path.clone(), e)),
        }
    }
    Ok(())
}
