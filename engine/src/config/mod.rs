//! Engine configuration: a builder whose every field documents its default and bounds, validated
//! by [`EngineConfig::validate`] (which [`crate::Engine::open`] calls).

mod modes;
mod validate;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

// Named by the builder's doc links only (the validation that returns it is in validate.rs).
#[cfg(doc)]
use crate::error::SpillError;
use crate::fault::FaultPlan;

pub use modes::{Backend, BackendKind, Compression, WriteMode};

/// Smallest accepted segment size.
pub const MIN_SEGMENT_SIZE: u64 = 64 << 10;
/// Largest accepted segment size.
pub const MAX_SEGMENT_SIZE: u64 = 1 << 40;
/// Largest accepted ticket capacity.
pub const MAX_TICKET_CAPACITY: usize = 1 << 24;
/// Alignment of direct-mode buffers and offsets.
pub const DIRECT_ALIGN: usize = 4096;

/// Engine configuration. Build with [`EngineConfig::new`] and the setters; `Engine::open`
/// validates it and returns [`SpillError::InvalidConfig`] naming the bad field.
///
/// ```
/// use std::time::Duration;
/// use spillring::{EngineConfig, SpillError, WriteMode};
/// let cfg = EngineConfig::new("/mnt/disk1/spill")
///     .add_root("/mnt/disk2/spill")
///     .mode(WriteMode::Direct)
///     .max_spill_bytes(64 << 30)
///     .shutdown_budget(Duration::from_secs(2));
/// assert!(cfg.validate().is_ok());
/// // Every bound is checked, and the error names the field.
/// let bad = EngineConfig::new("/tmp/spill").segment_size(1000).validate();
/// assert!(matches!(bad, Err(SpillError::InvalidConfig { field: "segment_size", .. })));
/// ```
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub(crate) roots: Vec<PathBuf>,
    pub(crate) segment_size: u64,
    pub(crate) ticket_capacity: usize,
    pub(crate) max_spill_bytes: Option<u64>,
    pub(crate) mode: WriteMode,
    pub(crate) backend: BackendKind,
    pub(crate) ring_threads: usize,
    pub(crate) ring_entries: u32,
    pub(crate) io_buffer_size: usize,
    pub(crate) queue_depth: usize,
    pub(crate) registered_buffers: usize,
    pub(crate) max_buffer_memory: usize,
    pub(crate) large_record_threshold: usize,
    // Format v2 (issue 11): block codec, encryption.
    pub(crate) compression: Compression,
    pub(crate) encryption: bool,
    pub(crate) preallocate: bool,
    pub(crate) cleanup_retry_delay: Duration,
    pub(crate) orphan_rescan: Duration,
    pub(crate) cleanup_batch: usize,
    pub(crate) pool_max_segments: usize,
    pub(crate) pool_max_bytes: u64,
    pub(crate) read_buffer_max: usize,
    pub(crate) max_read_memory: usize,
    pub(crate) max_open_files: usize,
    pub(crate) root_skip: Duration,
    pub(crate) shutdown_budget: Duration,
    pub(crate) fault_plan: Option<Arc<FaultPlan>>,
    /// Fields the caller set; the others follow the fields they depend on (see `resolved`).
    explicit: Explicit,
}

/// Which of the fields with derived defaults the caller set.
#[derive(Debug, Clone, Copy, Default)]
struct Explicit {
    segment_size: bool,
    io_buffer_size: bool,
    max_read_memory: bool,
}

/// Default segment size (when no smaller quota is given).
const DEFAULT_SEGMENT_SIZE: u64 = 64 << 20;
/// Default staging buffer size (when segments are not smaller).
const DEFAULT_IO_BUFFER_SIZE: usize = 1 << 20;
/// Default engine-wide bound on staging buffer memory (twice the largest `io_buffer_size`).
pub const DEFAULT_MAX_BUFFER_MEMORY: usize = 128 << 20;
/// Largest accepted `max_buffer_memory`.
const MAX_BUFFER_MEMORY: usize = 1 << 40;
/// Default bound on the segment fds the engine holds (open writers', sealed segments' kept fds).
const DEFAULT_MAX_OPEN_FILES: usize = 1024;
/// Largest accepted `max_open_files`.
pub const MAX_OPEN_FILES: usize = 1 << 20;

/// A byte size given as `u64` (every size setter takes one, issue 25), kept as `usize`
/// where it sizes memory: past `usize::MAX` (a 32-bit target) it saturates, and the bounds
/// check refuses it by name.
fn to_usize(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

impl EngineConfig {
    /// A configuration with one spill root and every other field at its default.
    ///
    /// Roots, as `Engine::open` treats them: a missing root is created with its missing
    /// parents (and what it created is removed at shutdown if empty); a root that is not a
    /// directory fails the open ([`SpillError::RootNotADirectory`]); a root that fails with
    /// an OS error (read-only, no permission, a device error) is skipped for the engine's life
    /// if another root works (a warning, and the `roots_unusable` metric).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        EngineConfig {
            roots: vec![root.into()],
            segment_size: DEFAULT_SEGMENT_SIZE,
            ticket_capacity: 65_536,
            max_spill_bytes: None,
            mode: WriteMode::Buffered,
            backend: BackendKind::Auto,
            ring_threads: 1,
            ring_entries: 256,
            io_buffer_size: DEFAULT_IO_BUFFER_SIZE,
            queue_depth: 8,
            registered_buffers: 64,
            max_buffer_memory: DEFAULT_MAX_BUFFER_MEMORY,
            large_record_threshold: 256 << 10,
            compression: Compression::None,
            encryption: false,
            preallocate: false,
            cleanup_retry_delay: Duration::from_secs(1),
            orphan_rescan: Duration::from_secs(60),
            cleanup_batch: 1000,
            pool_max_segments: 256,
            pool_max_bytes: 1 << 30,
            read_buffer_max: 256 << 10,
            max_read_memory: DEFAULT_MAX_BUFFER_MEMORY,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
            root_skip: Duration::from_secs(30),
            shutdown_budget: Duration::from_secs(5),
            fault_plan: None,
            explicit: Explicit::default(),
        }
    }

    /// Adds another spill root (one per disk); a new segment goes to the healthy root with the fewest segments being written (ties in turn).
    /// Default: only the root given to [`EngineConfig::new`]. Bounds: 1..=64 roots, distinct.
    pub fn add_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.roots.push(root.into());
        self
    }

    /// Segment files rotate before a record that would pass this size; a larger record gets a
    /// segment of its own. With 8 MiB or more, a writer opens its next segment ahead of need,
    /// on the engine's offload pool, once the open one is half full (while the ledger and the
    /// quota have room for two more segments): for a while it holds two files and two tickets.
    /// Default 64 MiB, or `max_spill_bytes` (rounded down to 4 KiB) when that is smaller.
    /// Bounds: 64 KiB..=1 TiB, a multiple of 4096.
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self.explicit.segment_size = true;
        self
    }

    /// Most segment files on disk that the engine must still delete (one ticket each). A create
    /// past it fails with [`SpillError::LedgerFull`], or [`SpillError::WriterCannotFit`] when
    /// the writer's own segments hold every ticket (it can never get another: with
    /// `ticket_capacity(1)` a writer never gets a second segment). Pooled segment files hold
    /// tickets too and are deleted first. Default 65,536. Bounds: 1..=16,777,216.
    pub fn ticket_capacity(mut self, tickets: usize) -> Self {
        self.ticket_capacity = tickets;
        self
    }

    /// Most bytes live segments may hold on disk, checked when a segment is reserved. Past it,
    /// [`SpillError::QuotaExceeded`], or [`SpillError::WriterCannotFit`] when the writer's own
    /// segments and the one it asks for pass it. Default: unlimited. Bounds: at least one
    /// segment size (64 KiB with the default segment size, which follows a smaller quota).
    ///
    /// The reservation rule: every open writer's current segment reserves a whole
    /// `segment_size` of quota (whole blocks in direct mode), from its first record until it
    /// is sealed; a sealed segment then holds its written bytes (in direct mode and with
    /// `preallocate`, its allocation until `finish` trims it). So `max_spill_bytes` below
    /// `open writers × segment_size` refuses writers while little is written: with
    /// `max_spill_bytes == segment_size`, a second writer's 100-byte record is refused while
    /// the first is open, and one writer never gets a second segment. Size the quota as at
    /// least `(concurrent writers + 1) × segment_size`, or lower `segment_size`.
    pub fn max_spill_bytes(mut self, bytes: u64) -> Self {
        self.max_spill_bytes = Some(bytes);
        self
    }

    /// Buffered (page cache) or direct (`O_DIRECT`). Default [`WriteMode::Buffered`].
    pub fn mode(mut self, mode: WriteMode) -> Self {
        self.mode = mode;
        self
    }

    /// I/O backend. Default [`BackendKind::Auto`].
    pub fn backend(mut self, backend: BackendKind) -> Self {
        self.backend = backend;
        self
    }

    /// Number of I/O threads (each with its own ring); writers are spread over them.
    /// Default 1. Bounds: 1..=64.
    pub fn ring_threads(mut self, n: usize) -> Self {
        self.ring_threads = n;
        self
    }

    /// Submission queue entries per ring (the completion queue is twice this). Default 256.
    /// Bounds: 8..=32,768, a power of two.
    pub fn ring_entries(mut self, n: u32) -> Self {
        self.ring_entries = n;
        self
    }

    /// Size of one staging buffer: small records are coalesced into buffers of this size, and
    /// each full buffer is one write. Default: the smaller of 1 MiB and the segment size.
    /// Bounds: 4 KiB..=64 MiB, a multiple of 4096, at most the segment size.
    pub fn io_buffer_size(mut self, bytes: u64) -> Self {
        self.io_buffer_size = to_usize(bytes);
        self.explicit.io_buffer_size = true;
        self
    }

    /// Writes one writer may have in flight before `write` blocks (its in-flight budget).
    /// Default 8 (1 MiB x qd 8 is the best fio job on this machine kind). Bounds: 1..=1024.
    pub fn queue_depth(mut self, n: usize) -> Self {
        self.queue_depth = n;
        self
    }

    /// Staging buffers registered with each ring (fixed buffers for `O_DIRECT`). Registration is
    /// best effort: a refusal (e.g. `RLIMIT_MEMLOCK`) just leaves buffers unregistered.
    /// Default 64. Bounds: 0..=16,384.
    pub fn registered_buffers(mut self, n: usize) -> Self {
        self.registered_buffers = n;
        self
    }

    /// Engine-wide bound on the memory of staging buffers (those writers hold, those in flight
    /// and the free ones the engine keeps): buffers are never mapped past it. A writer's buffer
    /// is `io_buffer_size` while the buffers out use at most half of this, and smaller (down
    /// to 4 KiB) as it fills, so many open writers share it with small buffers. When not even
    /// 4 KiB is left, a writer waits for a buffer in flight to come back (an async writer
    /// waits asynchronously); when none is in flight (every buffer is held by an open writer,
    /// e.g. one thread writing round-robin to thousands of writers), the write fails with
    /// [`SpillError::BufferBudgetExhausted`] rather than wait forever. The registered buffers
    /// (`registered_buffers`) are full-size buffers inside this bound. Default 128 MiB:
    /// full-size buffers (1 MiB) for 64 writers, then some 16,000 more writers at 4 KiB.
    /// Bounds: `io_buffer_size..=1 TiB`.
    pub fn max_buffer_memory(mut self, bytes: u64) -> Self {
        self.max_buffer_memory = to_usize(bytes);
        self
    }

    /// In buffered mode, records at least this large go out without a copy (a vectored write of
    /// frame header + payload). Default 256 KiB. Bounds: 1..=`u32::MAX`.
    pub fn large_record_threshold(mut self, bytes: u64) -> Self {
        self.large_record_threshold = to_usize(bytes);
        self
    }

    /// How each block of records (a staging buffer's worth) is compressed. Default
    /// [`Compression::None`]: no CPU spent and every read a view of the file; `Auto`
    /// compresses when space runs short (the quota or the root filling) and otherwise only
    /// where the saved device time pays for the CPU (see [`Compression::Auto`]). A large
    /// record written without a copy is always raw.
    pub fn compression(mut self, c: Compression) -> Self {
        self.compression = c;
        self
    }

    /// Encrypt blocks (AES-256-GCM, `ring`) with a random key made at `Engine::open`, held only
    /// in the engine's memory and never written: segments are readable by that engine alone,
    /// while it lives (`SegmentReader` and other engines refuse them with `Corrupt`). A
    /// published state of an encrypted engine is refused. Blocks are compressed (per
    /// `compression`) before they are encrypted; no record is read zero-copy from the file.
    /// Default false.
    pub fn encryption(mut self, on: bool) -> Self {
        self.encryption = on;
        self
    }

    /// Preallocate each segment (`fallocate`, keeping the file size), so a full disk fails at
    /// rotation rather than mid-record. Costs disk for the unused tail of the last segment.
    /// Default false.
    pub fn preallocate(mut self, on: bool) -> Self {
        self.preallocate = on;
        self
    }

    /// How long the cleanup worker waits after a failed delete before the next attempt (a
    /// jitter of up to 25% is added). Default 1 s. Bounds: 1 ms..=1 h.
    pub fn cleanup_retry_delay(mut self, delay: Duration) -> Self {
        self.cleanup_retry_delay = delay;
        self
    }

    /// How often the cleanup worker looks again for the directories of engines that died (or
    /// were dropped with deletes left) while this engine runs, and claims and sweeps them in
    /// the background, as `open` does once. Without it, an engine that died beside a
    /// long-running one would leave its files until the next `open` on the root. Default 60 s.
    /// Bounds: 1 ms..=24 h.
    pub fn orphan_rescan(mut self, every: Duration) -> Self {
        self.orphan_rescan = every;
        self
    }

    /// Most names the cleanup worker deletes in one batch. Default 1,000. Bounds: 1..=65,536.
    pub fn cleanup_batch(mut self, n: usize) -> Self {
        self.cleanup_batch = n;
        self
    }

    /// Most released segment files the pool keeps for reuse (0 turns the pool off). A pooled
    /// file holds its ticket and counts in the quota; a writer that finds the ledger or quota
    /// full trims the pool before it is refused. Default 256. Bounds: 0..=65,536.
    pub fn pool_max_segments(mut self, n: usize) -> Self {
        self.pool_max_segments = n;
        self
    }

    /// Most bytes the pooled files may hold on disk (0 turns the pool off). Default 1 GiB.
    /// Bounds: any.
    pub fn pool_max_bytes(mut self, bytes: u64) -> Self {
        self.pool_max_bytes = bytes;
        self
    }

    /// Segments written up to this many bytes are read back with one `pread` into a buffer of
    /// their own; larger ones are mapped (records are then zero-copy views of the map). For a
    /// small segment the copy costs less than map + fault + unmap. 0 maps every segment.
    /// Default 256 KiB. Bounds: 0..=64 MiB.
    pub fn read_buffer_max(mut self, bytes: u64) -> Self {
        self.read_buffer_max = to_usize(bytes);
        self
    }

    /// Engine-wide bound on the memory the engine keeps for reading between reads: the
    /// segment maps kept with pooled files for the reader of their next use (their touched
    /// pages count in the process's RSS) and the free read buffers (at most 8 of
    /// `read_buffer_max`); a map past it is unmapped when its records go. What readers hold
    /// while they read (the segment being read, the records the caller holds) is not kept and
    /// not counted. Together with [`EngineConfig::max_buffer_memory`] this bounds what the
    /// engine holds in memory; the process-wide pool that compressed and encrypted blocks
    /// decode into keeps at most 64 MiB more, and nothing once the last engine is dropped.
    /// Default: `max_buffer_memory` (one setting bounds both). Bounds: `0..=1 TiB` (0 keeps
    /// no map).
    pub fn max_read_memory(mut self, bytes: u64) -> Self {
        self.max_read_memory = to_usize(bytes);
        self.explicit.max_read_memory = true;
        self
    }

    /// Most segment fds the engine holds at once, over every backend: open writers' fds, and
    /// the fds sealed segments keep (a finished segment keeps its writer's fd, which its
    /// reader and, once the file is in the segment pool, the next writer use instead of
    /// opening it by name). An idle fd (no write or read in flight) may be closed for another
    /// (least recently used first): a writer reopens its segment by name when it next writes,
    /// a reader opens it by name. When every fd is busy, a writer that needs one waits until a
    /// write completes. When the OS has no descriptor left (EMFILE/ENFILE, e.g. a soft
    /// `RLIMIT_NOFILE` below this bound), the engine closes an idle fd of its own and retries;
    /// with none it can close, the call fails with [`SpillError::TooManyOpenFiles`].
    /// The engine leaves the host headroom: it holds at most half of the process's soft
    /// `RLIMIT_NOFILE` as it is at `Engine::open` (so under `ulimit -n 256` the bound is 128,
    /// whatever this says). Default 1,024. Bounds: 1..=1,048,576.
    pub fn max_open_files(mut self, n: usize) -> Self {
        self.max_open_files = n;
        self
    }

    /// How long a root whose creates failed with EIO/ENOSPC/EROFS is skipped. Default 30 s.
    /// Bounds: 0..=1 h.
    pub fn root_skip(mut self, d: Duration) -> Self {
        self.root_skip = d;
        self
    }

    /// Budget of the shutdown that dropping the engine runs. Default 5 s. Bounds: 0..=1 h.
    pub fn shutdown_budget(mut self, d: Duration) -> Self {
        self.shutdown_budget = d;
        self
    }

    #[cfg(feature = "fault-injection")]
    /// Installs a fault plan: named fault points at the syscall boundary, for tests and loadgen.
    /// Default: none (every fault point is one never-taken branch).
    pub fn fault_plan(mut self, plan: Arc<FaultPlan>) -> Self {
        self.fault_plan = Some(plan);
        self
    }

    /// The configured write mode.
    pub fn write_mode(&self) -> WriteMode {
        self.mode
    }
}
