//! Spill Arrow [`RecordBatch`]es through [spillring]: each batch is encoded with
//! `arrow-ipc` into the engine's staging buffer and read back with its column buffers pointing
//! into the engine's record `Bytes` (no copy of a buffer body).
//!
//! The three stages of a spill, as with the engine itself:
//!
//! ```no_run
//! use std::sync::Arc;
//! use arrow_array::{Int64Array, RecordBatch};
//! use arrow_schema::{DataType, Field, Schema};
//! use spillring::{Engine, EngineConfig};
//! use spillring_arrow::ArrowSpillWriter;
//!
//! # fn main() -> Result<(), spillring_arrow::ArrowSpillError> {
//! let engine = Engine::open(EngineConfig::new("/var/tmp/spill"))?;
//! let task = engine.task("sort-7")?;
//! let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
//!
//! // Stage 1: write the batches a task cannot keep in memory.
//! let mut w = ArrowSpillWriter::new(&task, schema.clone())?;
//! let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![3, 1, 2]))])?;
//! w.write(&batch)?;
//! let spill = w.finish()?;
//!
//! // Stage 2: hand `spill` on (Send + Sync; a clone is another grant on the same files).
//! let for_later = spill.clone();
//!
//! // Stage 3: read it back, zero-copy.
//! for b in spill.reader()? {
//!     let b = b?;
//!     assert_eq!(b.num_rows(), 3);
//! }
//! drop((spill, for_later)); // the last grant: the files are released
//! task.close();
//! # Ok(()) }
//! ```
//!
//! # Record layout and alignment
//!
//! One batch is one engine record: a 56-byte prefix (magic, stream length), then the IPC
//! stream messages of the batch (the schema message before the first batch, dictionary
//! batches when a dictionary is new or changed, then the record batch), then zero padding.
//! Every IPC message is padded to 64 bytes by the encoder; the payload is padded so that a
//! framed record (the engine's 8-byte frame header plus the payload) is a multiple of 64
//! bytes. Since a segment's header is 64 bytes and records follow each other with no gap,
//! every batch's IPC stream starts at a file offset that is a multiple of 64, and so does
//! every buffer in it. A mapped segment is page aligned, so the buffers are 64-byte aligned in
//! memory; a segment read with one `pread` sits in a heap buffer the allocator aligns to at
//! least 16 bytes, the largest alignment any Arrow type needs in Rust. The reader checks the
//! alignment of every record before decoding: a record that is not aligned enough is copied
//! once into an aligned buffer, and [`ReadStats::realigned_records`] counts it (it stays at
//! zero with the engine's layout; the tests assert so). The decoder then runs with
//! `require_alignment(true)`, so it never copies a buffer behind the caller's back.
//!
//! # Compression
//!
//! Batches are written uncompressed: the engine owns compression (the format-v2 issue); this
//! crate does not compress a second time.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::writer::StreamEncoder;
use arrow_ipc::{Block, MessageHeader, MetadataVersion};
use arrow_schema::{ArrowError, SchemaRef};
use spillring::{Bytes, SpillError, SpillReader, SpillWriter, SpilledState, TaskSpill};

/// Bytes before a batch's IPC stream in its record.
pub const PREFIX_LEN: usize = 56;
/// The alignment of a batch's IPC stream (and of every buffer in it) within a segment file.
pub const STREAM_ALIGN: usize = 64;
/// The alignment a record must have in memory to be decoded in place: the largest alignment an
/// Arrow native type has in Rust (`i128`, `i256`).
pub const MIN_MEMORY_ALIGN: usize = 16;

const MAGIC: &[u8; 8] = b"SRARROW1";
const CONTINUATION: [u8; 4] = [0xff; 4];

/// What can go wrong spilling or reading Arrow batches.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArrowSpillError {
    /// A batch written does not have the spill's schema (or a spill's stream names another
    /// schema). Nothing was written: the writer is still usable.
    #[error("schema mismatch: {detail}")]
    SchemaMismatch {
        /// The spill's schema.
        expected: SchemaRef,
        /// The batch's schema.
        found: SchemaRef,
        /// The first difference, in words.
        detail: String,
    },
    /// arrow-ipc could not encode or decode a batch.
    #[error("arrow IPC: {0}")]
    Ipc(#[from] ArrowError),
    /// The engine failed (see [`SpillError`]: `Aborted` after a cancel, `Corrupt` for a damaged
    /// segment, `LedgerFull`, ...).
    #[error(transparent)]
    Engine(#[from] SpillError),
    /// A record of the spill is not a batch this crate wrote (bad magic, a length past its
    /// end, a message cut short). The engine's CRC passed, so it was written like this.
    #[error("malformed spill record {record}: {detail}")]
    Malformed {
        /// Index of the record in the spill.
        record: u64,
        /// What is wrong.
        detail: &'static str,
    },
    /// The writer failed earlier (that error was returned then); it takes no further batches.
    #[error("arrow spill writer already failed")]
    WriterFailed,
}

impl ArrowSpillError {
    /// True when the task scope was cancelled: the spill's files are gone, not a fault.
    pub fn is_aborted(&self) -> bool {
        matches!(self, ArrowSpillError::Engine(e) if e.is_aborted())
    }

    /// True when the engine found a damaged segment.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, ArrowSpillError::Engine(SpillError::Corrupt { .. }))
    }
}

/// Result alias of this crate.
pub type Result<T, E = ArrowSpillError> = std::result::Result<T, E>;

/// Engine errors after which the engine's writer is still usable and the same call may be
/// retried: the record was not written.
fn engine_error_keeps_writer(e: &SpillError) -> bool {
    matches!(
        e,
        SpillError::LedgerFull { .. }
            | SpillError::QuotaExceeded { .. }
            | SpillError::RecordTooLarge { .. }
            | SpillError::TooManyOpenFiles { .. }
    )
}

/// The first difference between the spill's schema and a batch's, or `None` if they agree.
fn schema_difference(expected: &SchemaRef, found: &SchemaRef) -> Option<String> {
    if Arc::ptr_eq(expected, found) {
        return None;
    }
    let (e, f) = (expected.fields(), found.fields());
    if e.len() != f.len() {
        return Some(format!(
            "the spill has {} columns, the batch {}",
            e.len(),
            f.len()
        ));
    }
    for (i, (a, b)) in e.iter().zip(f.iter()).enumerate() {
        if a.name() != b.name() {
            return Some(format!(
                "column {i} is {:?} in the spill, {:?} in the batch",
                a.name(),
                b.name()
            ));
        }
        if a.data_type() != b.data_type() {
            return Some(format!(
                "column {i} ({:?}) is {} in the spill, {} in the batch",
                a.name(),
                a.data_type(),
                b.data_type()
            ));
        }
        if a.is_nullable() != b.is_nullable() {
            return Some(format!(
                "column {i} ({:?}) is {} in the spill, {} in the batch",
                a.name(),
                nullable(a.is_nullable()),
                nullable(b.is_nullable())
            ));
        }
        if a != b {
            return Some(format!(
                "column {i} ({:?}) differs in its metadata",
                a.name()
            ));
        }
    }
    None
}

fn nullable(n: bool) -> &'static str {
    if n { "nullable" } else { "not nullable" }
}

/// Writes Arrow batches of one schema into a spill of a task scope. Made by
/// [`ArrowSpillWriter::new`]; [`ArrowSpillWriter::finish`] hands the files over as an
/// [`ArrowSpill`]. Dropping it unfinished deletes what it wrote (the engine's writer does).
pub struct ArrowSpillWriter {
    writer: Option<SpillWriter>,
    schema: SchemaRef,
    encoder: StreamEncoder,
    batches: u64,
    rows: u64,
    ipc_bytes: u64,
}

impl fmt::Debug for ArrowSpillWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrowSpillWriter")
            .field("batches", &self.batches)
            .field("rows", &self.rows)
            .field("failed", &self.writer.is_none())
            .finish()
    }
}

impl ArrowSpillWriter {
    /// A writer of batches of `schema` into a new spill of `task`.
    pub fn new(task: &TaskSpill, schema: SchemaRef) -> Result<Self> {
        let encoder = StreamEncoder::try_new(&schema)?;
        let writer = task.writer()?;
        Ok(ArrowSpillWriter {
            writer: Some(writer),
            schema,
            encoder,
            batches: 0,
            rows: 0,
            ipc_bytes: 0,
        })
    }

    /// The schema every batch must have.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Batches written so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Encodes `batch` into the engine's staging buffer and queues it (write-behind: this
    /// returns once the bytes are copied; it blocks only while the engine's in-flight budget
    /// is full).
    ///
    /// A batch of another schema is refused with [`ArrowSpillError::SchemaMismatch`] and
    /// nothing is written. An engine error that leaves the engine's writer usable
    /// (`LedgerFull`, `QuotaExceeded`, `TooManyOpenFiles`, `RecordTooLarge`) leaves this writer
    /// usable too: the batch was not written and the call can be retried. Any other error
    /// fails the writer (the engine deleted its files) and later calls return
    /// [`ArrowSpillError::WriterFailed`].
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let found = batch.schema();
        if let Some(detail) = schema_difference(&self.schema, &found) {
            return Err(ArrowSpillError::SchemaMismatch {
                expected: self.schema.clone(),
                found,
                detail,
            });
        }
        if self.writer.is_none() {
            return Err(ArrowSpillError::WriterFailed);
        }
        let buffers = match self.encoder.encode(batch) {
            Ok(b) => b,
            Err(e) => {
                // The encoder's dictionary state may have moved past what was written.
                self.writer = None;
                return Err(e.into());
            }
        };
        let stream_len: usize = buffers.iter().map(|b| b.len()).sum();
        let payload = padded_payload_len(stream_len);
        let Some(w) = self.writer.as_mut() else {
            return Err(ArrowSpillError::WriterFailed);
        };
        match put_record(w, &buffers, stream_len, payload) {
            Ok(()) => {
                self.batches += 1;
                self.rows += batch.num_rows() as u64;
                self.ipc_bytes += stream_len as u64;
                Ok(())
            }
            Err(e) if engine_error_keeps_writer(&e) => {
                // Nothing of this batch was written, but the encoder counted its schema and
                // dictionaries as sent: a fresh encoder sends them again with the next batch
                // (a dictionary sent again replaces the same id, the schema message is checked
                // and skipped by the reader).
                match StreamEncoder::try_new(&self.schema) {
                    Ok(enc) => self.encoder = enc,
                    Err(_) => self.writer = None,
                }
                Err(e.into())
            }
            Err(e) => {
                self.writer = None;
                Err(e.into())
            }
        }
    }

    /// Waits for the writes in flight and hands the files over as an [`ArrowSpill`].
    pub fn finish(mut self) -> Result<ArrowSpill> {
        let Some(w) = self.writer.take() else {
            return Err(ArrowSpillError::WriterFailed);
        };
        let state = w.finish()?;
        Ok(ArrowSpill {
            inner: Arc::new(SpillInfo {
                schema: self.schema.clone(),
                batches: self.batches,
                rows: self.rows,
                ipc_bytes: self.ipc_bytes,
            }),
            state,
        })
    }
}

/// The payload length of a record holding `stream_len` bytes of IPC stream: the prefix, the
/// stream, and zeros up to where the framed record ends on a multiple of [`STREAM_ALIGN`].
fn padded_payload_len(stream_len: usize) -> usize {
    let frame = spillring::segment::FRAME_LEN;
    let raw = frame + PREFIX_LEN + stream_len;
    raw.next_multiple_of(STREAM_ALIGN) - frame
}

/// Fills one record in place in the engine's staging buffer.
fn put_record(
    w: &mut SpillWriter,
    buffers: &[Buffer],
    stream_len: usize,
    payload: usize,
) -> Result<(), SpillError> {
    let mut slot = w.record(payload)?;
    let out: &mut [u8] = &mut slot;
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&(stream_len as u64).to_le_bytes());
    out[16..PREFIX_LEN].fill(0);
    let mut at = PREFIX_LEN;
    for b in buffers {
        out[at..at + b.len()].copy_from_slice(b.as_slice());
        at += b.len();
    }
    out[at..].fill(0);
    slot.commit()
}

#[derive(Debug)]
struct SpillInfo {
    schema: SchemaRef,
    batches: u64,
    rows: u64,
    ipc_bytes: u64,
}

/// Spilled Arrow batches: a [`SpilledState`] and its schema. `Send + Sync`; a clone is another
/// grant on the same files (the files go with the last one, or with the task scope's close).
#[derive(Debug, Clone)]
pub struct ArrowSpill {
    inner: Arc<SpillInfo>,
    state: SpilledState,
}

impl ArrowSpill {
    /// The batches' schema.
    pub fn schema(&self) -> &SchemaRef {
        &self.inner.schema
    }

    /// Batches in the spill.
    pub fn num_batches(&self) -> u64 {
        self.inner.batches
    }

    /// Rows in the spill.
    pub fn num_rows(&self) -> u64 {
        self.inner.rows
    }

    /// Bytes of IPC stream written (without this crate's prefix and padding or the engine's
    /// frames).
    pub fn ipc_bytes(&self) -> u64 {
        self.inner.ipc_bytes
    }

    /// The engine's state (to adopt it into another scope, publish it, or read raw records).
    pub fn state(&self) -> &SpilledState {
        &self.state
    }

    /// A reader of the batches in write order (takes a grant; the reader is an iterator of
    /// `Result<RecordBatch>`).
    pub fn reader(&self) -> Result<ArrowSpillReader> {
        let inner = self.state.reader()?;
        Ok(ArrowSpillReader {
            inner,
            decoder: FileDecoder::new(self.inner.schema.clone(), MetadataVersion::V5)
                .with_require_alignment(true),
            schema: self.inner.schema.clone(),
            record: 0,
            failed: false,
            stats: ReadStats::default(),
        })
    }
}

/// What a reader did, to count copies honestly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Records (batches) read.
    pub records: u64,
    /// Bytes of those records.
    pub record_bytes: u64,
    /// Records that were not aligned to [`MIN_MEMORY_ALIGN`] in memory and were copied once
    /// before decoding (zero with the engine's layout).
    pub realigned_records: u64,
    /// Bytes copied by those realignments.
    pub realigned_bytes: u64,
}

/// Reads an [`ArrowSpill`]'s batches in write order; an iterator of `Result<RecordBatch>`
/// that ends after the first error.
pub struct ArrowSpillReader {
    inner: SpillReader,
    decoder: FileDecoder,
    schema: SchemaRef,
    record: u64,
    failed: bool,
    stats: ReadStats,
}

impl fmt::Debug for ArrowSpillReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrowSpillReader")
            .field("record", &self.record)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Iterator for ArrowSpillReader {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = self
            .next_with_record()
            .map(|o| o.map(|(b, _)| b))
            .transpose();
        self.failed = matches!(r, Some(Err(_)));
        r
    }
}

impl ArrowSpillReader {
    /// The schema of the batches.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Copies made so far (see [`ReadStats`]).
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// The next batch and the engine record it was decoded from (its column buffers point
    /// into that record; a dictionary's values point into the record that carried the
    /// dictionary). `None` after the last batch.
    pub fn next_with_record(&mut self) -> Result<Option<(RecordBatch, Bytes)>> {
        let Some(rec) = self.inner.next_record()? else {
            return Ok(None);
        };
        let index = self.record;
        self.record += 1;
        let malformed = |detail| ArrowSpillError::Malformed {
            record: index,
            detail,
        };
        if rec.len() < PREFIX_LEN || &rec[..8] != MAGIC {
            return Err(malformed("not a spillring-arrow record (bad magic)"));
        }
        let mut len8 = [0u8; 8];
        len8.copy_from_slice(&rec[8..16]);
        let stream_len = usize::try_from(u64::from_le_bytes(len8))
            .map_err(|_| malformed("stream length overflows"))?;
        if stream_len > rec.len() - PREFIX_LEN {
            return Err(malformed("stream length runs past the record"));
        }
        self.stats.records += 1;
        self.stats.record_bytes += rec.len() as u64;
        let aligned = (rec.as_ptr() as usize + PREFIX_LEN).is_multiple_of(MIN_MEMORY_ALIGN);
        let stream = if aligned {
            Buffer::from(rec.clone()).slice_with_length(PREFIX_LEN, stream_len)
        } else {
            self.stats.realigned_records += 1;
            self.stats.realigned_bytes += stream_len as u64;
            let mut m = MutableBuffer::with_capacity(stream_len);
            m.extend_from_slice(&rec[PREFIX_LEN..PREFIX_LEN + stream_len]);
            Buffer::from(m)
        };
        let batch = self.decode_stream(&stream, index)?;
        Ok(Some((batch, rec)))
    }

    /// Decodes the messages of one record: schema (checked, skipped), dictionaries, then the
    /// one record batch.
    fn decode_stream(&mut self, stream: &Buffer, record: u64) -> Result<RecordBatch> {
        let malformed = |detail| ArrowSpillError::Malformed { record, detail };
        let mut off = 0;
        let mut batch = None;
        while off < stream.len() {
            let s = stream.as_slice();
            if s.len() - off < 8 || s[off..off + 4] != CONTINUATION {
                return Err(malformed("IPC message without its continuation marker"));
            }
            let meta_len = i32::from_le_bytes([s[off + 4], s[off + 5], s[off + 6], s[off + 7]]);
            let meta_len =
                usize::try_from(meta_len).map_err(|_| malformed("negative IPC metadata length"))?;
            if meta_len > s.len() - off - 8 {
                return Err(malformed("IPC metadata runs past the record"));
            }
            let message = arrow_ipc::root_as_message(&s[off + 8..off + 8 + meta_len])
                .map_err(|e| ArrowError::ParseError(format!("IPC message: {e}")))?;
            let body_len = usize::try_from(message.bodyLength())
                .map_err(|_| malformed("negative IPC body length"))?;
            let msg_len = 8 + meta_len;
            if body_len > s.len() - off - msg_len {
                return Err(malformed("IPC body runs past the record"));
            }
            let header = message.header_type();
            let buf = stream.slice_with_length(off, msg_len + body_len);
            let block = Block::new(
                0,
                i32::try_from(msg_len).map_err(|_| malformed("IPC metadata too long"))?,
                body_len as i64,
            );
            match header {
                MessageHeader::Schema => {
                    let fb = message
                        .header_as_schema()
                        .ok_or(malformed("schema message without a schema"))?;
                    let found = Arc::new(arrow_ipc::convert::try_fb_to_schema(fb)?);
                    if let Some(detail) = schema_difference(&self.schema, &found) {
                        return Err(ArrowSpillError::SchemaMismatch {
                            expected: self.schema.clone(),
                            found,
                            detail,
                        });
                    }
                }
                MessageHeader::DictionaryBatch => self.decoder.read_dictionary(&block, &buf)?,
                MessageHeader::RecordBatch => {
                    if batch.is_some() {
                        return Err(malformed("two record batches in one record"));
                    }
                    batch = self.decoder.read_record_batch(&block, &buf)?;
                }
                _ => return Err(malformed("unexpected IPC message type")),
            }
            off += msg_len + body_len;
        }
        batch.ok_or(malformed("record without a record batch"))
    }
}

/// Where a batch's buffers lie, against the memory ranges they should point into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferCount {
    /// Non-empty buffers of the batch (validity, offsets, values, children, dictionaries).
    pub buffers: u64,
    /// Of those, buffers not inside any of the ranges: copies.
    pub outside: u64,
    /// Bytes of the buffers outside.
    pub outside_bytes: u64,
}

impl std::ops::AddAssign for BufferCount {
    fn add_assign(&mut self, o: Self) {
        self.buffers += o.buffers;
        self.outside += o.outside;
        self.outside_bytes += o.outside_bytes;
    }
}

/// Counts the buffers of `batch` (recursively: validity bitmaps, offsets, values, child arrays
/// and dictionary values) that do not lie inside one of `ranges` (for instance the engine
/// records the batch was read from). Zero outside means zero copies of buffer bodies.
pub fn count_buffers_outside(batch: &RecordBatch, ranges: &[&[u8]]) -> BufferCount {
    let spans: Vec<(usize, usize)> = ranges
        .iter()
        .map(|r| (r.as_ptr() as usize, r.as_ptr() as usize + r.len()))
        .collect();
    let mut count = BufferCount::default();
    let mut seen = HashSet::new();
    for c in batch.columns() {
        count_data(&c.to_data(), &spans, &mut count, &mut seen);
    }
    count
}

fn count_data(
    d: &arrow_data::ArrayData,
    spans: &[(usize, usize)],
    count: &mut BufferCount,
    seen: &mut HashSet<(usize, usize)>,
) {
    let mut one = |ptr: *const u8, len: usize| {
        if len == 0 || !seen.insert((ptr as usize, len)) {
            return;
        }
        count.buffers += 1;
        let (s, e) = (ptr as usize, ptr as usize + len);
        if !spans.iter().any(|&(a, b)| a <= s && e <= b) {
            count.outside += 1;
            count.outside_bytes += len as u64;
        }
    };
    for b in d.buffers() {
        one(b.as_ptr(), b.len());
    }
    if let Some(n) = d.nulls() {
        let b = n.buffer();
        one(b.as_ptr(), b.len());
    }
    for c in d.child_data() {
        count_data(c, spans, count, seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framed_records_end_on_the_stream_alignment() {
        for stream in [0usize, 8, 64, 100, 4096, 1 << 20] {
            let p = padded_payload_len(stream);
            assert!(p >= PREFIX_LEN + stream);
            assert_eq!((spillring::segment::FRAME_LEN + p) % STREAM_ALIGN, 0);
            assert!(p - PREFIX_LEN - stream < STREAM_ALIGN);
        }
        // The stream then starts on the alignment: segment header, frame, prefix.
        assert_eq!(
            (spillring::segment::HEADER_LEN + spillring::segment::FRAME_LEN + PREFIX_LEN)
                % STREAM_ALIGN,
            0
        );
    }
}
