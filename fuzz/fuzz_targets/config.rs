//! `EngineConfig`: arbitrary field values through the builder, then `validate()`.
//!
//! Properties:
//! 1. `validate()` never panics, and accepts exactly the configurations the setters' docs
//!    allow (an independent model of the documented bounds below); a refusal is
//!    `InvalidConfig`.
//! 2. For an accepted, small configuration: `Engine::open` (psync backend, on a fresh temp
//!    dir) never panics; it succeeds unless a root cannot be a directory (a regular file, a
//!    path under one, a dangling symlink), and then fails with a typed error. After the engine
//!    is dropped (or the open failed): no file is left under the temp dir (only what the
//!    harness made itself), after a successful open no process directory either, after a
//!    failed one at most empty process directories; the process is back to the threads and
//!    file descriptors it had before.
#![no_main]

#[path = "common/sweep.rs"]
mod sweep;
use sweep::sweep_stale;

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spillring::{BackendKind, Engine, EngineConfig, PROC_PREFIX, SpillError, WriteMode};

/// A byte size.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Size {
    Default,
    Raw(u64),
    /// This many 4 KiB pages.
    Pages(u16),
    /// 2^n (n mod 64).
    Pow2(u8),
}

impl Size {
    fn get(self) -> Option<u64> {
        match self {
            Size::Default => None,
            Size::Raw(v) => Some(v),
            Size::Pages(p) => Some(u64::from(p) * 4096),
            Size::Pow2(e) => Some(1u64 << (e % 64)),
        }
    }
}

/// A count.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Count {
    Default,
    Raw(u64),
    Small(u8),
    /// 2^n (n mod 64).
    Pow2(u8),
}

impl Count {
    fn get(self) -> Option<u64> {
        match self {
            Count::Default => None,
            Count::Raw(v) => Some(v),
            Count::Small(v) => Some(u64::from(v)),
            Count::Pow2(e) => Some(1u64 << (e % 64)),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Dur {
    Default,
    Nanos(u64),
    Millis(u32),
    Secs(u32),
}

impl Dur {
    fn get(self) -> Option<Duration> {
        match self {
            Dur::Default => None,
            Dur::Nanos(n) => Some(Duration::from_nanos(n)),
            Dur::Millis(n) => Some(Duration::from_millis(u64::from(n))),
            Dur::Secs(n) => Some(Duration::from_secs(u64::from(n))),
        }
    }
}

/// A spill root, relative to the case's temp dir (`n` is taken mod 8).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Root {
    /// `rN`.
    Dir(u8),
    /// `rN/` (the same root as `rN` to `Path` equality).
    Trailing(u8),
    /// `rN/../rN`: the same directory as `rN`, a different path.
    Alias(u8),
    /// `rN/deep/er`, made by the open.
    Nested(u8),
    /// `lN`, a symlink to `tN`, an existing directory.
    Symlink(u8),
    /// The empty path.
    Empty,
    /// `file`, a regular file: cannot be a root.
    File,
    /// `file/sub`: under a regular file.
    UnderFile,
    /// `dangling`, a symlink to nothing.
    Dangling,
}

impl Root {
    /// The path, creating what the spec needs; false if it can never be a root directory.
    fn make(self, tmp: &Path) -> (PathBuf, bool) {
        let n = |v: u8| v % 8;
        match self {
            Root::Dir(v) => (tmp.join(format!("r{}", n(v))), true),
            Root::Trailing(v) => (tmp.join(format!("r{}/", n(v))), true),
            Root::Alias(v) => (tmp.join(format!("r{0}/../r{0}", n(v))), true),
            Root::Nested(v) => (tmp.join(format!("r{}/deep/er", n(v))), true),
            Root::Symlink(v) => {
                let target = tmp.join(format!("t{}", n(v)));
                let link = tmp.join(format!("l{}", n(v)));
                let _ = std::fs::create_dir(&target);
                let _ = std::os::unix::fs::symlink(&target, &link);
                (link, true)
            }
            Root::Empty => (PathBuf::new(), true),
            Root::File => {
                let f = tmp.join("file");
                std::fs::write(&f, b"not a directory").expect("write file");
                (f, false)
            }
            Root::UnderFile => {
                let f = tmp.join("file");
                std::fs::write(&f, b"not a directory").expect("write file");
                (f.join("sub"), false)
            }
            Root::Dangling => {
                let link = tmp.join("dangling");
                let _ = std::os::unix::fs::symlink(tmp.join("nowhere"), &link);
                (link, false)
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Case {
    first_root: Root,
    extra_roots: Vec<Root>,
    /// Adds this many more distinct roots (mod 80): past 64 is too many.
    many_roots: u8,
    segment_size: Size,
    ticket_capacity: Count,
    max_spill_bytes: Size,
    direct: bool,
    backend: u8,
    ring_threads: Count,
    ring_entries: Count,
    io_buffer_size: Size,
    queue_depth: Count,
    registered_buffers: Count,
    large_record_threshold: Size,
    /// `compression`: variant (mod 4: None, Lz4, Zstd, Auto) and zstd level.
    compression: (u8, i8),
    encryption: bool,
    preallocate: bool,
    cleanup_retry_delay: Dur,
    orphan_rescan: Dur,
    cleanup_batch: Count,
    root_skip: Dur,
    shutdown_budget: Dur,
    pool_max_segments: Count,
    pool_max_bytes: Size,
    read_buffer_max: Size,
    max_open_files: Count,
    max_buffer_memory: Size,
}

/// The configuration as the harness sees it (defaults filled in, per the setters' docs).
#[derive(Debug)]
struct Model {
    roots: Vec<PathBuf>,
    segment_size: u64,
    ticket_capacity: u64,
    max_spill_bytes: Option<u64>,
    ring_threads: u64,
    ring_entries: u64,
    io_buffer_size: u64,
    queue_depth: u64,
    registered_buffers: u64,
    large_record_threshold: u64,
    /// The zstd level when the codec is zstd.
    zstd_level: Option<i32>,
    /// Either value is valid (no bound to check): kept for the failing case's Debug print.
    #[allow(dead_code)]
    encryption: bool,
    cleanup_retry_delay: Duration,
    orphan_rescan: Duration,
    cleanup_batch: u64,
    root_skip: Duration,
    shutdown_budget: Duration,
    pool_max_segments: u64,
    read_buffer_max: u64,
    max_open_files: u64,
    max_buffer_memory: u64,
}

impl Model {
    /// What the docs of `EngineConfig`'s setters allow.
    fn documented_ok(&self) -> Result<(), &'static str> {
        let hour = Duration::from_secs(3600);
        if self.roots.is_empty() || self.roots.len() > 64 {
            return Err("roots");
        }
        for (i, r) in self.roots.iter().enumerate() {
            if r.as_os_str().is_empty() || self.roots[..i].contains(r) {
                return Err("roots");
            }
        }
        let s = self.segment_size;
        if !(64 << 10..=1 << 40).contains(&s) || !s.is_multiple_of(4096) {
            return Err("segment_size");
        }
        if !(1..=16_777_216).contains(&self.ticket_capacity) {
            return Err("ticket_capacity");
        }
        if self.max_spill_bytes.is_some_and(|q| q < s) {
            return Err("max_spill_bytes");
        }
        if !(1..=64).contains(&self.ring_threads) {
            return Err("ring_threads");
        }
        if !(8..=32_768).contains(&self.ring_entries) || !self.ring_entries.is_power_of_two() {
            return Err("ring_entries");
        }
        let b = self.io_buffer_size;
        if !(4096..=64 << 20).contains(&b) || !b.is_multiple_of(4096) || b > s {
            return Err("io_buffer_size");
        }
        if !(1..=1024).contains(&self.queue_depth) {
            return Err("queue_depth");
        }
        if self.registered_buffers > 16_384 {
            return Err("registered_buffers");
        }
        if self.zstd_level.is_some_and(|l| !(-7..=22).contains(&l)) {
            return Err("compression");
        }
        if !(1..=u64::from(u32::MAX)).contains(&self.large_record_threshold) {
            return Err("large_record_threshold");
        }
        let d = self.cleanup_retry_delay;
        if d < Duration::from_millis(1) || d > hour {
            return Err("cleanup_retry_delay");
        }
        let r = self.orphan_rescan;
        if r < Duration::from_millis(1) || r > 24 * hour {
            return Err("orphan_rescan");
        }
        if !(1..=65_536).contains(&self.cleanup_batch) {
            return Err("cleanup_batch");
        }
        if self.root_skip > hour {
            return Err("root_skip");
        }
        if self.shutdown_budget > hour {
            return Err("shutdown_budget");
        }
        // `pool_max_bytes`: any value is valid.
        if self.pool_max_segments > 65_536 {
            return Err("pool_max_segments");
        }
        if self.read_buffer_max > 64 << 20 {
            return Err("read_buffer_max");
        }
        if !(1..=1 << 20).contains(&self.max_open_files) {
            return Err("max_open_files");
        }
        if !(self.io_buffer_size..=1 << 40).contains(&self.max_buffer_memory) {
            return Err("max_buffer_memory");
        }
        Ok(())
    }

    /// Small enough to open in a few milliseconds.
    fn small(&self) -> bool {
        self.roots.len() <= 4
            && self.ring_threads <= 4
            && self.ring_entries <= 1024
            && self.io_buffer_size <= 1 << 20
            && self.registered_buffers <= 64
    }
}

/// What the run exercised, printed at exit.
static CASES: AtomicU64 = AtomicU64::new(0);
static VALID: AtomicU64 = AtomicU64::new(0);
static OPENED: AtomicU64 = AtomicU64::new(0);
static OPEN_FAILED: AtomicU64 = AtomicU64::new(0);
static DIRECT_OPENED: AtomicU64 = AtomicU64::new(0);
/// Failed opens that left an (empty) process directory behind.
static LEFT_PROC_DIR: AtomicU64 = AtomicU64::new(0);
static STATS: Once = Once::new();

extern "C" fn print_stats() {
    eprintln!(
        "config stats: cases {}, validate Ok {}, opened {} (direct {}), open failed {} \
         (of which left an empty process directory: {})",
        CASES.load(Relaxed),
        VALID.load(Relaxed),
        OPENED.load(Relaxed),
        DIRECT_OPENED.load(Relaxed),
        OPEN_FAILED.load(Relaxed),
        LEFT_PROC_DIR.load(Relaxed)
    );
}

/// Temp dirs of this target: `<prefix><pid>-<random>`.
const CONFIG_PREFIX: &str = "spillring-fuzz-config-";

/// `usize` from a fuzzed u64 (a 64-bit target).
fn us(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fuzz_target!(|case: Case| {
    STATS.call_once(|| {
        sweep_stale(CONFIG_PREFIX);
        // SAFETY: registers a plain extern "C" function with no arguments, once.
        unsafe { libc::atexit(print_stats) };
    });
    CASES.fetch_add(1, Relaxed);
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{CONFIG_PREFIX}{}-", std::process::id()))
        .tempdir()
        .expect("tempdir");
    let tmp_path = tmp.path().to_path_buf();

    let mut can_be_dirs = true;
    let mut roots = Vec::new();
    for r in std::iter::once(case.first_root).chain(case.extra_roots.iter().copied().take(8)) {
        let (p, ok) = r.make(&tmp_path);
        can_be_dirs &= ok;
        roots.push(p);
    }
    for i in 0..case.many_roots % 80 {
        roots.push(tmp_path.join(format!("m{i}")));
    }

    // Derived defaults, as documented: an unset segment size follows a smaller quota (rounded
    // down to 4 KiB, at least 64 KiB); an unset staging buffer follows a smaller segment.
    let segment_size = case.segment_size.get().unwrap_or_else(|| {
        case.max_spill_bytes
            .get()
            .map_or(64 << 20, |q| (64u64 << 20).min(q - q % 4096).max(64 << 10))
    });
    let model = Model {
        roots: roots.clone(),
        segment_size,
        ticket_capacity: case.ticket_capacity.get().unwrap_or(65_536),
        max_spill_bytes: case.max_spill_bytes.get(),
        ring_threads: case.ring_threads.get().unwrap_or(1),
        // The setter takes a u32: the model sees what the engine gets.
        ring_entries: case.ring_entries.get().map_or(256, |v| u64::from(v as u32)),
        io_buffer_size: case
            .io_buffer_size
            .get()
            .unwrap_or_else(|| segment_size.min(1 << 20)),
        queue_depth: case.queue_depth.get().unwrap_or(8),
        registered_buffers: case.registered_buffers.get().unwrap_or(64),
        large_record_threshold: case.large_record_threshold.get().unwrap_or(256 << 10),
        zstd_level: (case.compression.0 % 4 == 2).then_some(i32::from(case.compression.1)),
        encryption: case.encryption,
        cleanup_retry_delay: case
            .cleanup_retry_delay
            .get()
            .unwrap_or(Duration::from_secs(1)),
        orphan_rescan: case.orphan_rescan.get().unwrap_or(Duration::from_secs(60)),
        cleanup_batch: case.cleanup_batch.get().unwrap_or(1000),
        root_skip: case.root_skip.get().unwrap_or(Duration::from_secs(30)),
        shutdown_budget: case.shutdown_budget.get().unwrap_or(Duration::from_secs(5)),
        pool_max_segments: case.pool_max_segments.get().unwrap_or(256),
        read_buffer_max: case.read_buffer_max.get().unwrap_or(256 << 10),
        max_open_files: case.max_open_files.get().unwrap_or(1024),
        max_buffer_memory: case.max_buffer_memory.get().unwrap_or(128 << 20),
    };

    // Through the builder, setting only what the case sets (defaults stay the builder's own).
    let mut cfg = EngineConfig::new(&roots[0]);
    for r in &roots[1..] {
        cfg = cfg.add_root(r);
    }
    if let Some(v) = case.segment_size.get() {
        cfg = cfg.segment_size(v);
    }
    if let Some(v) = case.ticket_capacity.get() {
        cfg = cfg.ticket_capacity(us(v));
    }
    if let Some(v) = case.max_spill_bytes.get() {
        cfg = cfg.max_spill_bytes(v);
    }
    cfg = cfg.mode(if case.direct {
        WriteMode::Direct
    } else {
        WriteMode::Buffered
    });
    cfg = cfg.backend(match case.backend % 3 {
        0 => BackendKind::Auto,
        1 => BackendKind::Uring,
        _ => BackendKind::Psync,
    });
    if let Some(v) = case.ring_threads.get() {
        cfg = cfg.ring_threads(us(v));
    }
    if let Some(v) = case.ring_entries.get() {
        cfg = cfg.ring_entries(v as u32);
    }
    if let Some(v) = case.io_buffer_size.get() {
        cfg = cfg.io_buffer_size(v);
    }
    if let Some(v) = case.queue_depth.get() {
        cfg = cfg.queue_depth(us(v));
    }
    if let Some(v) = case.registered_buffers.get() {
        cfg = cfg.registered_buffers(us(v));
    }
    if let Some(v) = case.large_record_threshold.get() {
        cfg = cfg.large_record_threshold(v);
    }
    cfg = cfg.compression(match case.compression.0 % 4 {
        0 => spillring::Compression::None,
        1 => spillring::Compression::Lz4,
        2 => spillring::Compression::Zstd {
            level: i32::from(case.compression.1),
        },
        _ => spillring::Compression::Auto,
    });
    cfg = cfg.encryption(case.encryption);
    cfg = cfg.preallocate(case.preallocate);
    if let Some(v) = case.cleanup_retry_delay.get() {
        cfg = cfg.cleanup_retry_delay(v);
    }
    if let Some(v) = case.orphan_rescan.get() {
        cfg = cfg.orphan_rescan(v);
    }
    if let Some(v) = case.cleanup_batch.get() {
        cfg = cfg.cleanup_batch(us(v));
    }
    if let Some(v) = case.root_skip.get() {
        cfg = cfg.root_skip(v);
    }
    if let Some(v) = case.shutdown_budget.get() {
        cfg = cfg.shutdown_budget(v);
    }
    if let Some(v) = case.pool_max_segments.get() {
        cfg = cfg.pool_max_segments(us(v));
    }
    if let Some(v) = case.pool_max_bytes.get() {
        cfg = cfg.pool_max_bytes(v);
    }
    if let Some(v) = case.read_buffer_max.get() {
        cfg = cfg.read_buffer_max(v);
    }
    if let Some(v) = case.max_open_files.get() {
        cfg = cfg.max_open_files(us(v));
    }
    if let Some(v) = case.max_buffer_memory.get() {
        cfg = cfg.max_buffer_memory(v);
    }
    let verdict = cfg.validate();
    let expected = model.documented_ok();
    match (&verdict, expected) {
        (Ok(()), Ok(())) => {}
        (Err(SpillError::InvalidConfig { .. }), Err(_)) => {}
        (v, e) => panic!("validate() = {v:?}, the documented bounds say {e:?}; {model:?}"),
    }
    if verdict.is_err() {
        return;
    }
    VALID.fetch_add(1, Relaxed);
    if !model.small() {
        return;
    }

    // Property 2: open and drop.
    let threads0 = count_entries("/proc/self/task");
    let fds0 = count_entries("/proc/self/fd");
    let t = Instant::now();
    let opened = Engine::open(cfg.backend(BackendKind::Psync));
    match &opened {
        Ok(e) => {
            assert!(
                can_be_dirs,
                "open succeeded with a root that is not a directory"
            );
            for pd in e.process_dirs() {
                assert!(pd.is_dir(), "process directory {} missing", pd.display());
            }
        }
        Err(err) => {
            assert!(
                !can_be_dirs,
                "open failed although every root can be a directory: {err}; {model:?}"
            );
            assert!(
                matches!(
                    err,
                    SpillError::Io { .. }
                        | SpillError::InvalidConfig { .. }
                        | SpillError::RootNotADirectory { .. }
                ),
                "unexpected error kind: {err:?}"
            );
        }
    }
    let ok = opened.is_ok();
    let opened_err = opened.as_ref().err().map(|e| e.to_string());
    if ok {
        OPENED.fetch_add(1, Relaxed);
        if case.direct {
            DIRECT_OPENED.fetch_add(1, Relaxed);
        }
    } else {
        OPEN_FAILED.fetch_add(1, Relaxed);
    }
    drop(opened);
    let open_and_drop = t.elapsed();

    // Nothing left but what the harness made and (after a failed open) empty process dirs.
    for (path, is_dir) in entries_under(&tmp_path) {
        let rel = path.strip_prefix(&tmp_path).expect("under tmp");
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with(PROC_PREFIX) && is_dir {
            assert!(
                !ok,
                "process directory {} left after the engine was dropped",
                rel.display()
            );
            let inside = std::fs::read_dir(&path).map(|d| d.count()).unwrap_or(0);
            assert_eq!(inside, 0, "failed open left a non-empty {}", rel.display());
            // A finding of this target, fixed (fuzz/regressions/config/README.md): a failed
            // open removes the process directories it made.
            panic!(
                "failed open ({}) left its process directory {}",
                opened_err.as_deref().unwrap_or("?"),
                rel.display()
            );
        }
        let made_by_harness = is_dir
            || (rel.components().count() == 1
                && (name == "file" || name == "dangling" || is_link_name(&name)));
        assert!(
            made_by_harness,
            "left under the temp dir: {} (dir: {is_dir})",
            rel.display()
        );
    }

    // Threads and fds back to where they were (threads may take a moment to exit).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let threads = count_entries("/proc/self/task");
        let fds = count_entries("/proc/self/fd");
        if threads <= threads0 && fds <= fds0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after open+drop (ok={ok}): threads {threads0} -> {threads}, fds {fds0} -> {fds}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        open_and_drop < Duration::from_secs(2),
        "open+drop took {open_and_drop:?}; {model:?}"
    );
});

/// `l0` to `l7`: the harness's symlinks.
fn is_link_name(name: &str) -> bool {
    name.len() == 2 && name.starts_with('l') && name.as_bytes()[1].is_ascii_digit()
}

fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Every entry under `root` (not following symlinks), with whether it is a directory.
fn entries_under(root: &Path) -> Vec<(PathBuf, bool)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                stack.push(e.path());
            }
            out.push((e.path(), is_dir));
        }
    }
    out
}
