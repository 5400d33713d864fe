//! Where files live, with no threads of their own: the ticket ledger ([`ledger`]), the roots
//! and their health ([`roots`]), process directories, where segments live flat ([`proc`]), a
//! segment file with its ticket ([`entry`]), the cleanup worker's queue of name-only records
//! ([`queue`]), and the marks of delete batches in flight ([`marks`]).

pub(crate) mod entry;
pub(crate) mod ledger;
pub(crate) mod marks;
pub(crate) mod pool;
pub(crate) mod proc;
pub(crate) mod queue;
pub(crate) mod records;
pub(crate) mod roots;

use std::os::fd::AsFd;
use std::sync::Arc;

use ledger::Ledger;
use marks::DeleteMarks;
use pool::SegmentPool;
use proc::ProcDir;
use queue::CleanupQueue;
use roots::Roots;

/// The engine's storage state: what exists on disk and who must delete it.
#[derive(Debug)]
pub(crate) struct Store {
    /// Tickets: files on disk the engine must still delete, and the byte quota.
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) roots: Roots,
    /// Name-only records of deletes not confirmed, and orphan sweeps.
    pub(crate) cleanup: Arc<CleanupQueue>,
    /// Released segment files kept for reuse.
    pub(crate) pool: SegmentPool,
    /// Which delete batches are done (a `StorageFull` writer waits for its own).
    pub(crate) delete_marks: DeleteMarks,
}

impl Store {
    /// The process directory of root `root`, where its segments go; a cleanup record names
    /// it by this index.
    pub(crate) fn dir(&self, root: usize) -> Option<&Arc<ProcDir>> {
        self.roots.proc_dirs().get(root)
    }

    /// [`Store::dir`] for a writer: a root out of range is a configuration error.
    pub(crate) fn root_dir(&self, root: usize) -> crate::error::Result<Arc<ProcDir>> {
        self.dir(root)
            .cloned()
            .ok_or_else(|| crate::error::SpillError::InvalidConfig {
                field: "roots",
                need: format!("fewer than {} roots", self.roots.proc_dirs().len() + 1),
                got: format!("root {root}"),
            })
    }

    /// How much of what spills could hold on root `root` they hold: the engine's bytes there
    /// over those bytes plus the filesystem's available bytes (0 when unknown). `Auto`
    /// compresses as it nears 1 (`spill/writer/codec.rs`).
    pub(crate) fn root_fill(&self, root: usize) -> f64 {
        let Some(dir) = self.dir(root) else {
            return 0.0;
        };
        let Ok(avail) = crate::sys::fs::available_bytes(dir.fd.as_fd()) else {
            return 0.0;
        };
        let held = self.ledger.bytes_on(root);
        if held == 0 {
            return 0.0;
        }
        held as f64 / (held as f64 + avail as f64)
    }
}
