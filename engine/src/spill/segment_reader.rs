//! [`SegmentReader`]: reads one published segment file without an engine.
//!
//! The bytes are checked and decoded by the segment codec (`format/cursor.rs`, the walk every
//! reader uses); this module only reads the file, with plain `read`s through a buffer (no
//! mapping, so a file shrunk or damaged under the reader is an error, never a `SIGBUS`), and
//! hands the walk each block as it reads it, into a buffer of its own (a compressed one is
//! decoded into a pooled buffer): memory is bounded by the largest block, not by the file.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::{Result, SpillError};
use crate::format::block::BLOCK_HEADER_LEN;
use crate::format::cursor::{Expected, SegmentCursor};
use crate::format::segment::{self, Damage, HEADER_LEN, SegmentHeader};
use crate::io::{DECODE_POOL, DecodePool};

/// The read-ahead buffer: a few syscalls per MiB of small records.
const READ_BUFFER: usize = 128 << 10;

/// Reads the records of one segment file that [`crate::SpilledState::publish`] handed to the
/// caller, in write order, each block's CRC-32C checked, without an engine.
///
/// The written-length rule: a segment's header does not record its length; the engine knows
/// it, and `publish` trims each file to it (header and records, no padding). So this reader
/// reads to the end of the file, which must end exactly after the last whole frame. A file
/// that ends inside a frame, holds bytes that are not a valid frame (direct-mode padding left
/// on a file that was copied rather than published, a torn write, bit rot), or whose header is
/// damaged gives [`SpillError::Corrupt`] with the offset of the bad frame (0 for the header),
/// and no byte of a bad record is returned; its `segment` is the number in the file's header
/// (0 when the header itself is bad). A file cut exactly at a frame boundary is a shorter
/// valid file: nothing in the format tells them apart (the sum of the published files'
/// lengths is [`crate::SpilledState::bytes`] before the publish).
///
/// The iterator yields `Result<Bytes>` and ends after the first error.
///
/// ```
/// # fn main() -> spillring::Result<()> {
/// use spillring::{Bytes, Engine, EngineConfig, SegmentReader};
/// let root = tempfile::tempdir().unwrap();
/// let dest = tempfile::tempdir_in(root.path()).unwrap(); // on the root's filesystem
/// let engine = Engine::open(EngineConfig::new(root.path()))?;
/// let task = engine.task("job-1")?;
/// let mut w = task.writer()?;
/// w.write(Bytes::from_static(b"first"))?;
/// w.write(Bytes::from_static(b"second"))?;
/// let paths = w.finish()?.publish(dest.path(), "part")?;
/// drop((task, engine)); // the published files are the caller's: they stay
///
/// let mut records = Vec::new();
/// for p in &paths {
///     for rec in SegmentReader::open(p)? {
///         records.push(rec?);
///     }
/// }
/// assert_eq!(records, [&b"first"[..], &b"second"[..]]);
/// # Ok(()) }
/// ```
pub struct SegmentReader {
    file: BufReader<File>,
    path: PathBuf,
    /// The codec's walk, handed each block as it is read.
    cursor: SegmentCursor<&'static DecodePool>,
    /// An error was returned: the reader ends there.
    failed: bool,
}

impl std::fmt::Debug for SegmentReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentReader")
            .field("path", &self.path)
            .field("header", &self.cursor.header())
            .finish()
    }
}

impl SegmentReader {
    /// Opens a segment file and checks its header. `Corrupt` (offset 0, or the file's length
    /// if it ends inside the header) if it is not a valid segment; `Io` (`TooManyOpenFiles`
    /// for EMFILE/ENFILE) if it cannot be opened or read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| SpillError::io("open", &path, e))?;
        // The written length: a published file was trimmed to it.
        let len = file
            .metadata()
            .map_err(|e| SpillError::io("stat", &path, e))?
            .len();
        let mut file = BufReader::with_capacity(READ_BUFFER, file);
        let mut head = Vec::with_capacity(HEADER_LEN);
        (&mut file)
            .take(HEADER_LEN as u64)
            .read_to_end(&mut head)
            .map_err(|e| SpillError::io("read", &path, e))?;
        match SegmentCursor::open(&head, len, Expected::default(), &DECODE_POOL) {
            Ok(cursor) => Ok(SegmentReader {
                file,
                path,
                cursor,
                failed: false,
            }),
            Err(d) => {
                let seg = segment::parse_header(&head).map_or(0, |h| h.segment);
                Err(d.error(path, seg))
            }
        }
    }

    /// The file's header: the segment number it had in the engine, the engine's id, the use
    /// of the file (its generation) and the format version.
    pub fn header(&self) -> SegmentHeader {
        self.cursor.header()
    }

    /// The path it reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next record, `None` at the end of the file. `Corrupt` (with the frame's offset) for
    /// a truncated or damaged frame; the reader returns nothing after an error.
    pub fn next_record(&mut self) -> Result<Option<Bytes>> {
        if self.failed {
            return Ok(None);
        }
        let r = self.read_record();
        self.failed = r.is_err();
        r
    }

    /// The next record of the block read last, or of the next block, read whole (header,
    /// stored bytes, padding) into a buffer of its own and handed to the walk.
    fn read_record(&mut self) -> Result<Option<Bytes>> {
        let seg = self.cursor.header().segment;
        let corrupt = |d: Damage| d.error(self.path.clone(), seg);
        let read_err = |e| SpillError::io("read", &self.path, e);
        loop {
            if let Some(rec) = self.cursor.record().map_err(corrupt)? {
                return Ok(Some(rec));
            }
            let mut head = [0u8; BLOCK_HEADER_LEN];
            let head = match self.file.read_exact(&mut head) {
                Ok(()) => &head[..],
                // Short: the walk says what that means here (the end, or a truncated file).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => &[],
                Err(e) => return Err(read_err(e)),
            };
            // Its length is checked against the file's before the buffer is allocated: a
            // damaged length never asks for more memory than the file holds.
            let Some(len) = self.cursor.next_len(head).map_err(corrupt)? else {
                // The file may have grown since it was opened: a block past its length then
                // is not read.
                return Ok(None);
            };
            let mut block = Vec::with_capacity(len);
            block.extend_from_slice(head);
            (&mut self.file)
                .take((len - BLOCK_HEADER_LEN) as u64)
                .read_to_end(&mut block)
                .map_err(read_err)?;
            self.cursor
                .push(Bytes::from(block), None, None)
                .map_err(corrupt)?;
        }
    }
}

/// Records in write order, as `Result<Bytes>`; ends after the first error.
impl Iterator for SegmentReader {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        self.next_record().transpose()
    }
}
