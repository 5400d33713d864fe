//! Where files live, with no threads of their own: the ticket ledger ([`ledger`]), the roots
//! and their health ([`roots`]), process directories ([`proc`]), task directories and their
//! table ([`dir`]), a segment file with its ticket ([`entry`]), and the cleanup worker's queue
//! of name-only records ([`queue`]).

pub(crate) mod dir;
pub(crate) mod entry;
pub(crate) mod ledger;
pub(crate) mod proc;
pub(crate) mod queue;
pub(crate) mod roots;

use std::sync::Arc;

use dir::DirTable;
use ledger::Ledger;
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
}
