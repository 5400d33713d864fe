//! [`SegmentReader`]: reads one published segment file without an engine.
//!
//! The bytes are parsed by [`crate::format::segment`] and [`crate::format::block`] (the
//! header, each block's header and checksum); this module only reads the file, with plain
//! `read`s through a buffer (no mapping, so a file shrunk or damaged under the reader is an
//! error, never a `SIGBUS`). Each block is read into a buffer of its own (a compressed one is
//! decoded into a pooled buffer): memory is bounded by the largest block, not by the file.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::{Result, SpillError};
use crate::format::block::{self, BLOCK_HEADER_LEN, Binding};
use crate::format::segment::{self, HEADER_LEN, SegmentHeader};
use crate::metrics::Counters;
use crate::spill::cursor::CurBlock;

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
    header: SegmentHeader,
    /// Offset of the next block.
    off: u64,
    /// The block whose records are being handed out.
    block: Option<CurBlock>,
    /// This reader's own counters (a reader without an engine counts into nothing shared).
    counters: Counters,
    /// The file's length when it was opened: where the last frame must end.
    len: u64,
    /// An error was returned: the reader ends there.
    failed: bool,
}

impl std::fmt::Debug for SegmentReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentReader")
            .field("path", &self.path)
            .field("offset", &self.off)
            .field("len", &self.len)
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
        let len = file
            .metadata()
            .map_err(|e| SpillError::io("stat", &path, e))?
            .len();
        let mut file = BufReader::with_capacity(READ_BUFFER, file);
        let mut head = [0u8; HEADER_LEN];
        let got = read_full(&mut file, &mut head).map_err(|e| SpillError::io("read", &path, e))?;
        if got < HEADER_LEN {
            return Err(corrupt(
                &path,
                0,
                got as u64,
                "segment truncated inside its header",
            ));
        }
        let header = segment::parse_header(&head).map_err(|d| corrupt(&path, 0, 0, d))?;
        if header.key_id.is_some() {
            return Err(corrupt(
                &path,
                header.segment,
                0,
                "segment is encrypted: its key lived only in the memory of the engine that wrote it",
            ));
        }
        Ok(SegmentReader {
            file,
            path,
            header,
            off: HEADER_LEN as u64,
            block: None,
            counters: Counters::default(),
            len,
            failed: false,
        })
    }

    /// The file's header: the segment number it had in the engine, the engine's id, the use
    /// of the file (its generation) and the format version.
    pub fn header(&self) -> SegmentHeader {
        self.header
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
        let r = self.read_frame();
        self.failed = r.is_err();
        r
    }

    fn read_frame(&mut self) -> Result<Option<Bytes>> {
        loop {
            match CurBlock::next_of(&mut self.block) {
                Ok(Some(rec)) => return Ok(Some(rec)),
                Ok(None) => {}
                Err(d) => return Err(corrupt(&self.path, self.header.segment, d.offset, d.detail)),
            }
            if !self.read_block()? {
                return Ok(None);
            }
        }
    }

    /// Reads, checks and decodes the next block; `false` at the end of the file.
    fn read_block(&mut self) -> Result<bool> {
        let off = self.off;
        let left = self.len.saturating_sub(off);
        if left == 0 {
            if let Some(b) = self.block.as_ref().filter(|b| b.assembling()) {
                let at = b.offset;
                let detail = "segment ends inside a chunked record";
                return Err(corrupt(&self.path, self.header.segment, at, detail));
            }
            // The file may have grown since it was opened: a block past `len` is not read.
            return Ok(false);
        }
        let bad = |detail| corrupt(&self.path, self.header.segment, off, detail);
        let mut head = [0u8; BLOCK_HEADER_LEN];
        let got = read_full(&mut self.file, &mut head)
            .map_err(|e| SpillError::io("read", &self.path, e))?;
        if got < BLOCK_HEADER_LEN {
            return Err(bad(if left < BLOCK_HEADER_LEN as u64 {
                "truncated block header"
            } else {
                "segment truncated inside a block header"
            }));
        }
        let h = block::parse_block_header(&head).map_err(bad)?;
        let body = left - BLOCK_HEADER_LEN as u64;
        if h.stored > body {
            // Checked before the buffer is allocated: a damaged length never asks for more
            // memory than the file holds.
            return Err(bad("block runs past the end of the segment"));
        }
        if u64::from(h.pad) > body - h.stored {
            return Err(bad("block padding runs past the end of the segment"));
        }
        let mut stored = vec![0u8; h.stored as usize];
        let got = read_full(&mut self.file, &mut stored)
            .map_err(|e| SpillError::io("read", &self.path, e))?;
        if got < stored.len() {
            return Err(bad("segment truncated inside a block"));
        }
        let bind = Binding {
            segment: self.header.segment,
            generation: self.header.generation,
            engine: self.header.engine,
        };
        block::check_parts(&head, &stored, bind, off).map_err(|d| bad(d.detail))?;
        let mut pad = [0u8; 4096];
        let pad = &mut pad[..h.pad as usize];
        let got =
            read_full(&mut self.file, pad).map_err(|e| SpillError::io("read", &self.path, e))?;
        if got < pad.len() {
            return Err(bad("segment truncated inside a block's padding"));
        }
        let cb = CurBlock::decode(h, Bytes::from(stored), off, &self.counters, None)
            .and_then(|cb| cb.follow(self.block.take()))
            .map_err(bad)?;
        self.off = off + BLOCK_HEADER_LEN as u64 + h.stored + u64::from(h.pad);
        self.block = Some(cb);
        Ok(true)
    }
}

/// Records in write order, as `Result<Bytes>`; ends after the first error.
impl Iterator for SegmentReader {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        self.next_record().transpose()
    }
}

fn corrupt(path: &Path, segment: u32, offset: u64, detail: &'static str) -> SpillError {
    SpillError::Corrupt {
        path: path.to_path_buf(),
        segment,
        offset,
        detail,
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
