//! Opening the engine: roots and their locked process directories, the I/O backend, the
//! engine's threads.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Once};

use parking_lot::Mutex;

use crate::config::{BackendKind, EngineConfig, WriteMode};
use crate::error::{Result, SpillError};
use crate::io::{BufferPool, IoHandle, IoSetup, Reaper};
use crate::metrics::Counters;
use crate::shared::EngineShared;
use crate::store::Store;
use crate::store::ledger::Ledger;
use crate::store::marks::DeleteMarks;
use crate::store::pool::SegmentPool;
use crate::store::proc::{self, random_id};
use crate::store::queue::CleanupQueue;
use crate::store::roots::{Roots, probe_direct};

use super::{Engine, EngineInner};

static FALLBACK_LOGGED: Once = Once::new();

impl Engine {
    /// Validates `cfg`, creates and locks this engine's directory under every root, probes
    /// io_uring (falling back to psync under `BackendKind::Auto`), starts the engine's
    /// threads, and claims the directories of dead engines for background deletion.
    ///
    /// Roots: a missing root is created with its missing parents (what was created is removed
    /// at shutdown if it is empty then); a root that is not a directory fails the open with
    /// [`SpillError::RootNotADirectory`], even if other roots work (a configuration error); a
    /// root that fails with an OS error (read-only, no permission, a device error) is skipped
    /// for this engine's life, with a warning through `tracing` and the `roots_unusable`
    /// metric, if another root works; if none works, the open fails with the first root's
    /// error. A failed open leaves nothing behind: no process directory, no created root, and
    /// the directories of dead engines where they were.
    ///
    /// ```no_run
    /// use spillring::{Engine, EngineConfig, WriteMode};
    /// # fn main() -> spillring::Result<()> {
    /// let engine = Engine::open(
    ///     EngineConfig::new("/mnt/disk1/spill")
    ///         .add_root("/mnt/disk2/spill")
    ///         .mode(WriteMode::Direct),
    /// )?;
    /// assert_eq!(engine.process_dirs().len() as u64 + engine.metrics().roots_unusable, 2);
    /// # Ok(()) }
    /// ```
    pub fn open(cfg: EngineConfig) -> Result<Engine> {
        let cfg = cfg.resolved();
        cfg.check()?;
        let key = cfg.encryption.then(crate::shared::make_key).transpose();
        let key = key.map_err(|e| SpillError::io("make encryption key", PathBuf::new(), e))?;
        let thread_err = |e: io::Error| SpillError::io("start thread", PathBuf::new(), e);
        let (reaper, reaper_thread) = Reaper::start().map_err(thread_err)?;
        let cleanup = Arc::new(CleanupQueue::new(cfg.ticket_capacity));
        let (id, roots, unusable) = open_roots(&cfg, &reaper, &cleanup)?;
        // A failure from here on must not leave our directories behind: nothing of a dead
        // engine was moved into them yet (that comes last), so they are empty.
        if cfg.mode == WriteMode::Direct
            && let Err(e) = probe_direct(roots.proc_dirs())
        {
            roots.remove_dirs();
            return Err(e);
        }
        let io = match start_io(&cfg, &reaper) {
            Ok(io) => io,
            Err(e) => {
                roots.remove_dirs();
                // Only a forced `Uring` gets here from io_uring (`Auto` falls back).
                return Err(if cfg.backend == BackendKind::Uring {
                    SpillError::UringUnavailable {
                        errno: e.raw_os_error(),
                        source: e,
                    }
                } else {
                    SpillError::io("start io backend", PathBuf::new(), e)
                });
            }
        };
        let n_roots = roots.paths().len();
        let store = Store {
            ledger: Ledger::with_roots(cfg.ticket_capacity, cfg.max_spill_bytes, n_roots),
            roots,
            cleanup,
            pool: SegmentPool::new(n_roots, cfg.pool_max_segments, cfg.pool_max_bytes),
            delete_marks: DeleteMarks::default(),
        };
        let core = Arc::new(EngineShared::new(cfg, id, io, store, key));
        Counters::add(&core.counters.roots_unusable, unusable);
        let worker_core = core.clone();
        let cleanup_thread = std::thread::Builder::new()
            .name("spillring-cleanup".into())
            .spawn(move || crate::cleanup::worker_loop(worker_core));
        let cleanup_thread = match cleanup_thread {
            Ok(t) => t,
            Err(e) => {
                core.io.shutdown();
                core.store.roots.remove_dirs();
                return Err(thread_err(e));
            }
        };
        // The open can no longer fail: now claim the directories of dead engines.
        crate::cleanup::sweep::claim_dead_engines(&core);
        crate::io::DECODE_POOL.engine_opened();
        Ok(Engine {
            inner: Arc::new(EngineInner {
                core,
                task_seq: AtomicU64::new(0),
                tasks: Mutex::new(Vec::new()),
                cleanup_thread: Mutex::new(Some(cleanup_thread)),
                reaper_thread,
                last_report: Mutex::new(None),
            }),
        })
    }
}

/// Makes each root a directory (creating a missing one) and creates and locks this engine's
/// directory under it: the engine's id, its roots, and how many roots it skipped. A root that
/// is not a directory fails the open; one that fails with an OS error is skipped (warned,
/// counted) if another works, else the first root's error is returned. On a failure, removes
/// everything it made.
fn open_roots(
    cfg: &EngineConfig,
    reaper: &Reaper,
    cleanup: &Arc<CleanupQueue>,
) -> Result<(u64, Roots, u64)> {
    let mut id = random_id();
    let (mut paths, mut proc_dirs, mut created) = (Vec::new(), Vec::new(), Vec::new());
    let mut first_err = None;
    let mut skipped = Vec::new();
    for root in &cfg.roots {
        let made = proc::prepare_root(root).and_then(|made| {
            match proc::make_own(root, paths.len(), &mut id, reaper, cleanup) {
                Ok(pd) => Ok((pd, made)),
                Err(e) => {
                    proc::remove_created(made.iter());
                    Err(e)
                }
            }
        });
        match made {
            Ok((pd, made)) => {
                paths.push(root.clone());
                proc_dirs.push(pd);
                created.push(made);
            }
            Err(e @ SpillError::RootNotADirectory { .. }) => {
                Roots::new(paths, proc_dirs, created, cfg.root_skip).remove_dirs();
                return Err(e);
            }
            Err(e) => {
                skipped.push((root.clone(), e.to_string()));
                first_err.get_or_insert(e);
            }
        }
    }
    if proc_dirs.is_empty() {
        // No root works: the open fails with the first root's error, and nothing is skipped.
        return Err(first_err.unwrap_or_else(|| SpillError::InvalidConfig {
            field: "roots",
            need: "1..=64".into(),
            got: "0".into(),
        }));
    }
    for (root, error) in &skipped {
        tracing::warn!(root = %root.display(), error = %error,
            "spill root unusable at open; this engine skips it");
    }
    let roots = Roots::new(paths, proc_dirs, created, cfg.root_skip);
    Ok((id, roots, skipped.len() as u64))
}

/// Starts the configured backend (io_uring, falling back to psync under `Auto`).
fn start_io(cfg: &EngineConfig, reaper: &Reaper) -> io::Result<IoHandle> {
    let want_uring = cfg.backend != BackendKind::Psync;
    let pool = BufferPool::with_faults(
        cfg.io_buffer_size,
        if want_uring {
            cfg.registered_buffers
        } else {
            0
        },
        64,
        cfg.max_buffer_memory,
        cfg.fault_plan.clone(),
    );
    let setup = IoSetup {
        threads: cfg.ring_threads,
        ring_entries: cfg.ring_entries,
        channel_capacity: (cfg.ring_entries as usize * 4).max(1024),
        pool,
        fault: cfg.fault_plan.clone(),
        deadline: Arc::default(),
        reaper: reaper.clone(),
        // Leaves the host half of the soft fd limit (read once, here).
        max_open_files: crate::sys::fd_bound(cfg.max_open_files, crate::sys::nofile_soft()),
        page_cache_writes: cfg.mode == crate::config::WriteMode::Buffered,
        // `max_read_memory` less what the free read buffers may hold.
        max_kept_map_bytes: cfg
            .max_read_memory
            .saturating_sub(crate::io::ReadBufs::RETAIN * cfg.read_buffer_max)
            as u64,
    };
    match cfg.backend {
        BackendKind::Psync => IoHandle::start_psync(&setup),
        BackendKind::Uring => IoHandle::start_uring(&setup),
        BackendKind::Auto => IoHandle::start_uring(&setup).or_else(|e| {
            FALLBACK_LOGGED.call_once(|| {
                tracing::warn!(error = %e, "io_uring unavailable; spillring falls back to psync");
            });
            IoHandle::start_psync(&setup)
        }),
    }
}
