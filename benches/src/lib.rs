//! Shared helpers for the spillring benches: where results go, quick mode, a dhat allocator that
//! is only switched on around the measured region, CPU time from `getrusage`, aligned payloads,
//! and a recorder for the samples criterion takes.
//!
//! Every bench measures the engine through its public API (the same paths an embedding
//! executor uses) and a baseline in the same process, and writes its figures as JSON to
//! [`out_dir`]. `scripts/bench-report.sh` turns those files into `results/`.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use spillring::Engine;

/// KiB.
pub const KIB: usize = 1 << 10;
/// MiB.
pub const MIB: usize = 1 << 20;
/// GiB as a float, for per-GiB figures.
pub const GIB_F: f64 = (1u64 << 30) as f64;

/// True when `SPILLRING_BENCH_QUICK=1`: CI-sized runs that only prove the benches still work.
pub fn quick() -> bool {
    std::env::var("SPILLRING_BENCH_QUICK").is_ok_and(|v| v == "1" || v == "true")
}

/// True when the binary runs as a test (`cargo test --benches` / `--all-targets` run bench
/// targets without `--bench`): every bench then does a seconds-long smoke pass of its real
/// paths and writes no results.
pub fn test_mode() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// Writes `value` like [`write_json`], except in [`test_mode`], where it only says it ran.
pub fn write_results(name: &str, value: &serde_json::Value) -> io::Result<()> {
    if test_mode() {
        eprintln!("spillring-bench {name}: smoke pass ok (test mode, no results written)");
        return Ok(());
    }
    write_json(name, value).map(drop)
}

/// Where the benches write their JSON: `SPILLRING_BENCH_OUT`, else `spillring-bench/` in the
/// cargo target directory the bench executable was built in. Created if missing.
pub fn out_dir() -> io::Result<PathBuf> {
    let dir = match std::env::var_os("SPILLRING_BENCH_OUT") {
        Some(d) => PathBuf::from(d),
        None => {
            // The executable is <target>/release/deps/<name>-<hash>.
            let exe = std::env::current_exe().unwrap_or_default();
            exe.ancestors()
                .nth(3)
                .map(|t| t.join("spillring-bench"))
                .unwrap_or_else(|| PathBuf::from("target/spillring-bench"))
        }
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A fresh directory for spill files under `SPILLRING_BENCH_ROOT` (default: the system temp
/// directory). Removed when dropped.
pub fn scratch(tag: &str) -> io::Result<tempfile::TempDir> {
    let root = std::env::var_os("SPILLRING_BENCH_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root)?;
    tempfile::Builder::new()
        .prefix(&format!("spillring-bench-{tag}-"))
        .tempdir_in(root)
}

/// A fresh directory for benches that count memory rather than time the disk: under
/// `SPILLRING_BENCH_META_ROOT`, else `/dev/shm` when it is a writable tmpfs, else as
/// [`scratch`]. File creation on a churned ext4 (inode bitmap scans) would only slow them down.
pub fn scratch_meta(tag: &str) -> io::Result<tempfile::TempDir> {
    let root = std::env::var_os("SPILLRING_BENCH_META_ROOT")
        .map(PathBuf::from)
        .or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            tempfile::tempdir_in(&shm).ok().map(|_| shm)
        });
    match root {
        Some(root) => tempfile::Builder::new()
            .prefix(&format!("spillring-bench-{tag}-"))
            .tempdir_in(root),
        None => scratch(tag),
    }
}

/// Writes `value` as pretty JSON to `<out_dir>/<name>.json` and says where.
pub fn write_json(name: &str, value: &serde_json::Value) -> io::Result<PathBuf> {
    let path = out_dir()?.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    std::fs::write(&path, text + "\n")?;
    eprintln!("spillring-bench: wrote {}", path.display());
    Ok(path)
}

/// Median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Waits until every delete the engine was asked to do is confirmed (`pending_deletes() == 0`),
/// yielding between checks: fine-grained enough to time a cycle, unlike `Engine::settle`.
/// Panics after `timeout` (the bench would otherwise measure nothing meaningful).
pub fn wait_deletes(engine: &Engine, timeout: Duration) {
    let start = Instant::now();
    let mut spins = 0u32;
    while engine.pending_deletes() != 0 {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        if spins.is_multiple_of(4096) && start.elapsed() > timeout {
            panic!(
                "deletes still pending after {timeout:?}: {}",
                engine.pending_deletes()
            );
        }
    }
}

/// Polls `cond` every 200 µs until it holds; panics after `timeout` naming `what`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

// ---------------------------------------------------------------------------------------------
// CPU time

/// User + system CPU time of `who` (`libc::RUSAGE_SELF` or `libc::RUSAGE_THREAD`).
pub fn cpu_time(who: libc::c_int) -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointer, which points to a live, zeroed
    // `MaybeUninit<rusage>` of the right size.
    let r = unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
    assert_eq!(
        r,
        0,
        "getrusage failed: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: getrusage succeeded and filled the struct (and it was zeroed before anyway).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the whole process (every thread, including the engine's and io_uring's workers).
pub fn process_cpu() -> Duration {
    cpu_time(libc::RUSAGE_SELF)
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> Duration {
    cpu_time(libc::RUSAGE_THREAD)
}

// ---------------------------------------------------------------------------------------------
// Payloads

/// A 4096-byte aligned heap buffer (for `O_DIRECT` baselines and payloads).
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    const ALIGN: usize = 4096;

    /// `len` bytes (a non-zero multiple of 4096 or any size > 0), filled by `fill(i)`.
    pub fn new(len: usize, mut fill: impl FnMut(usize) -> u8) -> Self {
        assert!(len > 0, "empty AlignedBuf");
        let layout = Layout::from_size_align(len, Self::ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: the allocation is `len` bytes long and nothing else refers to it yet.
        let s = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
        for (i, b) in s.iter_mut().enumerate() {
            *b = fill(i);
        }
        AlignedBuf { ptr, len }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, Self::ALIGN).expect("valid layout");
        // SAFETY: allocated in `new` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// `count` distinct page-aligned payloads of `len` bytes (distinct so CRCs and page contents
/// differ), as `Bytes` that both the engine and the baselines can use without copying.
pub fn payloads(len: usize, count: usize) -> Vec<Bytes> {
    (0..count)
        .map(|k| {
            let buf = AlignedBuf::new(len, |i| {
                (i as u8).wrapping_mul(31) ^ (k as u8).wrapping_mul(97)
            });
            Bytes::from_owner(buf)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Heap profiling

static DHAT_ON: AtomicBool = AtomicBool::new(false);

/// The global allocator of every bench binary: the system allocator, except while a
/// [`HeapProfile`] is live, when every allocation (on every thread) goes through dhat. Timed
/// runs therefore pay nothing for the profiler; dhat ignores frees of blocks it never saw.
#[derive(Debug)]
pub struct GatedDhat;

// SAFETY: both branches forward to allocators that uphold the GlobalAlloc contract, and every
// block, whichever branch made it, is finally freed by `System` (dhat::Alloc frees with System
// too and only updates its tables for blocks it recorded).
unsafe impl GlobalAlloc for GatedDhat {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if DHAT_ON.load(Ordering::Relaxed) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { dhat::Alloc.alloc(layout) }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if DHAT_ON.load(Ordering::Relaxed) {
            // SAFETY: forwarded with the caller's guarantees; dhat frees with System.
            unsafe { dhat::Alloc.dealloc(ptr, layout) }
        } else {
            // SAFETY: forwarded with the caller's guarantees; every block came from System.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if DHAT_ON.load(Ordering::Relaxed) {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { dhat::Alloc.realloc(ptr, layout, new_size) }
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// A live dhat heap profile (needs [`GatedDhat`] as the global allocator). With a file name,
/// dropping it writes dhat's JSON (per allocation site) there.
pub struct HeapProfile {
    profiler: Option<dhat::Profiler>,
}

impl std::fmt::Debug for HeapProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeapProfile")
    }
}

impl HeapProfile {
    /// Starts profiling every thread's allocations; `save` names the JSON written at the end.
    pub fn start(save: Option<&Path>) -> Self {
        DHAT_ON.store(true, Ordering::SeqCst);
        let b = dhat::Profiler::builder().trim_backtraces(Some(24));
        let profiler = match save {
            Some(p) => b.file_name(p).build(),
            None => b.testing().build(),
        };
        HeapProfile {
            profiler: Some(profiler),
        }
    }

    /// dhat's counters now.
    pub fn stats(&self) -> dhat::HeapStats {
        dhat::HeapStats::get()
    }
}

impl Drop for HeapProfile {
    fn drop(&mut self) {
        drop(self.profiler.take());
        DHAT_ON.store(false, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------
// Criterion samples

/// The samples criterion measured, kept so the bench can write its figures as JSON. Criterion
/// calls a routine for its warm-up first and then once per sample, so the last `sample_size`
/// calls of an id are exactly its measurement.
#[derive(Debug, Default)]
pub struct Samples {
    by_id: Mutex<BTreeMap<String, Vec<(u64, Duration)>>>,
}

impl Samples {
    /// Records one routine call: `iters` iterations took `d`.
    pub fn record(&self, id: &str, iters: u64, d: Duration) {
        let mut m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id.to_owned()).or_default().push((iters, d));
    }

    /// Median nanoseconds per iteration over the last `last` calls of `id`.
    pub fn median_ns(&self, id: &str, last: usize) -> Option<f64> {
        let m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let v = m.get(id)?;
        let from = v.len().saturating_sub(last);
        let mut per: Vec<f64> = v[from..]
            .iter()
            .filter(|(i, _)| *i > 0)
            .map(|(i, d)| d.as_nanos() as f64 / *i as f64)
            .collect();
        (!per.is_empty()).then(|| median(&mut per))
    }

    /// Ids recorded so far.
    pub fn ids(&self) -> Vec<String> {
        let m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        m.keys().cloned().collect()
    }
}

/// A criterion configured for this machine kind (2 noisy cores): short warm-ups and
/// measurements, fewer in quick mode, CLI arguments (filters, `--bench`) honoured.
pub fn criterion(sample_size: usize, measure: Duration) -> criterion::Criterion {
    let (warm, measure) = if quick() {
        (
            Duration::from_millis(200),
            measure.mul_f64(0.2).max(Duration::from_millis(100)),
        )
    } else {
        (Duration::from_secs(1), measure)
    };
    criterion::Criterion::default()
        .sample_size(sample_size)
        .warm_up_time(warm)
        .measurement_time(measure)
        .without_plots()
        .configure_from_args()
}

/// Which profile loop a bench binary should run instead of its measurements
/// (`SPILLRING_BENCH_PROFILE`), and for how long (`SPILLRING_BENCH_PROFILE_SECS`, default 5).
/// `scripts/bench-report.sh` runs these under `perf record` when a goal is missed.
pub fn profile_request() -> Option<(String, Duration)> {
    let what = std::env::var("SPILLRING_BENCH_PROFILE").ok()?;
    let secs = std::env::var("SPILLRING_BENCH_PROFILE_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(5.0);
    Some((what, Duration::from_secs_f64(secs)))
}

/// One-line description of the engine build a result came from.
pub fn engine_info(engine: &Engine) -> serde_json::Value {
    let m = engine.metrics();
    serde_json::json!({ "backend": m.backend, "write_mode": m.write_mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn samples_keep_the_last_calls_only() {
        let s = Samples::default();
        // Warm-up calls first, then the measurement: only the last two count here.
        s.record("x", 1, Duration::from_nanos(1_000));
        s.record("x", 10, Duration::from_nanos(100));
        s.record("x", 10, Duration::from_nanos(300));
        assert_eq!(s.median_ns("x", 2), Some(20.0));
        assert_eq!(s.median_ns("y", 2), None);
        assert_eq!(s.ids(), vec!["x".to_owned()]);
    }

    #[test]
    fn aligned_payloads_are_aligned_and_distinct() {
        let p = payloads(8192, 3);
        assert!(
            p.iter()
                .all(|b| b.len() == 8192 && (b.as_ptr() as usize).is_multiple_of(4096))
        );
        assert_ne!(p[0], p[1]);
    }

    #[test]
    fn cpu_time_moves_forward() {
        let a = thread_cpu();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu() >= a);
        assert!(process_cpu() >= thread_cpu());
    }
}
