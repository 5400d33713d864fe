//! The kinds a configuration chooses between: the write mode, the backend, the compression.

/// How blocks of records are compressed (format v3, `format/block.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Every block stored raw; reads are views of the file (the default: no CPU spent, and
    /// reads stay zero-copy).
    #[default]
    None,
    /// LZ4 (block format, `lz4_flex`): fast, a modest ratio.
    Lz4,
    /// Zstandard at `level` (1..=22; negative levels are faster): a better ratio, more CPU.
    Zstd {
        /// The zstd level.
        level: i32,
    },
    /// Per block, from a 64 KiB sample, weighing space and time:
    ///
    /// - **Space short** (a bound an eighth full or more: bytes held over `max_spill_bytes`,
    ///   or the engine's bytes on the segment's root over those plus the filesystem's free
    ///   bytes): the smallest of lz4 and zstd level 1 (also level 3 from half full), a stronger
    ///   codec only where it saves 10% (5% for level 3) more than the cheaper one.
    /// - **Room to spare**: the codec that makes the writer fastest, from its measured costs.
    ///   Blocks are compressed on the engine's codec threads while the writer fills the next
    ///   one, so a block takes the longest of three stages: the producer's time, the codec's
    ///   (one thread's, as measured over the last blocks) and the device's for the bytes out.
    ///   The device counts only once the writer has waited for it, so a writer the device
    ///   never holds back stays raw; its cost is the wall time per byte the device completed
    ///   while the writer waited. zstd needs 10% more gain than lz4.
    ///
    /// A choice is kept for 8 blocks. When no codec pays, trials back off exponentially: to
    /// 32 blocks on data a codec shrinks by a tenth (the device's cost changes), to 256 on
    /// data none does. A rise in space pressure ends a back-off, and so does the writer
    /// waiting for its device again after a back-off taken while it did not.
    Auto,
}

/// Where segment bytes go through the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteMode {
    /// Through the page cache. Works on every filesystem.
    Buffered,
    /// `O_DIRECT` from aligned (and, on io_uring, registered) buffers: far less CPU per GiB and no
    /// page-cache pollution of the host. The root's filesystem must support `O_DIRECT`.
    Direct,
}

/// Which I/O backend moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// io_uring if it can be set up, else psync (logged once; metrics say which runs).
    Auto,
    /// io_uring, or fail `Engine::open` if it cannot be set up.
    Uring,
    /// Plain `pwrite`/`unlinkat` on the engine's I/O thread(s).
    Psync,
}

impl WriteMode {
    /// "buffered" or "direct" (as in metrics and reports).
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::Buffered => "buffered",
            WriteMode::Direct => "direct",
        }
    }
}

impl BackendKind {
    /// "auto", "uring" or "psync" (as in configuration and command lines).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Auto => "auto",
            BackendKind::Uring => "uring",
            BackendKind::Psync => "psync",
        }
    }
}

/// The I/O backend an engine runs (what [`BackendKind::Auto`] resolved to).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Backend {
    /// io_uring ring threads.
    #[serde(rename = "io_uring")]
    IoUring,
    /// Plain syscalls on the engine's I/O threads.
    #[serde(rename = "psync")]
    Psync,
}

impl Backend {
    /// "io_uring" or "psync" (as in metrics and reports).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::IoUring => "io_uring",
            Backend::Psync => "psync",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for WriteMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
