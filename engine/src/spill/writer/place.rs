//! Placing records: into the open block of the staging buffer, or as a block of their own
//! (a vectored write of block header + frame + payload, or copied through staging buffers in
//! direct mode); sealing a block (compressed per the codec policy) when its buffer is written,
//! waiting for in-flight budget, sealing a segment.

use std::io;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;

use super::rotate::trimmed_len;
use super::{SpillWriter, Wait, blocking};
use crate::config::{Compression, DIRECT_ALIGN};
use crate::core::Core;
use crate::error::{Result, SpillError};
use crate::fault::{self, FaultPoint, Injected};
use crate::format::block::{self, BLOCK_HEADER_LEN, Binding, BlockSeal, Codec, LARGE_PREFIX_LEN};
use crate::format::segment::{self, FRAME_LEN, HEADER_LEN};
use crate::io::{IoBuf, Op, OpKind, OpenBlock, Short, Take, WriteData};
use crate::metrics::Counters;
use crate::store::entry::SegmentEntry;

/// A record being placed (kept across `Pending` so async writes resume where they stopped).
pub(super) struct Placing {
    rec: Bytes,
    /// Block header + frame of a record that is a block of its own, once its offset is known.
    prefix: Option<[u8; LARGE_PREFIX_LEN]>,
    /// Zero bytes after a large record (direct mode: its block ends on 4 KiB).
    pad: usize,
    /// Bytes of prefix + payload placed.
    done: usize,
    /// Rotation decided and the target segment open.
    planned: bool,
    /// A block of its own (too large for a staging buffer, or vectored).
    large: bool,
    vectored: bool,
}

impl Placing {
    pub(super) fn new(rec: Bytes, vectored: bool) -> Self {
        Placing {
            vectored,
            rec,
            prefix: None,
            pad: 0,
            done: 0,
            planned: false,
            large: vectored,
        }
    }
}

/// Samples `Auto` compresses to choose a codec.
const AUTO_SAMPLE: usize = 64 << 10;
/// Blocks a chosen codec is kept for before the next trial.
const AUTO_KEEP: u32 = 8;
/// The longest back-off (in blocks) on incompressible data.
const AUTO_MAX_BACKOFF: u32 = 256;

/// `Auto`'s choice per block, as pure logic (the caller measures): DuckDB-style, a codec is
/// kept when the device time its saved bytes free pays for its CPU; on data that no codec
/// shrinks (or where none pays) the trials back off exponentially.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AutoPolicy {
    /// Blocks left before the next trial, and what they use meanwhile.
    skip: u32,
    sticky: Codec,
    /// The current back-off (doubles on each failed trial, from 1).
    backoff: u32,
}

/// What writing costs the writer, per physical byte: wall time between its blocks, and of that
/// the time it waited for its writes in flight (a full queue or the drain at `finish`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DeviceCost {
    pub(crate) ns_per_byte: f64,
    pub(crate) wait_ns_per_byte: f64,
}

/// One codec's result on a sample: bytes out and nanoseconds taken (`None`: did not shrink).
pub(crate) type TrialResult = Option<(usize, u64)>;

impl AutoPolicy {
    pub(crate) fn new() -> Self {
        AutoPolicy {
            skip: 0,
            sticky: Codec::Raw,
            backoff: 0,
        }
    }

    /// `Some(codec)` to use without a trial for this block, `None` to run a trial.
    pub(crate) fn next_block(&mut self) -> Option<Codec> {
        if self.skip > 0 {
            self.skip -= 1;
            return Some(self.sticky);
        }
        None
    }

    /// Chooses from a trial on `sample` bytes at the device cost the writer sees. A codec's
    /// gain is the writer time its saved bytes free, less its CPU: the saved bytes' device
    /// time, but never more than the time the writer spent waiting for the device over the
    /// sample's bytes. Writes run behind the writer, so a writer that never waits for the
    /// device (it is the bottleneck itself) gains nothing from writing fewer bytes and only
    /// pays the CPU: it stores raw. (Measuring the wall time between blocks alone made a
    /// compressing writer, slowed by its own CPU, see a slow device and keep compressing.)
    pub(crate) fn choose(
        &mut self,
        sample: usize,
        lz4: TrialResult,
        zstd: TrialResult,
        cost: DeviceCost,
    ) -> Codec {
        let gain = |t: TrialResult| {
            t.map(|(out, ns)| {
                let freed = sample.saturating_sub(out) as f64 * cost.ns_per_byte;
                freed.min(sample as f64 * cost.wait_ns_per_byte) - ns as f64
            })
        };
        let mut best = (Codec::Raw, 0.0f64);
        if let Some(g) = gain(lz4)
            && g > best.1
        {
            best = (Codec::Lz4, g);
        }
        if let Some(g) = gain(zstd)
            && g > best.1
        {
            best = (Codec::Zstd(1), g);
        }
        if best.0 == Codec::Raw {
            self.failed();
        } else {
            self.backoff = 0;
            self.sticky = best.0;
            self.skip = AUTO_KEEP;
        }
        best.0
    }

    /// A block the codec did not shrink: raw, and the next trials further off.
    pub(crate) fn failed(&mut self) {
        self.backoff = (self.backoff * 2).clamp(1, AUTO_MAX_BACKOFF);
        self.skip = self.backoff;
        self.sticky = Codec::Raw;
    }
}

/// A writer's codec: fixed, or `Auto` with its state and the write rate it sees.
pub(super) struct CodecState {
    mode: Compression,
    auto: AutoPolicy,
    /// Wall time per physical byte written, smoothed (`Auto`'s device cost).
    ns_per_byte: f64,
    /// Of that, the time spent waiting for writes in flight, per physical byte, smoothed.
    wait_ns_per_byte: f64,
    /// Waiting since the last block (added by `poll_inflight_below`).
    waited_ns: u64,
    /// When an async wait for writes in flight returned `Pending`.
    pending_since: Option<Instant>,
    last_block: Option<Instant>,
    /// Where `Auto`'s trials compress to (kept: no allocation per block).
    scratch: Vec<u8>,
}

impl CodecState {
    pub(super) fn new(mode: Compression) -> Self {
        CodecState {
            mode,
            auto: AutoPolicy::new(),
            // 1 GB/s until measured.
            ns_per_byte: 1.0,
            wait_ns_per_byte: 1.0,
            waited_ns: 0,
            pending_since: None,
            last_block: None,
            scratch: Vec::new(),
        }
    }

    /// Records a block of `bytes` written now: the rate the writer sees.
    fn observe(&mut self, bytes: usize) {
        let now = Instant::now();
        if let Some(t) = self.last_block.replace(now)
            && bytes > 0
        {
            let ns = now.duration_since(t).as_nanos() as f64 / bytes as f64;
            self.ns_per_byte = 0.8 * self.ns_per_byte + 0.2 * ns.clamp(0.01, 1000.0);
            let w = self.waited_ns as f64 / bytes as f64;
            self.wait_ns_per_byte = 0.8 * self.wait_ns_per_byte + 0.2 * w.clamp(0.0, 1000.0);
        }
        self.waited_ns = 0;
    }

    /// The cost `Auto` weighs a trial against.
    fn cost(&self) -> DeviceCost {
        DeviceCost {
            ns_per_byte: self.ns_per_byte,
            wait_ns_per_byte: self.wait_ns_per_byte,
        }
    }

    /// Counts time the writer spent waiting for its writes in flight.
    fn waited(&mut self, since: Instant) {
        self.waited_ns += since.elapsed().as_nanos() as u64;
    }
}

impl SpillWriter {
    /// Places the current record; `Pending` only for async waits, with progress kept.
    pub(super) fn step(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let Some(mut p) = self.placing.take() else {
            return Poll::Ready(Ok(()));
        };
        let r = self.place(&mut p, wait);
        if r.is_pending() {
            self.placing = Some(p);
        }
        r
    }

    /// True when a record of `len` bytes fits an empty full-size staging buffer's block.
    fn fits_block(&self, len: usize) -> bool {
        HEADER_LEN + BLOCK_HEADER_LEN + FRAME_LEN + len <= self.core.io.pool().buffer_capacity()
    }

    fn place(&mut self, p: &mut Placing, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let len = p.rec.len();
        if !p.planned {
            // With a codec, a record that fits a block goes into one (to be compressed) rather
            // than out as a vectored raw write.
            // So does every such record when encrypting (a vectored write is the caller's
            // plaintext).
            if p.vectored
                && (!matches!(self.codec.mode, Compression::None) || self.core.key.is_some())
                && self.fits_block(len)
            {
                p.vectored = false;
            }
            p.large = p.vectored || !self.fits_block(len);
            let need = if p.large {
                LARGE_PREFIX_LEN + len + DIRECT_ALIGN
            } else {
                BLOCK_HEADER_LEN + FRAME_LEN + len
            };
            ready_ok!(self.plan(need as u64, wait));
            p.planned = true;
        }
        if !p.large {
            let rec = p.rec.clone();
            if ready_ok!(self.place_in_block(&rec, wait)) {
                self.count_record(len);
                return Poll::Ready(Ok(()));
            }
            // The buffer budget gave only a buffer too small for it: a block of its own, copied
            // through small buffers.
            p.large = true;
        }
        // A block of its own: the open block (if any) is sealed first.
        if p.prefix.is_none() {
            ready_ok!(self.seal_open_block(wait));
            let Some(seg) = self.seg.as_ref() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let offset = seg.logical;
            // No padding: the block may end mid-buffer, and the next one starts there.
            p.pad = 0;
            let bind = seg_binding(seg.segment, seg.generation);
            if self.core.key.is_some() {
                // Encrypted: the record's ciphertext (an owned copy, the one allocation of an
                // encrypted large record) replaces it; its length is the same.
                let (prefix, ct) = large_encrypted(&self.core, bind, offset, &p.rec);
                p.prefix = Some(prefix);
                p.rec = ct;
            } else {
                p.prefix = Some(large_prefix(bind, offset, &p.rec, p.pad));
            }
        }
        let Some(prefix) = p.prefix else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let need = (LARGE_PREFIX_LEN + len + p.pad) as u64;
        if p.vectored {
            ready_ok!(self.flush_staging(wait, false));
            ready_ok!(self.poll_slot(wait));
            if let Some(seg) = self.seg.as_ref() {
                let end = seg.logical + need;
                ready_ok!(self.poll_allocated(end, false, wait));
            }
            let file = match self.segment_file() {
                Ok(f) => f,
                Err(e) => return Poll::Ready(Err(e)),
            };
            let Some(seg) = self.seg.as_mut() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let offset = seg.logical;
            seg.logical += need;
            seg.staged_at = seg.logical;
            let op = Op {
                kind: OpKind::Write {
                    file,
                    offset,
                    data: WriteData::Framed {
                        frame: prefix,
                        payload: p.rec.clone(),
                    },
                },
                sink: self.shared.clone(),
                token: seg.entry_index as u64,
            };
            self.submit(op);
        } else {
            let total = LARGE_PREFIX_LEN + len;
            while p.done < total {
                let rec = p.rec.clone();
                ready_ok!(self.copy_some(&prefix, &rec, &mut p.done, wait));
            }
            if p.pad > 0 {
                let Some(buf) = self.staging.as_mut() else {
                    return Poll::Ready(Err(SpillError::WriterFailed));
                };
                let at = buf.len;
                buf.space()[at..at + p.pad].fill(0);
                buf.len += p.pad;
                p.pad = 0;
            }
            if let Some(s) = self.seg.as_mut() {
                s.logical += need;
            }
        }
        let block_len = (LARGE_PREFIX_LEN + len) as u64;
        self.count_block(Codec::Raw, block_len, block_len, 0);
        self.count_record(len);
        Poll::Ready(Ok(()))
    }

    pub(super) fn place_slice(&mut self, rec: &[u8]) -> Result<()> {
        if !self.fits_block(rec.len()) {
            // A block of its own, copied through staging buffers like an owned record.
            self.placing = Some(Placing::new(Bytes::copy_from_slice(rec), false));
            return blocking(self.step(&mut Wait::Block));
        }
        let w = &mut Wait::Block;
        let need = segment::framed_len(rec.len()) + (LARGE_PREFIX_LEN + DIRECT_ALIGN) as u64;
        blocking(self.plan(need, w))?;
        if !blocking(self.place_in_block(rec, w))? {
            // A block of its own continuing into the next buffer, copied from the slice (no
            // owned copy of the record).
            blocking(self.place_large_slice(rec, w))?;
        }
        self.count_record(rec.len());
        Ok(())
    }

    /// A record that is a raw block of its own, copied from a slice through the staging
    /// buffers (blocking: the writer waits only for buffers and in-flight budget).
    fn place_large_slice(&mut self, rec: &[u8], wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        ready_ok!(self.seal_open_block(wait));
        let Some(seg) = self.seg.as_ref() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let bind = seg_binding(seg.segment, seg.generation);
        let (prefix, ct) = if self.core.key.is_some() {
            let (p, ct) = large_encrypted(&self.core, bind, seg.logical, rec);
            (p, Some(ct))
        } else {
            (large_prefix(bind, seg.logical, rec, 0), None)
        };
        let rec = ct.as_deref().unwrap_or(rec);
        let total = LARGE_PREFIX_LEN + rec.len();
        let mut done = 0;
        while done < total {
            ready_ok!(self.copy_some(&prefix, rec, &mut done, wait));
        }
        if let Some(s) = self.seg.as_mut() {
            s.logical += total as u64;
        }
        self.count_block(Codec::Raw, total as u64, total as u64, 0);
        Poll::Ready(Ok(()))
    }

    /// Puts a record that fits a staging buffer into the open block (opening one, or writing
    /// the buffer first when it lacks the room). Copies nothing until the room is there, so a
    /// `Pending` leaves no partial record. `false`: the buffer budget gives only buffers too
    /// small for it (nothing placed).
    fn place_in_block(&mut self, rec: &[u8], wait: &mut Wait<'_, '_>) -> Poll<Result<bool>> {
        let want = FRAME_LEN + rec.len();
        loop {
            if self.staging.is_none() {
                ready_ok!(self.poll_buffer(0, wait));
            }
            let Some(buf) = self.staging.as_mut() else {
                return Poll::Ready(Err(SpillError::WriterFailed));
            };
            let open = buf.block.is_some();
            let need = want + if open { 0 } else { BLOCK_HEADER_LEN };
            if buf.remaining() >= need {
                if !open {
                    open_block(buf);
                }
                buf.push(&block::record_frame(rec.len()));
                buf.push(rec);
                if let Some(b) = buf.block.as_mut() {
                    b.records += 1;
                }
                if let Some(s) = self.seg.as_mut() {
                    s.logical += need as u64;
                }
                return Poll::Ready(Ok(true));
            }
            if buf.len == 0 {
                // A fresh buffer smaller than the record (the budget is short).
                return Poll::Ready(Ok(false));
            }
            if !open {
                // What the buffer holds (a segment header, the tail of a large record) is
                // kept, and the record becomes a raw block of its own continuing into the next
                // buffer (direct mode: no unaligned write of the partial buffer).
                return Poll::Ready(Ok(false));
            }
            if matches!(self.codec.mode, Compression::None)
                && self.core.key.is_none()
                && buf.remaining() > 0
            {
                // Raw blocks are sealed where they stand, and the record becomes a block of
                // its own that continues into the next buffer: no tail of the buffer is lost
                // (nor padded in direct mode). Not when encrypting: a block of its own would
                // be encrypted through an owned copy of the record (an allocation per
                // buffer); the buffer is written instead, like a compressed block's.
                self.close_raw_block_in_place();
                return Poll::Ready(Ok(false));
            }
            ready_ok!(self.flush_staging(wait, false));
        }
    }

    /// Opens a block in the staging buffer for an in-place record slot (`slot.rs`), counting
    /// its header in the segment's length. The caller made sure the room is there.
    pub(super) fn ensure_block(&mut self) {
        if let Some(buf) = self.staging.as_mut()
            && buf.block.is_none()
        {
            open_block(buf);
            if let Some(s) = self.seg.as_mut() {
                s.logical += BLOCK_HEADER_LEN as u64;
            }
        }
    }

    /// Seals the raw block open in the staging buffer without writing the buffer: its header
    /// goes in place, and the buffer goes on filling after it.
    fn close_raw_block_in_place(&mut self) {
        let (Some(buf), Some(seg)) = (self.staging.as_mut(), self.seg.as_ref()) else {
            return;
        };
        let Some(ob) = buf.block.take() else {
            return;
        };
        let body = ob.at + BLOCK_HEADER_LEN;
        let raw_len = buf.len - body;
        let end = buf.len;
        let header = seal_in_place(
            &self.core,
            seg_binding(seg.segment, seg.generation),
            seg.staged_at + ob.at as u64,
            Codec::Raw,
            raw_len as u64,
            ob.records,
            0,
            &mut buf.space()[body..end],
        );
        buf.space()[ob.at..body].copy_from_slice(&header);
        let n = (BLOCK_HEADER_LEN + raw_len) as u64;
        self.count_block(Codec::Raw, n, n, 0);
    }

    /// Writes the staging buffer if a block is open in it (sealing the block).
    fn seal_open_block(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if self.staging.as_ref().is_some_and(|b| b.block.is_some()) {
            ready_ok!(self.flush_staging(wait, false));
        }
        Poll::Ready(Ok(()))
    }

    /// Counts a sealed block: its codec, logical (header + raw) and physical (header + stored)
    /// bytes, and the nanoseconds spent compressing it.
    fn count_block(&mut self, codec: Codec, logical: u64, physical: u64, nanos: u64) {
        let c = &self.core.counters;
        Counters::add(&c.logical_bytes_written, logical);
        Counters::add(&c.physical_bytes_written, physical);
        Counters::add(&c.compress_nanos, nanos);
        Counters::add(
            match codec {
                Codec::Raw => &c.blocks_raw,
                Codec::Lz4 => &c.blocks_lz4,
                Codec::Zstd(_) => &c.blocks_zstd,
            },
            1,
        );
    }

    /// Seals the block open in `buf` (which is about to be written at file offset
    /// `staged_at`): compresses its records per the codec policy into a second pooled buffer
    /// when that shrinks them, writes its header, pads it to `DIRECT_ALIGN` when `pad`.
    /// Returns the buffer to write and its length; keeps the segment's logical length.
    fn seal_block(&mut self, mut buf: IoBuf, pad: bool) -> IoBuf {
        let Some(ob) = buf.block.take() else {
            return buf;
        };
        let Some(seg) = self.seg.as_ref() else {
            return buf;
        };
        let bind = seg_binding(seg.segment, seg.generation);
        let offset = seg.staged_at + ob.at as u64;
        let body = ob.at + BLOCK_HEADER_LEN;
        let raw_len = buf.len - body;
        let t0 = Instant::now();
        let mut nanos = 0u64;
        let codec = self.pick_codec(&buf.filled()[body..], &mut nanos);
        let mut out = None;
        if codec != Codec::Raw
            && let Ok(mut o) = self.core.io.pool().try_get(buf.capacity())
            && o.capacity() >= buf.len
        {
            let room = o.capacity() - body;
            let n = {
                let (src, dst) = (&buf.filled()[body..], &mut o.space()[body..body + room]);
                block::compress(codec, src, dst)
            };
            match n {
                Some(n) => {
                    o.space()[..ob.at].copy_from_slice(&buf.filled()[..ob.at]);
                    o.len = body + n;
                    out = Some(o);
                }
                None => {
                    if matches!(self.codec.mode, Compression::Auto) {
                        self.codec.auto.failed();
                    }
                }
            }
            nanos = t0.elapsed().as_nanos() as u64;
        }
        let (mut w, codec) = match out {
            Some(o) => (o, codec),
            None => (buf, Codec::Raw),
        };
        let stored_len = w.len - body;
        let padn = if pad {
            w.len.next_multiple_of(DIRECT_ALIGN).min(w.capacity()) - w.len
        } else {
            0
        };
        let end = w.len;
        let header = seal_in_place(
            &self.core,
            bind,
            offset,
            codec,
            raw_len as u64,
            ob.records,
            padn as u32,
            &mut w.space()[body..end],
        );
        w.space()[ob.at..body].copy_from_slice(&header);
        let at = w.len;
        w.space()[at..at + padn].fill(0);
        w.len += padn;
        if let Some(seg) = self.seg.as_mut() {
            seg.logical = seg.logical - (raw_len - stored_len) as u64 + padn as u64;
        }
        self.codec.observe(w.len);
        self.count_block(
            codec,
            (BLOCK_HEADER_LEN + raw_len) as u64,
            (BLOCK_HEADER_LEN + stored_len) as u64,
            nanos,
        );
        w
    }

    /// The codec for a block of `raw` bytes: fixed, or `Auto`'s choice (a trial on a sample,
    /// timed into `nanos`).
    fn pick_codec(&mut self, raw: &[u8], nanos: &mut u64) -> Codec {
        match self.codec.mode {
            Compression::None => Codec::Raw,
            Compression::Lz4 => Codec::Lz4,
            Compression::Zstd { level } => Codec::Zstd(level),
            Compression::Auto => {
                if let Some(c) = self.codec.auto.next_block() {
                    return c;
                }
                let t0 = Instant::now();
                let sample = &raw[..raw.len().min(AUTO_SAMPLE)];
                let mut scratch = std::mem::take(&mut self.codec.scratch);
                scratch.resize(sample.len(), 0);
                let lz4 = trial(Codec::Lz4, sample, &mut scratch);
                let zstd = if lz4.is_some() {
                    trial(Codec::Zstd(1), sample, &mut scratch)
                } else {
                    None
                };
                self.codec.scratch = scratch;
                let c = self
                    .codec
                    .auto
                    .choose(sample.len(), lz4, zstd, self.codec.cost());
                *nanos += t0.elapsed().as_nanos() as u64;
                c
            }
        }
    }
    pub(super) fn count_record(&mut self, len: usize) {
        self.records += 1;
        self.bytes_written += len as u64;
        let c = &self.core.counters;
        Counters::add(&c.bytes_written, len as u64);
        Counters::add(&c.records_written, 1);
    }

    /// Makes sure a segment with room for `need` more bytes is open: seals the current one if
    /// the record would pass the segment size (unless it is the segment's first record).
    pub(super) fn plan(&mut self, need: u64, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        if let Some(seg) = &self.seg
            && seg.logical + need > self.segment_size
            && seg.logical > HEADER_LEN as u64
        {
            ready_ok!(self.poll_seal(wait));
        }
        let Some(seg) = &mut self.seg else {
            return match wait {
                Wait::Block => Poll::Ready(self.open_segment(need)),
                Wait::Async(cx) => self.poll_open_segment(need, cx),
            };
        };
        if !seg.file.is_cached() {
            // Evicted while idle: reopened before any byte of the record is placed, so a
            // refusal (`TooManyOpenFiles`) leaves the writer usable.
            if let Err(e) = self.reopen_segment() {
                return Poll::Ready(Err(e));
            }
        }
        let Some(seg) = &mut self.seg else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        if seg.logical + need > seg.reserved {
            // Only an empty segment gets here (a dropped `RecordSlot` opened it): the record
            // goes in whole, so its ticket must cover it.
            let mut bytes = seg.logical + need;
            if self.direct {
                bytes = bytes.next_multiple_of(DIRECT_ALIGN as u64);
            }
            let mut f = self.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                if let Err(err) = e.grow_to(bytes) {
                    return Poll::Ready(Err(err));
                }
                seg.reserved = bytes;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Copies as much of prefix + payload (from `*done`) as fits in the staging buffer, flushing
    /// it first when it is full.
    fn copy_some(
        &mut self,
        frame: &[u8],
        payload: &[u8],
        done: &mut usize,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        if self.staging.as_ref().is_some_and(|b| b.remaining() == 0) {
            ready_ok!(self.flush_staging(wait, false));
        }
        if self.staging.is_none() {
            ready_ok!(self.poll_buffer(0, wait));
        }
        let Some(buf) = self.staging.as_mut() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let flen = frame.len();
        if *done < flen {
            let n = (flen - *done).min(buf.remaining());
            buf.push(&frame[*done..*done + n]);
            *done += n;
        }
        if *done >= flen {
            let at = *done - flen;
            let n = (payload.len() - at).min(buf.remaining());
            buf.push(&payload[at..at + n]);
            *done += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes a staging buffer of at least `at_least` bytes under the engine's buffer budget
    /// (`io/buf.rs`): waits while the budget is full and a buffer is in flight (asynchronously
    /// for an async write); `BufferBudgetExhausted` when nothing is in flight to wait for.
    pub(super) fn poll_buffer(
        &mut self,
        at_least: usize,
        wait: &mut Wait<'_, '_>,
    ) -> Poll<Result<()>> {
        let pool = self.core.io.pool().clone();
        loop {
            if self.shared.files.is_aborted() {
                return Poll::Ready(Err(SpillError::Aborted));
            }
            if let Wait::Async(cx) = wait
                && let Some(job) = self.mapping.as_mut()
            {
                let r = ready_ok!(job.poll(cx).map(Ok::<_, SpillError>));
                self.mapping = None;
                return match r {
                    Ok(b) => {
                        self.staging = Some(b);
                        Poll::Ready(Ok(()))
                    }
                    Err(e) => Poll::Ready(Err(short_error(Short::Io(e)))),
                };
            }
            let took = match wait {
                Wait::Block => pool.try_take(at_least),
                Wait::Async(cx) => match pool.try_take_now(at_least) {
                    Some(r) => r,
                    None => {
                        // The pool's lock is held (a buffer coming back): look again soon
                        // rather than wait for the lock in the poll.
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                },
            };
            match took {
                Ok(Take::Free(b)) => {
                    self.staging = Some(b);
                    return Poll::Ready(Ok(()));
                }
                Ok(Take::Map(m)) => match wait {
                    Wait::Block => {
                        let r = match fault::check(&self.core.fault, FaultPoint::BufferMap) {
                            Injected::Fail(errno) => Err(io::Error::from_raw_os_error(errno)),
                            _ => m.map(false),
                        };
                        self.staging = Some(r.map_err(|e| short_error(Short::Io(e)))?);
                        return Poll::Ready(Ok(()));
                    }
                    // The map, the unmaps that made room for it and the first touch of its
                    // pages run on the offload pool (`io/buf.rs` `try_take`): the loop above
                    // polls the job.
                    Wait::Async(_) => {
                        let fault = self.core.fault.clone();
                        self.mapping = Some(self.core.io.offload().run(move || {
                            if let Injected::Fail(errno) =
                                fault::check(&fault, FaultPoint::BufferMap)
                            {
                                return Err(io::Error::from_raw_os_error(errno));
                            }
                            m.map(true)
                        }));
                    }
                },
                Err(Short::Wait { epoch }) => match wait {
                    Wait::Block => pool.wait_returned(epoch),
                    Wait::Async(cx) => {
                        if pool.register_waker(epoch, cx.waker()) {
                            return Poll::Pending;
                        }
                    }
                },
                Err(short) => return Poll::Ready(Err(short_error(short))),
            }
        }
    }

    /// Waits until this writer may have one more write in flight. Reports an earlier write's
    /// failure.
    fn poll_slot(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let depth = self.queue_depth;
        self.poll_inflight_below(depth, wait)
    }

    /// Waits until nothing of this writer is in flight.
    pub(super) fn poll_drained(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.poll_inflight_below(1, wait)
    }

    /// Waits until fewer than `limit` writes are in flight; an abort or an earlier write's
    /// failure ends the wait.
    fn poll_inflight_below(&mut self, limit: usize, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        let mut s = self.shared.tracker.st.lock();
        loop {
            if self.shared.files.is_aborted() {
                return Poll::Ready(Err(SpillError::Aborted));
            }
            if let Some((idx, e)) = s.error.take() {
                drop(s);
                return Poll::Ready(Err(self.write_error(idx, e)));
            }
            if s.inflight < limit {
                if let Some(t) = self.codec.pending_since.take() {
                    self.codec.waited(t);
                }
                return Poll::Ready(Ok(()));
            }
            match wait {
                Wait::Block => {
                    let t = Instant::now();
                    self.shared.tracker.cv.wait(&mut s);
                    self.codec.waited(t);
                }
                Wait::Async(cx) => {
                    s.waker = Some(cx.waker().clone());
                    self.codec.pending_since.get_or_insert_with(Instant::now);
                    return Poll::Pending;
                }
            }
        }
    }

    pub(super) fn wait_drained(&mut self) -> Result<()> {
        blocking(self.poll_drained(&mut Wait::Block))
    }

    fn write_error(&self, entry_index: u32, e: io::Error) -> SpillError {
        Counters::add(&self.core.counters.write_failures, 1);
        let f = self.shared.files.lock();
        let path = f
            .entries
            .get(entry_index as usize)
            .map(SegmentEntry::path)
            .unwrap_or_default();
        if let Some(entry) = f.entries.get(entry_index as usize) {
            self.core.root_failed(entry.dir.parent.root, &e);
        }
        SpillError::io("write", path, e)
    }

    fn submit(&mut self, op: Op) {
        self.shared.tracker.st.lock().inflight += 1;
        self.core.io.submit(self.lane, op);
    }

    /// Submits the staging buffer as one write. `pad` (direct mode, last write of a segment)
    /// zero-fills it to the alignment.
    pub(super) fn flush_staging(&mut self, wait: &mut Wait<'_, '_>, pad: bool) -> Poll<Result<()>> {
        self.flush_staging_with(wait, pad, false, false)
    }

    /// [`SpillWriter::flush_staging`]; with `inline`, when nothing of this writer is in
    /// flight, the write runs on the calling thread (the last write of a blocking `finish`,
    /// which waits for it anyway: two thread hand-offs saved). `sealing`: the segment's last write
    /// (its allocation grows only to this write's end).
    fn flush_staging_with(
        &mut self,
        wait: &mut Wait<'_, '_>,
        pad: bool,
        inline: bool,
        sealing: bool,
    ) -> Poll<Result<()>> {
        if self.staging.as_ref().is_none_or(|b| b.len == 0) {
            return Poll::Ready(Ok(()));
        }
        // Direct mode writes whole 4 KiB pages: a buffer written before it is full ends with a
        // block whose header records the padding (an empty one if no block is open).
        if self.direct
            && let Some(b) = self.staging.as_mut()
            && b.block.is_none()
            && b.len % DIRECT_ALIGN != 0
            && b.remaining() >= BLOCK_HEADER_LEN
            && !pad
        {
            open_block(b);
            if let Some(s) = self.seg.as_mut() {
                s.logical += BLOCK_HEADER_LEN as u64;
            }
        }
        let pad = pad || (self.direct && self.staging.as_ref().is_some_and(|b| b.block.is_some()));
        ready_ok!(self.poll_slot(wait));
        // The write's end (padded in direct mode) must be allocated first.
        if let (Some(b), Some(seg)) = (self.staging.as_ref(), self.seg.as_ref()) {
            let len = if pad {
                b.len.next_multiple_of(DIRECT_ALIGN).min(b.capacity())
            } else {
                b.len
            };
            let end = seg.staged_at + len as u64;
            ready_ok!(self.poll_allocated(end, sealing, wait));
        }
        let file = match self.segment_file() {
            Ok(f) => f,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let Some(buf) = self.staging.take() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let sealed_block = buf.block.is_some();
        let mut buf = self.seal_block(buf, pad);
        let Some(seg) = self.seg.as_mut() else {
            return Poll::Ready(Err(SpillError::WriterFailed));
        };
        let mut len = buf.len;
        if pad && !sealed_block {
            // The segment's end: the padding is past its logical length.
            let aligned = len.next_multiple_of(DIRECT_ALIGN).min(buf.capacity());
            buf.space()[len..aligned].fill(0);
            buf.len = aligned;
        } else {
            len = buf.len;
        }
        let offset = seg.staged_at;
        seg.staged_at += len as u64;
        // Counted in flight: a writer short of buffer budget may wait for it to come back.
        buf.mark_in_flight();
        let op = Op {
            kind: OpKind::Write {
                file,
                offset,
                data: WriteData::Staged(buf),
            },
            sink: self.shared.clone(),
            token: seg.entry_index as u64,
        };
        if inline && self.shared.tracker.st.lock().inflight == 0 {
            let token = op.token as u32;
            return match self.core.io.run_inline(&op) {
                Ok(_) => Poll::Ready(Ok(())),
                Err(e) => Poll::Ready(Err(self.write_error(token, e))),
            };
        }
        self.submit(op);
        Poll::Ready(Ok(()))
    }

    /// Flushes and seals the open segment: records its length and trims its ticket's quota.
    fn poll_seal(&mut self, wait: &mut Wait<'_, '_>) -> Poll<Result<()>> {
        self.seal_with(wait, false)
    }

    pub(super) fn seal_with(&mut self, wait: &mut Wait<'_, '_>, last: bool) -> Poll<Result<()>> {
        if self.seg.is_none() {
            return Poll::Ready(Ok(()));
        }
        let direct = self.direct;
        let inline = last && matches!(wait, Wait::Block);
        ready_ok!(self.flush_staging_with(wait, direct, inline, true));
        if let Some(seg) = self.seg.take() {
            let mut f = self.shared.files.lock();
            if let Some(e) = f.entries.get_mut(seg.entry_index) {
                e.len = seg.logical;
                // The quota bounds allocated blocks: a segment allocated up front keeps its
                // whole ticket until `finish` gives the unused tail back.
                if seg.allocated > trimmed_len(seg.logical) {
                    e.allocated = seg.allocated;
                } else {
                    e.shrink_to(seg.logical);
                }
                // The fd stays with the file, for its reader and the pool's next writer.
                e.file = Some(seg.file);
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The error for a buffer the budget could not give (a wait is not an error).
pub(super) fn short_error(short: Short) -> SpillError {
    match short {
        Short::Exhausted { budget, held } => SpillError::BufferBudgetExhausted { budget, held },
        Short::Io(e) => SpillError::io("allocate buffer", "", e),
        Short::Wait { .. } => SpillError::WriterFailed,
    }
}

/// The binding of blocks of use `generation` of segment `segment`.
fn seg_binding(segment: u32, generation: u32) -> Binding {
    Binding {
        segment,
        generation,
    }
}

/// Reserves a block header at the buffer's end and opens a block there.
fn open_block(buf: &mut IoBuf) {
    let at = buf.len;
    buf.push(&[0u8; BLOCK_HEADER_LEN]);
    buf.block = Some(OpenBlock { at, records: 0 });
}

/// Block header + frame of a record that is a raw block of its own at `offset`.
fn large_prefix(bind: Binding, offset: u64, rec: &[u8], pad: usize) -> [u8; LARGE_PREFIX_LEN] {
    let frame = block::record_frame(rec.len());
    let stored = (FRAME_LEN + rec.len()) as u64;
    let mut seal = BlockSeal::new(bind, offset, Codec::Raw, stored, stored, 1, pad as u32);
    seal.update(&frame);
    seal.update(rec);
    let mut p = [0u8; LARGE_PREFIX_LEN];
    p[..BLOCK_HEADER_LEN].copy_from_slice(&seal.finish());
    p[BLOCK_HEADER_LEN..].copy_from_slice(&frame);
    p
}

/// Seals a block (see [`block::seal_in_place`]) with the engine's key if it has one, counting
/// the nanoseconds spent encrypting.
#[allow(clippy::too_many_arguments)]
fn seal_in_place(
    core: &Core,
    bind: Binding,
    offset: u64,
    codec: Codec,
    raw: u64,
    records: u32,
    pad: u32,
    stored: &mut [u8],
) -> [u8; BLOCK_HEADER_LEN] {
    let t = core.key.is_some().then(Instant::now);
    let h = block::seal_in_place(
        core.key.as_ref(),
        bind,
        offset,
        codec,
        raw,
        records,
        pad,
        stored,
    );
    if let Some(t) = t {
        Counters::add(&core.counters.encrypt_nanos, t.elapsed().as_nanos() as u64);
    }
    h
}

/// Block header + the first `FRAME_LEN` ciphertext bytes, and the rest of the ciphertext, of a
/// record that is an encrypted raw block of its own at `offset` (no padding).
fn large_encrypted(
    core: &Core,
    bind: Binding,
    offset: u64,
    rec: &[u8],
) -> ([u8; LARGE_PREFIX_LEN], Bytes) {
    let mut ct = Vec::with_capacity(FRAME_LEN + rec.len());
    ct.extend_from_slice(&block::record_frame(rec.len()));
    ct.extend_from_slice(rec);
    let raw = ct.len() as u64;
    let h = seal_in_place(core, bind, offset, Codec::Raw, raw, 1, 0, &mut ct);
    let mut p = [0u8; LARGE_PREFIX_LEN];
    p[..BLOCK_HEADER_LEN].copy_from_slice(&h);
    p[BLOCK_HEADER_LEN..].copy_from_slice(&ct[..FRAME_LEN]);
    (p, Bytes::from(ct).slice(FRAME_LEN..))
}

/// Compresses a sample with `codec`, timed: `None` if it does not shrink.
fn trial(codec: Codec, sample: &[u8], scratch: &mut [u8]) -> Option<(usize, u64)> {
    let t = Instant::now();
    let n = block::compress(codec, sample, scratch)?;
    Some((n, t.elapsed().as_nanos() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device-bound writer: it waits for the device all the time it is not copying.
    fn bound(ns_per_byte: f64) -> DeviceCost {
        DeviceCost {
            ns_per_byte,
            wait_ns_per_byte: ns_per_byte,
        }
    }

    #[test]
    fn auto_stores_raw_when_the_writer_never_waits_for_the_device() {
        let mut p = AutoPolicy::new();
        // The wall time between blocks is long (10 MB/s) because the writer itself is slow
        // (its producer, or its own compression): writes never make it wait, so fewer bytes
        // free no writer time and any codec only adds CPU.
        let cpu_bound = DeviceCost {
            ns_per_byte: 100.0,
            wait_ns_per_byte: 0.0,
        };
        assert_eq!(
            p.choose(
                65536,
                Some((16384, 20_000)),
                Some((8000, 200_000)),
                cpu_bound
            ),
            Codec::Raw
        );
        // Waiting a little: a codec pays only up to the wait it removes.
        while p.next_block().is_some() {}
        let some_wait = DeviceCost {
            ns_per_byte: 100.0,
            wait_ns_per_byte: 0.5,
        };
        // 64 KiB x 0.5 ns = 32.8 us of waiting: lz4 (20 us) pays, zstd (200 us) does not.
        assert_eq!(
            p.choose(
                65536,
                Some((16384, 20_000)),
                Some((8000, 200_000)),
                some_wait
            ),
            Codec::Lz4
        );
    }

    #[test]
    fn auto_keeps_a_codec_that_pays_and_retries_after_a_while() {
        let mut p = AutoPolicy::new();
        assert_eq!(p.next_block(), None);
        // 64 KiB -> 16 KiB in 20 us at 1 ns/byte: 48 us of device time saved.
        let c = p.choose(
            65536,
            Some((16384, 20_000)),
            Some((12000, 200_000)),
            bound(1.0),
        );
        assert_eq!(c, Codec::Lz4);
        for _ in 0..AUTO_KEEP {
            assert_eq!(p.next_block(), Some(Codec::Lz4));
        }
        assert_eq!(p.next_block(), None);
        // On a slow device (10 MB/s) zstd's better ratio pays for its extra CPU.
        assert_eq!(
            p.choose(
                65536,
                Some((16384, 20_000)),
                Some((8000, 200_000)),
                bound(100.0)
            ),
            Codec::Zstd(1)
        );
    }

    #[test]
    fn auto_stores_raw_when_the_cpu_costs_more_than_the_device_time_saved() {
        let mut p = AutoPolicy::new();
        // A fast device (0.1 ns/byte): 48 KiB saved is 4.9 us, the codec took 20 us.
        assert_eq!(
            p.choose(65536, Some((16384, 20_000)), None, bound(0.1)),
            Codec::Raw
        );
        assert_eq!(p.next_block(), Some(Codec::Raw));
        assert_eq!(p.next_block(), None);
    }

    #[test]
    fn auto_backs_off_exponentially_on_incompressible_data() {
        let mut p = AutoPolicy::new();
        let mut trials = 0;
        for _ in 0..2000 {
            if p.next_block().is_none() {
                trials += 1;
                assert_eq!(p.choose(65536, None, None, bound(1.0)), Codec::Raw);
            }
        }
        // 1 + 2 + 4 + ... + 256, then every 257 blocks: 9 trials for the first 511 blocks,
        // 2000 blocks take 9 + ceil((2000 - 520) / 257) trials.
        assert!(trials <= 16, "{trials} trials in 2000 blocks");
        // Then one block that pays resets the back-off.
        while p.next_block().is_some() {}
        assert_eq!(
            p.choose(65536, Some((1000, 1000)), None, bound(1.0)),
            Codec::Lz4
        );
        assert_eq!(p.backoff, 0);
    }
}
