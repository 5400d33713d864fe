//! A byte stream cut into records: [`SpillWriter::append`] and `impl std::io::Write`.
//!
//! Serialisers that write to an `io::Write` (an Arrow IPC `StreamWriter`, `serde_json`,
//! `bincode`) hand the engine many small slices whose boundaries mean nothing. `append`
//! copies each straight into the open record of the staging buffer's block (one copy, no
//! allocation), so the records are as large as the buffer's room: a full buffer ends its
//! record and is written, and the next bytes open a record in the next buffer. A reader gets
//! the stream back as those records, in order; their concatenation is the stream.

use std::io;
use std::task::Poll;
use std::time::Instant;

use super::stage::Until;
use super::{SpillWriter, Wait, drive};
use crate::config::DIRECT_ALIGN;
use crate::error::{Result, SpillError};
use crate::format::block::{BLOCK_HEADER_LEN, LARGE_PREFIX_LEN};
use crate::format::segment::FRAME_LEN;

impl SpillWriter {
    /// Appends `bytes` to the writer's byte stream: the stream is cut into records where a
    /// staging buffer (or a segment) is full, so its records are about `io_buffer_size` long
    /// whatever the size of each `append`. Any other call on the writer (`write`, `record`,
    /// `finish`, ...) ends the record the stream is filling; the next `append` starts another.
    /// A reader yields the records in order, and their concatenation is what was appended.
    ///
    /// Each slice is copied once, into the staging buffer; nothing is allocated. Blocks like
    /// [`SpillWriter::write`], only while the in-flight budget is full (or at a rotation).
    /// After an error that leaves the writer usable (`LedgerFull`, `QuotaExceeded`,
    /// `TooManyOpenFiles`), the stream holds a prefix of `bytes`: [`SpillWriter::bytes_written`]
    /// says where it ends. `impl std::io::Write for SpillWriter` is this call (its `flush` ends
    /// the open record).
    ///
    /// ```
    /// use std::io::Write;
    /// use spillring::{Engine, EngineConfig};
    /// # fn main() -> spillring::Result<()> {
    /// # let root = std::env::temp_dir().join(format!("spillring-doc-append-{}", std::process::id()));
    /// # let engine = Engine::open(EngineConfig::new(&root))?;
    /// let task = engine.task("t")?;
    /// let mut w = task.writer()?;
    /// for i in 0..1000u32 {
    ///     w.append(&i.to_le_bytes())?; // 4,000 bytes in 1,000 slices
    /// }
    /// write!(w, "and a tail").map_err(spillring::SpillError::from_io)?;
    /// let state = w.finish()?;
    /// assert_eq!(state.records(), 1); // one record: it fit one staging buffer
    /// let mut stream = Vec::new();
    /// for rec in state.reader()? {
    ///     stream.extend_from_slice(&rec?);
    /// }
    /// assert_eq!(stream.len(), 4000 + 10);
    /// # drop((state, task, engine));
    /// # let _ = std::fs::remove_dir(&root);
    /// # Ok(()) }
    /// ```
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        let started = Instant::now();
        self.check_live()?;
        let mut rest = bytes;
        let mut r = Ok(());
        while !rest.is_empty() {
            match drive(|w| self.append_some(rest, w)) {
                Ok(n) => rest = &rest[n..],
                Err(e) => {
                    r = Err(e);
                    break;
                }
            }
        }
        let r = self.conclude(r);
        self.ctx.core.counters.latency.write.record_since(started);
        r
    }

    /// Appends what fits of `data` to the stream's open record (opening one first if there
    /// is none): returns how many bytes went in, at least one. Nothing is placed before a
    /// `Pending`.
    fn append_some(&mut self, data: &[u8], wait: &mut Wait<'_, '_>) -> Poll<Result<usize>> {
        if !self.blocks.stream_record_open() {
            // A segment with room for a block header, a frame and one byte.
            ready_ok!(self.plan((BLOCK_HEADER_LEN + FRAME_LEN + 1) as u64, wait));
            loop {
                ready_ok!(self.staging_with_room(wait));
                let open = self.blocks.block_open();
                let need = FRAME_LEN + 1 + if open { 0 } else { BLOCK_HEADER_LEN };
                if self.blocks.room() >= need {
                    break;
                }
                if !open {
                    // Too little room to open a block after what the buffer holds (the tail
                    // of a large record): the next bytes are a raw block of their own that
                    // continues into the next buffer, as `place_in_block` places a record
                    // there (direct mode writes no partial buffer mid-segment).
                    let n = data.len().min(self.ctx.core.io.pool().buffer_capacity());
                    let need = (LARGE_PREFIX_LEN + n + DIRECT_ALIGN) as u64;
                    ready_ok!(self.plan(need, wait));
                    ready_ok!(self.place_large_slice(&data[..n], wait));
                    self.count_record(n);
                    return Poll::Ready(Ok(n));
                }
                ready_ok!(self.flush_staging(wait, false));
            }
            self.blocks.open_block();
            self.blocks.open_stream_record();
            self.count_record(0);
        }
        if self.offset() + data.len() as u64 > self.ctx.segment_size && self.stage.queued() > 0 {
            // The segment's end by the codec stage's bound: the record ends there only if it
            // is the exact end.
            ready_ok!(self.poll_until(Until::Fits(data.len() as u64), wait));
        }
        let seg_room = self.ctx.segment_size.saturating_sub(self.offset()) as usize;
        let n = self.blocks.push_stream(data, seg_room);
        self.count_bytes(n);
        Poll::Ready(Ok(n))
    }
}

impl SpillError {
    /// The `SpillError` an [`io::Error`] made from one carries (`impl From<SpillError> for
    /// io::Error`, what `SpillWriter`'s `std::io::Write` returns), or the `io::Error` as an
    /// [`SpillError::Io`] when it carries none.
    pub fn from_io(e: io::Error) -> SpillError {
        match e.downcast::<SpillError>() {
            Ok(e) => e,
            Err(e) => SpillError::io("write", "", e),
        }
    }
}

impl SpillError {
    /// The [`io::ErrorKind`] that says what this error is to code that speaks `std::io`:
    /// `StorageFull`, `QuotaExceeded` (the quota, the ticket ledger, `WriterCannotFit`),
    /// `InvalidData` for `Corrupt`, the OS error's own kind for `Io`, `Other` otherwise.
    pub fn io_kind(&self) -> io::ErrorKind {
        match self {
            SpillError::StorageFull { .. } => io::ErrorKind::StorageFull,
            SpillError::QuotaExceeded { .. }
            | SpillError::LedgerFull { .. }
            | SpillError::WriterCannotFit { .. } => io::ErrorKind::QuotaExceeded,
            SpillError::Corrupt { .. } => io::ErrorKind::InvalidData,
            SpillError::Io { source, .. } => source.kind(),
            SpillError::UringUnavailable { .. } => io::ErrorKind::Unsupported,
            _ => io::ErrorKind::Other,
        }
    }
}

impl From<SpillError> for io::Error {
    /// An `io::Error` of kind [`SpillError::io_kind`] that carries the `SpillError`
    /// (`get_ref`, [`SpillError::from_io`]).
    fn from(e: SpillError) -> io::Error {
        io::Error::new(e.io_kind(), e)
    }
}

/// The writer as an [`io::Write`]: `write` is [`SpillWriter::append`] (a short count when a
/// refusal that leaves the writer usable stopped it part way), `flush` ends the stream's open
/// record. Errors carry the [`SpillError`] ([`SpillError::from_io`]).
impl io::Write for SpillWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let before = self.counts.bytes;
        match self.append(buf) {
            Ok(()) => Ok(buf.len()),
            Err(e) => match (self.counts.bytes - before) as usize {
                0 => Err(e.into()),
                n => Ok(n),
            },
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut n = 0;
        for b in bufs {
            match io::Write::write(self, b) {
                Ok(k) if k == b.len() => n += k,
                Ok(k) => return Ok(n + k),
                Err(e) if n == 0 => return Err(e),
                Err(_) => return Ok(n),
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.check_open().map_err(io::Error::from)
    }
}
