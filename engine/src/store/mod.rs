//! Where files live, with no threads of their own: the ticket ledger ([`ledger`]), the roots
//! and their health ([`roots`]), process directories ([`proc`]), task directories and their
//! table ([`dir`]), a segment file with its ticket ([`entry`]), the cleanup worker's queue
//! of name-only records ([`queue`]), and the marks of delete batches in flight ([`marks`]).

pub(crate) mod dir;
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

use crate::io::NameBuf;
use dir::{DirTable, TaskDir};
use ledger::Ledger;
use pool::SegmentPool;
use queue::CleanupQueue;
use roots::Roots;

/// The engine's storage state: what exists on disk and who must delete it.
#[derive(Debug)]
pub(crate) struct Store {
    /// Tickets: files on disk the engine must still delete, and the byte quota.
    pub(crate) ledger: Arc<Ledger>,
    /// Task directories by index (cleanup records name a directory by its index).
    pub(crate) dirs: DirTable,
    pub(crate) roots: Roots,
    /// Name-only records of deletes not confirmed, and orphan sweeps.
    pub(crate) cleanup: Arc<CleanupQueue>,
    /// Released segment files kept for reuse.
    pub(crate) pool: SegmentPool,
    /// Which delete batches are done (a `StorageFull` writer waits for its own).
    pub(crate) delete_marks: marks::DeleteMarks,
    /// Where segments live: the process directory under each root, as a directory entry that
    /// is never closed (so never removed while the engine runs).
    root_dirs: Vec<Arc<TaskDir>>,
}

impl Store {
    /// The store over `roots`: one directory entry per process directory, in which every
    /// segment under that root lives.
    pub(crate) fn new(
        ledger: Arc<Ledger>,
        roots: Roots,
        cleanup: Arc<CleanupQueue>,
        pool: SegmentPool,
    ) -> Self {
        let dirs = DirTable::default();
        let root_dirs = roots
            .proc_dirs()
            .iter()
            .map(|pd| {
                Arc::new(TaskDir {
                    // Names are relative to the process directory itself ("./<segment>"): the
                    // entry is never closed, so it is never removed through its parent.
                    entry: dirs.insert(pd.path.clone(), NameBuf::dot(), pd.clone()),
                    fd: pd.fd.clone(),
                    cleanup: cleanup.clone(),
                })
            })
            .collect();
        Store {
            ledger,
            dirs,
            roots,
            cleanup,
            pool,
            delete_marks: marks::DeleteMarks::default(),
            root_dirs,
        }
    }

    /// Where segments go under root `root`.
    pub(crate) fn root_dir(&self, root: usize) -> crate::error::Result<Arc<TaskDir>> {
        self.root_dirs
            .get(root)
            .cloned()
            .ok_or_else(|| crate::error::SpillError::InvalidConfig {
                field: "roots",
                need: format!("fewer than {} roots", self.root_dirs.len() + 1),
                got: format!("root {root}"),
            })
    }

    /// How much of what spills could hold on root `root` they hold: the engine's bytes there
    /// over those bytes plus the filesystem's available bytes (0 when unknown). `Auto`
    /// compresses as it nears 1 (`spill/writer/codec.rs`).
    pub(crate) fn root_fill(&self, root: usize) -> f64 {
        let Some(dir) = self.root_dirs.get(root) else {
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

    /// Directory entries left besides the roots' own (always zero since segments live flat;
    /// kept for the shutdown report).
    pub(crate) fn dirs_left(&self) -> usize {
        self.dirs.len().saturating_sub(self.root_dirs.len())
    }
}
