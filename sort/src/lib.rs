//! An external sort on spillring: fixed 100-byte records with 10-byte keys (the Sort
//! Benchmark's `gensort -a` layout), sorted runs spilled through the engine, then a k-way merge
//! over one [`spillring::SpillReader`] per run, all open at once, into the output file.
//!
//! Memory: one run buffer and its sort index (16 bytes per record: the key's first 8 bytes and
//! the record's position) within the budget. A run is sorted by its index (no 100-byte record
//! moves), then gathered in order straight into the engine's staging buffers through
//! `SpillWriter::record` slots, so the run buffer is free for the next run as soon as the
//! gather ends while the engine writes behind. In the merge, one segment per run is in memory
//! at a time, the segment size picked so that all runs together hold at most half the budget.
//! Outside the budget: the engine's staging buffers (`io_buffer_size` each, `queue_depth` of
//! them in flight) and the output writer's 4 MiB buffer.
//!
//! Records are printable ASCII lines ending in `\r\n` (as `gensort -a` makes them), so a file
//! of records is its own text rendering: `LC_ALL=C sort` sorts the same bytes, and comparing
//! whole records is comparing lines.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use spillring::{EngineConfig, SpillError, SpillReader, SpilledState, TaskSpill};

/// Bytes of a record.
pub const RECORD: usize = 100;
/// Bytes of a record's key (its first bytes).
pub const KEY: usize = 10;
/// The engine's largest segment.
const MAX_SEGMENT: usize = 64 << 20;
/// The smallest segment the sort uses.
const MIN_SEGMENT: usize = 64 << 10;

/// What the sort can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SortError {
    /// The input is not a whole number of 100-byte records.
    #[error("input {path} is {len} bytes, not a whole number of {RECORD}-byte records")]
    BadInput {
        /// The input file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The budget is too small to hold a run.
    #[error("budget of {budget} bytes is below the minimum of {min}")]
    BudgetTooSmall {
        /// The budget given.
        budget: usize,
        /// The smallest budget accepted.
        min: usize,
    },
    /// Reading the input or writing the output failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// On which file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A spilled run holds a record that is not whole sort records (the engine's CRC passed,
    /// so it was written like this: a bug, not damage).
    #[error("a spilled run record of {len} bytes is not whole {RECORD}-byte records")]
    BadRun {
        /// The engine record's length.
        len: usize,
    },
    /// The sort was cancelled (Ctrl-C): the engine deleted the spilled runs.
    #[error("sort cancelled")]
    Cancelled,
    /// The spill engine failed.
    #[error(transparent)]
    Spill(#[from] SpillError),
}

impl SortError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        SortError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Result alias of the sort.
pub type Result<T, E = SortError> = std::result::Result<T, E>;

/// Bytes of a run's sort index per record.
pub const INDEX_ENTRY: usize = std::mem::size_of::<(u64, u32)>();

/// The smallest budget: two runs of at least 64 KiB.
pub const MIN_BUDGET: usize = 2 * MIN_SEGMENT;

/// How a sort of `input_len` bytes under `budget` is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Bytes of one run (a whole number of records).
    pub run_bytes: usize,
    /// Runs the input makes.
    pub runs: usize,
    /// The engine's segment size: the merge holds one segment per run.
    pub segment_size: usize,
    /// Bytes of one engine record (a whole number of sort records).
    pub chunk: usize,
}

impl Plan {
    /// The plan for `input_len` bytes of input and `budget` bytes of memory.
    pub fn new(input_len: u64, budget: usize) -> Result<Plan> {
        if budget < MIN_BUDGET {
            return Err(SortError::BudgetTooSmall {
                budget,
                min: MIN_BUDGET,
            });
        }
        // A run and its index: RECORD + INDEX_ENTRY bytes per record.
        let run_bytes = (budget / (RECORD + INDEX_ENTRY)).min(u32::MAX as usize) * RECORD;
        let runs = usize::try_from(input_len.div_ceil(run_bytes as u64))
            .unwrap_or(usize::MAX)
            .max(1);
        let segment_size = ((budget / 2) / runs / 4096 * 4096).clamp(MIN_SEGMENT, MAX_SEGMENT);
        // An engine record fits a staging buffer (the segment size up to 1 MiB) with its frame.
        let chunk = ((segment_size.min(1 << 20) - 4096) / RECORD * RECORD).max(RECORD);
        Ok(Plan {
            run_bytes,
            runs,
            segment_size,
            chunk,
        })
    }

    /// The engine configuration for this plan on `spill_dir`: segments of the plan's size, each
    /// read back with one `pread` into a buffer of its own (so the merge's memory is bounded
    /// and counted, not mapped pages), the segment pool off (the runs are deleted as soon as
    /// the merge is done with them), and staging buffers that hold a whole chunk, so each
    /// chunk is gathered in place.
    pub fn engine_config(&self, spill_dir: &Path) -> EngineConfig {
        let io_buffer = self.segment_size.min(1 << 20);
        EngineConfig::new(spill_dir)
            .segment_size(self.segment_size as u64)
            .io_buffer_size(io_buffer as u64)
            .read_buffer_max(self.segment_size as u64)
            .pool_max_segments(0)
    }
}

/// SplitMix64: the seeded generator of the input (small, fast, reproducible everywhere).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Record `index` in the `gensort -a` layout: 10 printable key bytes (`' '..='~'`, drawn
/// from `rng`), two spaces, the index as 32 hex digits, two spaces, 52 filler bytes (a hex
/// digit of the index repeated, in groups of four), `\r\n`.
pub fn gen_record(rng: &mut SplitMix64, index: u64, out: &mut [u8; RECORD]) {
    // 95^8 < 2^64: eight key bytes from one draw, the last two from another.
    let mut bits = rng.next_u64();
    for b in &mut out[..8] {
        *b = b' ' + (bits % 95) as u8;
        bits /= 95;
    }
    let mut bits = rng.next_u64();
    for b in &mut out[8..KEY] {
        *b = b' ' + (bits % 95) as u8;
        bits /= 95;
    }
    out[10..12].copy_from_slice(b"  ");
    let idx = u128::from(index);
    for (i, b) in out[12..44].iter_mut().enumerate() {
        *b = HEX[((idx >> (4 * (31 - i))) & 0xf) as usize];
    }
    out[44..46].copy_from_slice(b"  ");
    for (i, b) in out[46..98].iter_mut().enumerate() {
        *b = HEX[((index >> (4 * ((i / 4) % 16))) & 0xf) as usize];
    }
    out[98..100].copy_from_slice(b"\r\n");
}

/// Writes `records` records generated from `seed` to `path`.
pub fn generate(path: &Path, records: u64, seed: u64) -> Result<()> {
    let f = File::create(path).map_err(|e| SortError::io("create", path, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut rng = SplitMix64::new(seed);
    let mut rec = [0u8; RECORD];
    for i in 0..records {
        gen_record(&mut rng, i, &mut rec);
        w.write_all(&rec)
            .map_err(|e| SortError::io("write", path, e))?;
    }
    w.flush().map_err(|e| SortError::io("write", path, e))?;
    Ok(())
}

/// What a sort did.
#[derive(Debug, Clone, Default)]
pub struct SortReport {
    /// Records sorted.
    pub records: u64,
    /// Runs spilled.
    pub runs: usize,
    /// Segment files the runs took.
    pub segments: usize,
    /// Bytes spilled.
    pub spilled: u64,
    /// Reading, sorting and spilling the runs.
    pub run_phase: Duration,
    /// The merge into the output.
    pub merge_phase: Duration,
}

/// Options of one sort.
#[derive(Debug, Clone)]
pub struct SortOptions {
    /// The input file of records.
    pub input: PathBuf,
    /// The output file (created or truncated; removed if the sort fails).
    pub output: PathBuf,
    /// The plan (from [`Plan::new`]).
    pub plan: Plan,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// Fills `buf` from `f`; returns the bytes read (short only at the end of the file).
fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn bar(progress: bool, len: u64, what: &'static str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>6} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_prefix(what);
    pb
}

/// Maps an engine error to the sort's: an abort is the cancel.
fn spill_err(cancel: &AtomicBool, e: SpillError) -> SortError {
    if e.is_aborted() || cancel.load(Ordering::Acquire) {
        SortError::Cancelled
    } else {
        SortError::Spill(e)
    }
}

/// Sorts `opts.input` into `opts.output` through `task`'s spills. `cancel` (set by a Ctrl-C
/// handler that also cancels `task`) stops it with [`SortError::Cancelled`]. `hold` is called
/// once all runs are spilled, before the merge (the cancel test waits there). On any error the
/// output file is removed; the runs spilled so far belong to `task`, whose close or cancel
/// deletes them.
pub fn sort_file(
    opts: &SortOptions,
    task: &TaskSpill,
    cancel: &Arc<AtomicBool>,
    hold: &dyn Fn(),
) -> Result<SortReport> {
    let r = sort_inner(opts, task, cancel, hold);
    if r.is_err() {
        let _ = std::fs::remove_file(&opts.output);
    }
    r
}

fn sort_inner(
    opts: &SortOptions,
    task: &TaskSpill,
    cancel: &Arc<AtomicBool>,
    hold: &dyn Fn(),
) -> Result<SortReport> {
    let plan = opts.plan;
    let input = &opts.input;
    let mut f = File::open(input).map_err(|e| SortError::io("open", input, e))?;
    let len = f
        .metadata()
        .map_err(|e| SortError::io("stat", input, e))?
        .len();
    if len % RECORD as u64 != 0 {
        return Err(SortError::BadInput {
            path: input.clone(),
            len,
        });
    }
    let mut report = SortReport {
        records: len / RECORD as u64,
        ..SortReport::default()
    };

    // Phase 1: runs. Read a run, sort its index, gather it into the engine's staging buffers.
    let t0 = Instant::now();
    let pb = bar(opts.progress, len, "runs");
    let mut buf = vec![0u8; plan.run_bytes];
    let mut index: Vec<(u64, u32)> = Vec::with_capacity(plan.run_bytes / RECORD);
    let mut states: Vec<SpilledState> = Vec::with_capacity(plan.runs);
    loop {
        if cancel.load(Ordering::Acquire) {
            return Err(SortError::Cancelled);
        }
        let n = read_full(&mut f, &mut buf).map_err(|e| SortError::io("read", input, e))?;
        if n == 0 {
            break;
        }
        if !n.is_multiple_of(RECORD) {
            // The file changed under the sort (its length was checked above).
            return Err(SortError::BadInput {
                path: input.clone(),
                len: report.spilled + n as u64,
            });
        }
        let (recs, _) = buf[..n].as_chunks::<RECORD>();
        index.clear();
        index.extend(recs.iter().enumerate().map(|(i, r)| (prefix(r), i as u32)));
        index.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| recs[a.1 as usize].cmp(&recs[b.1 as usize]))
        });
        let mut w = task.writer().map_err(|e| spill_err(cancel, e))?;
        let per_chunk = plan.chunk / RECORD;
        for part in index.chunks(per_chunk) {
            let mut slot = w
                .record(part.len() * RECORD)
                .map_err(|e| spill_err(cancel, e))?;
            for (dst, &(_, i)) in slot.chunks_exact_mut(RECORD).zip(part) {
                dst.copy_from_slice(&recs[i as usize]);
            }
            slot.commit().map_err(|e| spill_err(cancel, e))?;
        }
        report.segments += w.segments();
        states.push(w.finish().map_err(|e| spill_err(cancel, e))?);
        report.spilled += n as u64;
        pb.inc(n as u64);
    }
    drop((buf, index));
    pb.finish_and_clear();
    report.runs = states.len();
    report.run_phase = t0.elapsed();
    hold();
    if cancel.load(Ordering::Acquire) {
        return Err(SortError::Cancelled);
    }

    // Phase 2: the k-way merge, one reader per run, all open at once.
    let t1 = Instant::now();
    let pb = bar(opts.progress, len, "merge");
    let out = &opts.output;
    let file = File::create(out).map_err(|e| SortError::io("create", out, e))?;
    let mut w = BufWriter::with_capacity(4 << 20, file);
    let mut runs = Vec::with_capacity(states.len());
    for s in &states {
        let mut r = s.reader().map_err(|e| spill_err(cancel, e))?;
        if let Some(c) = next_chunk(&mut r, cancel)? {
            let key = prefix(&c);
            runs.push(Cursor {
                reader: r,
                chunk: c,
                off: 0,
                key,
            });
        }
    }
    let mut heap = Heap::new(runs.len());
    for i in 0..runs.len() {
        heap.push(i, &runs);
    }
    let mut written = 0u64;
    while let Some(i) = heap.top() {
        let c = &mut runs[i];
        w.write_all(&c.chunk[c.off..c.off + RECORD])
            .map_err(|e| SortError::io("write", out, e))?;
        written += RECORD as u64;
        c.off += RECORD;
        if c.off < c.chunk.len() {
            c.key = prefix(&c.chunk[c.off..]);
        } else {
            match next_chunk(&mut c.reader, cancel)? {
                Some(next) => {
                    c.key = prefix(&next);
                    c.chunk = next;
                    c.off = 0;
                }
                None => {
                    heap.pop(&runs);
                    pb.set_position(written);
                    continue;
                }
            }
            pb.set_position(written);
        }
        heap.sift_top(&runs);
    }
    w.flush().map_err(|e| SortError::io("write", out, e))?;
    pb.finish_and_clear();
    drop(runs);
    drop(states);
    report.merge_phase = t1.elapsed();
    Ok(report)
}

/// One run's position in the merge.
struct Cursor {
    reader: SpillReader,
    chunk: Bytes,
    off: usize,
    /// The head record's first 8 bytes ([`prefix`]): most comparisons end there.
    key: u64,
}

impl Cursor {
    fn head(&self) -> &[u8] {
        &self.chunk[self.off..self.off + RECORD]
    }
}

/// A record's first 8 bytes as a number that orders like the bytes.
fn prefix(r: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    k.copy_from_slice(&r[..8]);
    u64::from_be_bytes(k)
}

fn next_chunk(r: &mut SpillReader, cancel: &AtomicBool) -> Result<Option<Bytes>> {
    loop {
        match r.next_record() {
            Ok(Some(c)) if c.is_empty() => continue,
            Ok(Some(c)) if c.len() % RECORD != 0 => {
                return Err(SortError::BadRun { len: c.len() });
            }
            Ok(c) => return Ok(c),
            Err(e) => return Err(spill_err(cancel, e)),
        }
    }
}

/// A binary min-heap of run indices ordered by each run's head record (ties by run index).
struct Heap {
    v: Vec<usize>,
}

impl Heap {
    fn new(cap: usize) -> Self {
        Heap {
            v: Vec::with_capacity(cap),
        }
    }

    fn less(runs: &[Cursor], a: usize, b: usize) -> bool {
        let (x, y) = (&runs[a], &runs[b]);
        match x.key.cmp(&y.key) {
            std::cmp::Ordering::Equal => (x.head(), a) < (y.head(), b),
            o => o.is_lt(),
        }
    }

    fn top(&self) -> Option<usize> {
        self.v.first().copied()
    }

    fn push(&mut self, i: usize, runs: &[Cursor]) {
        self.v.push(i);
        let mut c = self.v.len() - 1;
        while c > 0 {
            let p = (c - 1) / 2;
            if Self::less(runs, self.v[c], self.v[p]) {
                self.v.swap(c, p);
                c = p;
            } else {
                break;
            }
        }
    }

    fn pop(&mut self, runs: &[Cursor]) {
        let Some(last) = self.v.pop() else {
            return;
        };
        if !self.v.is_empty() {
            self.v[0] = last;
            self.sift_top(runs);
        }
    }

    /// Restores the order after the top's head changed.
    fn sift_top(&mut self, runs: &[Cursor]) {
        let n = self.v.len();
        let mut p = 0;
        loop {
            let (l, r) = (2 * p + 1, 2 * p + 2);
            let mut m = p;
            if l < n && Self::less(runs, self.v[l], self.v[m]) {
                m = l;
            }
            if r < n && Self::less(runs, self.v[r], self.v[m]) {
                m = r;
            }
            if m == p {
                break;
            }
            self.v.swap(p, m);
            p = m;
        }
    }
}

/// Parses a size: bytes, or a number with a K, M or G suffix (powers of 1024).
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1usize << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size suffix in {s:?} (K, M or G)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("not a size: {s:?} (bytes, or a number with K, M or G)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_printable_lines() {
        let mut rng = SplitMix64::new(7);
        let mut r = [0u8; RECORD];
        for i in 0..1000 {
            gen_record(&mut rng, i, &mut r);
            assert!(r[..98].iter().all(|b| (b' '..=b'~').contains(b)), "{r:?}");
            assert_eq!(&r[98..], b"\r\n");
        }
    }

    #[test]
    fn plans_stay_in_budget() {
        for (len, budget) in [
            (256u64 << 20, 32usize << 20),
            (4 << 30, 256 << 20),
            (1 << 20, 256 << 10),
            (0, MIN_BUDGET),
        ] {
            let p = Plan::new(len, budget).expect("plan");
            assert!(p.run_bytes + p.run_bytes / RECORD * INDEX_ENTRY <= budget);
            assert!(p.runs as u64 * p.run_bytes as u64 >= len);
            assert_eq!(p.segment_size % 4096, 0);
            assert!(p.chunk.is_multiple_of(RECORD) && p.chunk + 4096 <= p.segment_size);
            assert!(
                p.chunk + 8 <= p.segment_size.min(1 << 20),
                "a chunk fits a staging buffer"
            );
            assert!(
                p.runs * p.segment_size <= budget / 2 || p.segment_size == MIN_SEGMENT,
                "{p:?}"
            );
        }
        assert!(matches!(
            Plan::new(1, MIN_BUDGET - 1),
            Err(SortError::BudgetTooSmall { .. })
        ));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("4g"), Ok(4 << 30));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
    }
}
