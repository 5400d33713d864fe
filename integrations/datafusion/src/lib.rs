//! DataFusion's spill files through spillring.
//!
//! DataFusion 55 lets the host replace every spill file ([`TempFileFactory`]). With
//! [`SpillringFactory`] a sort, an aggregate, a join or a repartition that runs out of memory
//! spills into a spillring [`Engine`]: compressed if the engine compresses (`Compression`),
//! encrypted if it encrypts, under its disk cap (`max_spill_bytes`, refused as
//! [`DataFusionError::ResourcesExhausted`]), in files that are deleted exactly once when the
//! last `Arc` of the spill file drops (a cancelled query's too), and swept by the next
//! `Engine::open` on the same root after a killed process.
//!
//! ```no_run
//! use std::sync::Arc;
//! use datafusion::execution::disk_manager::DiskManagerBuilder;
//! use datafusion::execution::runtime_env::RuntimeEnvBuilder;
//! use spillring::{Compression, Engine};
//! use spillring_datafusion::SpillringFactory;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::open(SpillringFactory::config("/mnt/spill").compression(Compression::Auto))?;
//! let disk = DiskManagerBuilder::default()
//!     .with_temp_file_factory(Arc::new(SpillringFactory::new(engine)));
//! let runtime = RuntimeEnvBuilder::new().with_disk_manager_builder(disk).build_arc()?;
//! # Ok(()) }
//! ```
//!
//! # How a spill file maps onto the engine
//!
//! A [`SpillringFile`] is a task scope of its own (`Engine::task`, named by DataFusion's
//! description of the spill) holding a list of chunks, each a finished spillring writer's
//! [`SpilledState`]. Its writer ([`SpillFile::open_writer`]) takes DataFusion's Arrow IPC
//! writes (many small slices) with [`spillring::SpillWriter::append`]: each slice is copied once
//! into the engine's staging buffer, and the stream is cut into records of about
//! `io_buffer_size`. A `flush` (DataFusion flushes after each batch of a repartition's spill
//! pool, whose reader reads the file while it is written, and once at the end) finishes the
//! engine writer into the next chunk, so the bytes written so far are readable; the next write
//! opens another. [`SpillFile::read_stream`] yields the chunks' records in order, each a
//! [`Bytes`] into the engine's read buffer or mapping (no copy), read with
//! `next_record_async` (opens, reads and maps run on the engine's threads, not the runtime's),
//! and sees the chunks finished up to the moment it reaches the end, like a reader of a plain
//! file sees its bytes up to EOF.
//!
//! The contract of DataFusion's default file, which this one keeps: `open_writer` may be called
//! again (the new writer's bytes follow the old one's, as with the default's shared file
//! offset), `read_stream` may be called again (each stream reads the file from its start), and
//! [`SpillFile::size`] is the bytes written so far (the stream's length; with compression the
//! files on disk are smaller: see `Engine::metrics`). A write that fails part way, or a writer
//! dropped with bytes it never flushed, leaves a hole in the stream: from then on reading the
//! file is an error, never a stream with bytes missing.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use datafusion_common::{DataFusionError, Result};
use datafusion_execution::spill_file::{SpillFile, SpillWriter, TempFileFactory};
use futures::Stream;
use spillring::{Engine, SpillError, SpillReader, SpilledState, TaskSpill};

/// The segment size of [`SpillringFactory::config`]: 4 MiB.
pub const SEGMENT_SIZE: u64 = 4 << 20;

/// The [`TempFileFactory`] that makes DataFusion's spill files spillring spills. Pass it to
/// `DiskManagerBuilder::with_temp_file_factory` (see the crate docs).
#[derive(Debug, Clone)]
pub struct SpillringFactory {
    engine: Engine,
    counts: Arc<Counts>,
}

/// What a [`SpillringFactory`] made so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FactoryStats {
    /// Spill files created (`create_temp_file`).
    pub files: u64,
    /// Writers opened on them (`open_writer`): DataFusion's `spill_file_count` counts these.
    pub writers: u64,
}

#[derive(Debug, Default)]
struct Counts {
    files: AtomicU64,
    writers: AtomicU64,
}

impl SpillringFactory {
    /// The engine configuration this crate suggests for DataFusion's spills under `root`: the
    /// engine's defaults but segments of [`SEGMENT_SIZE`] (4 MiB, not 64). A merge reads its
    /// spill files all at once, and each reader maps the segment it reads and the next one
    /// ahead, so a merge of k files keeps about 2k segments mapped: their pages count in the
    /// process's RSS (as page cache, file-backed). With 64 MiB segments an ORDER BY of 256 MiB
    /// peaked 240 MiB of RSS above DataFusion's own temp files; with 4 MiB, 30-80 MiB (the
    /// bench, `results/DATAFUSION.md`). Smaller segments also reserve less of a quota while
    /// open. Set anything else on the returned config as usual.
    pub fn config(root: impl AsRef<std::path::Path>) -> spillring::EngineConfig {
        spillring::EngineConfig::new(root.as_ref()).segment_size(SEGMENT_SIZE)
    }

    /// A factory whose spill files live in `engine` (its roots, mode, codec, cap).
    pub fn new(engine: Engine) -> Self {
        SpillringFactory {
            engine,
            counts: Arc::default(),
        }
    }

    /// The engine the spill files live in (its metrics, `list_files`, `settle`).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The spill files and writers this factory made so far.
    pub fn stats(&self) -> FactoryStats {
        FactoryStats {
            files: self.counts.files.load(Ordering::Relaxed),
            writers: self.counts.writers.load(Ordering::Relaxed),
        }
    }
}

impl SpillringFactory {
    /// [`TempFileFactory::create_temp_file`] as the concrete type (for
    /// [`SpillringFile::stored_bytes`]).
    pub fn create_file(&self, description: &str) -> Result<Arc<SpillringFile>> {
        let task = self.engine.task(description).map_err(to_datafusion)?;
        self.counts.files.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(SpillringFile {
            inner: Arc::new(FileInner {
                task,
                counts: self.counts.clone(),
                chunks: Mutex::new(Vec::new()),
                size: AtomicU64::new(0),
                broken: OnceLock::new(),
            }),
        }))
    }
}

impl TempFileFactory for SpillringFactory {
    fn create_temp_file(&self, description: &str) -> Result<Arc<dyn SpillFile>> {
        Ok(self.create_file(description)?)
    }
}

/// One DataFusion spill file in a spillring engine (see the crate docs). Its files go when the
/// last `Arc` of it, and the last stream reading it, are dropped.
pub struct SpillringFile {
    inner: Arc<FileInner>,
}

struct FileInner {
    /// The file's own scope: closing it (the last handle drops with the file) deletes whatever
    /// is still registered, a chunk or a writer that never finished.
    task: TaskSpill,
    /// The finished chunks, in order.
    chunks: Mutex<Vec<SpilledState>>,
    /// Bytes of the stream written so far (finished chunks and writers still open).
    size: AtomicU64,
    /// Why the stream has a hole, once it has one.
    broken: OnceLock<String>,
    counts: Arc<Counts>,
}

impl FileInner {
    fn chunk(&self, i: usize) -> Option<SpilledState> {
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(i)
            .cloned()
    }

    fn push(&self, state: SpilledState) {
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(state);
    }

    fn break_with(&self, why: String) {
        let _ = self.broken.set(why);
    }

    fn check_whole(&self) -> Result<()> {
        match self.broken.get() {
            Some(why) => Err(DataFusionError::Execution(format!(
                "spillring spill file {:?} cannot be read: {why}",
                self.task.id()
            ))),
            None => Ok(()),
        }
    }
}

impl fmt::Debug for SpillringFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillringFile")
            .field("task", &self.inner.task.id())
            .field("size", &self.inner.size.load(Ordering::Relaxed))
            .finish()
    }
}

impl SpillringFile {
    /// Bytes of the engine's segment files this spill file holds now (its finished chunks;
    /// compressed bytes when the engine compresses), next to [`SpillFile::size`], the stream's
    /// length.
    pub fn stored_bytes(&self) -> u64 {
        let chunks = self.inner.chunks.lock().unwrap_or_else(|p| p.into_inner());
        chunks.iter().map(SpilledState::bytes).sum()
    }
}

impl SpillFile for SpillringFile {
    fn size(&self) -> Option<u64> {
        Some(self.inner.size.load(Ordering::Relaxed))
    }

    fn read_stream(&self) -> Result<Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>> {
        self.inner.check_whole()?;
        let start = ReadState {
            file: self.inner.clone(),
            next: 0,
            reader: None,
        };
        Ok(Box::pin(futures::stream::try_unfold(start, read_next)))
    }

    fn open_writer(&self) -> Result<Box<dyn SpillWriter>> {
        if self.inner.task.is_cancelled() {
            return Err(to_datafusion(SpillError::Aborted));
        }
        self.inner.counts.writers.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(SpillringFileWriter {
            file: self.inner.clone(),
            writer: None,
        }))
    }
}

/// Where a stream of [`SpillFile::read_stream`] is: the next chunk, and the reader of the
/// current one.
struct ReadState {
    file: Arc<FileInner>,
    next: usize,
    reader: Option<SpillReader>,
}

async fn read_next(mut st: ReadState) -> Result<Option<(Bytes, ReadState)>> {
    loop {
        if let Some(r) = st.reader.as_mut() {
            if let Some(rec) = r.next_record_async().await.map_err(to_datafusion)? {
                return Ok(Some((rec, st)));
            }
            st.reader = None;
        }
        let Some(state) = st.file.chunk(st.next) else {
            st.file.check_whole()?;
            return Ok(None);
        };
        st.next += 1;
        st.reader = Some(state.into_reader().map_err(to_datafusion)?);
    }
}

/// The writer of a [`SpillringFile`]: `std::io::Write` into the engine's staging buffers (see
/// the crate docs); `flush` and `finish` make what was written readable.
pub struct SpillringFileWriter {
    file: Arc<FileInner>,
    /// The engine writer of the chunk being written; opened by the first write after a flush.
    writer: Option<spillring::SpillWriter>,
}

impl fmt::Debug for SpillringFileWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillringFileWriter")
            .field("task", &self.file.task.id())
            .field("open", &self.writer.is_some())
            .finish()
    }
}

impl SpillringFileWriter {
    /// Finishes the open chunk, if any, and appends it to the file.
    fn cut(&mut self) -> std::result::Result<(), SpillError> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        match w.finish() {
            Ok(state) => {
                self.file.push(state);
                Ok(())
            }
            Err(e) => {
                self.file
                    .break_with(format!("a chunk failed to finish: {e}"));
                Err(e)
            }
        }
    }

    /// The error a failed write returns to the IPC writer: the stream now has a hole.
    fn failed(&self, e: SpillError) -> io::Error {
        self.file.break_with(format!("a write failed: {e}"));
        to_io(e)
    }
}

impl io::Write for SpillringFileWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let w = match self.writer.as_mut() {
            Some(w) => w,
            None => match self.file.task.writer() {
                Ok(w) => self.writer.insert(w),
                Err(e) => return Err(self.failed(e)),
            },
        };
        let before = w.bytes_written();
        let r = w.append(buf);
        let n = (w.bytes_written() - before) as usize;
        self.file.size.fetch_add(n as u64, Ordering::Relaxed);
        match r {
            Ok(()) => Ok(n),
            // A refusal part way (the quota, at a rotation): a short write; the next one
            // returns the refusal.
            Err(_) if n > 0 => Ok(n),
            Err(e) => Err(self.failed(e)),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.cut().map_err(to_io)
    }
}

impl SpillWriter for SpillringFileWriter {
    fn finish(&mut self) -> Result<()> {
        self.cut().map_err(to_datafusion)
    }
}

impl Drop for SpillringFileWriter {
    fn drop(&mut self) {
        if let Some(w) = self.writer.take()
            && w.bytes_written() > 0
        {
            // Its bytes are deleted with it (the engine writer's drop): the stream lacks them.
            self.file.break_with(format!(
                "its writer was dropped with {} bytes it never flushed",
                w.bytes_written()
            ));
        }
    }
}

/// The DataFusion error for an engine error: the refusals of a bound (the quota, the ticket
/// ledger, a full disk, the buffer budget, the fd limit) are `ResourcesExhausted` with the
/// engine's message; anything else is `External`, the `SpillError` inside.
pub fn to_datafusion(e: SpillError) -> DataFusionError {
    match e {
        SpillError::QuotaExceeded { .. }
        | SpillError::LedgerFull { .. }
        | SpillError::WriterCannotFit { .. }
        | SpillError::StorageFull { .. }
        | SpillError::BufferBudgetExhausted { .. }
        | SpillError::TooManyOpenFiles { .. } => {
            DataFusionError::ResourcesExhausted(format!("spillring: {e}"))
        }
        e => DataFusionError::External(Box::new(e)),
    }
}

/// The `io::Error` a write returns to DataFusion's IPC writer, which wraps it (Arrow's
/// `IoError`, in DataFusion's `ArrowError`): its source is the DataFusion error, so
/// `DataFusionError::find_root` on what the query returns is `ResourcesExhausted` for a
/// refusal, and its kind is the engine's (`QuotaExceeded`, `StorageFull`, ...).
fn to_io(e: SpillError) -> io::Error {
    io::Error::new(e.io_kind(), SpillFailed(to_datafusion(e)))
}

/// The payload of [`to_io`]'s error: shows the DataFusion error and is sourced by it.
#[derive(Debug)]
struct SpillFailed(DataFusionError);

impl fmt::Display for SpillFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SpillFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}
