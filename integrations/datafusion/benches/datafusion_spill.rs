//! DataFusion's spilling queries with its default temp files against spillring (issue 23's
//! bench; `scripts/datafusion-bench.sh` runs it and writes `results/DATAFUSION.md`).
//!
//! Each measured run is a child process (so its peak RSS is its own): it loads the lineitem
//! table from an Arrow IPC file made once (`gen`), runs one query under a `FairSpillPool`, and
//! prints one JSON line. Both kinds of spill file go through the same timing wrapper
//! (`Timed`): the time inside their writers' `write`/`flush`/`finish`, and the time a reader
//! waited for each chunk of `read_stream` (from the poll that asked for it to the chunk).
//!
//! ```text
//! datafusion_spill gen  --data FILE --mib N
//! datafusion_spill run  --backend B --query Q --data FILE --root DIR --pool-mib P [--quota-mib Q]
//! datafusion_spill life --backend B --data FILE --root DIR --pool-mib P   (files left after a cancel and a kill)
//! datafusion_spill all  --data FILE --root DIR --mib N --pairs K --out JSON [--cgroup NAME]
//! ```
//! Backends: `default` (DataFusion's `NamedTempFile`s), `buffered`, `direct` (spillring),
//! `auto-quota` (spillring, direct mode, `Compression::Auto` under a quota of half the
//! default's logical spill), `df-lz4` (default files, DataFusion's own `spill_compression =
//! lz4_frame`), `lz4` (spillring `Lz4`), `lz4+df-lz4` (both).

#[path = "../tests/common/mod.rs"]
mod common;
use common::*;

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::error::Result;
use datafusion::execution::DiskManager;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::spill_file::{SpillFile, SpillWriter, TempFileFactory};
use futures::{Stream, StreamExt};
use serde::Serialize;
use spillring::{Compression, Engine, EngineConfig, FileKind, WriteMode};
use spillring_datafusion::SpillringFactory;

// ---------------------------------------------------------------------------------------------
// The timing wrapper, around either kind of spill file.

#[derive(Default)]
struct Times {
    write_ns: AtomicU64,
    read_ns: AtomicU64,
    written: AtomicU64,
}

struct Timed {
    inner: Arc<dyn TempFileFactory>,
    times: Arc<Times>,
}

struct TimedFile {
    inner: Arc<dyn SpillFile>,
    times: Arc<Times>,
}

struct TimedWriter {
    inner: Box<dyn SpillWriter>,
    times: Arc<Times>,
}

struct TimedStream {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>,
    times: Arc<Times>,
    asked: Option<Instant>,
}

impl TempFileFactory for Timed {
    fn create_temp_file(&self, description: &str) -> Result<Arc<dyn SpillFile>> {
        Ok(Arc::new(TimedFile {
            inner: self.inner.create_temp_file(description)?,
            times: self.times.clone(),
        }))
    }
}

impl SpillFile for TimedFile {
    fn path(&self) -> Option<&Path> {
        self.inner.path()
    }
    fn size(&self) -> Option<u64> {
        self.inner.size()
    }
    fn read_stream(&self) -> Result<Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>> {
        Ok(Box::pin(TimedStream {
            inner: self.inner.read_stream()?,
            times: self.times.clone(),
            asked: None,
        }))
    }
    fn open_writer(&self) -> Result<Box<dyn SpillWriter>> {
        Ok(Box::new(TimedWriter {
            inner: self.inner.open_writer()?,
            times: self.times.clone(),
        }))
    }
}

fn add_since(c: &AtomicU64, t: Instant) {
    c.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

impl std::io::Write for TimedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let t = Instant::now();
        let r = self.inner.write(buf);
        add_since(&self.times.write_ns, t);
        if let Ok(n) = &r {
            self.times.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let t = Instant::now();
        let r = self.inner.flush();
        add_since(&self.times.write_ns, t);
        r
    }
}

impl SpillWriter for TimedWriter {
    fn finish(&mut self) -> Result<()> {
        let t = Instant::now();
        let r = self.inner.finish();
        add_since(&self.times.write_ns, t);
        r
    }
}

impl Stream for TimedStream {
    type Item = Result<Bytes>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let asked = *self.asked.get_or_insert_with(Instant::now);
        let r = self.inner.as_mut().poll_next(cx);
        if r.is_ready() {
            add_since(&self.times.read_ns, asked);
            self.asked = None;
        }
        r
    }
}

/// DataFusion's default spill files (`NamedTempFile`s in a directory under `root`) as a
/// factory, so that the timing wrapper goes around them too.
struct DefaultFiles(Arc<DiskManager>);

impl TempFileFactory for DefaultFiles {
    fn create_temp_file(&self, description: &str) -> Result<Arc<dyn SpillFile>> {
        self.0.create_tmp_file(description)
    }
}

// ---------------------------------------------------------------------------------------------
// One run.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Default,
    Buffered,
    Direct,
    AutoQuota,
    DfLz4,
    Lz4,
    Lz4DfLz4,
}

impl Backend {
    fn parse(s: &str) -> Backend {
        match s {
            "default" => Backend::Default,
            "buffered" => Backend::Buffered,
            "direct" => Backend::Direct,
            "auto-quota" => Backend::AutoQuota,
            "df-lz4" => Backend::DfLz4,
            "lz4" => Backend::Lz4,
            "lz4+df-lz4" => Backend::Lz4DfLz4,
            other => panic!("unknown backend {other}"),
        }
    }
    fn name(self) -> &'static str {
        match self {
            Backend::Default => "default",
            Backend::Buffered => "buffered",
            Backend::Direct => "direct",
            Backend::AutoQuota => "auto-quota",
            Backend::DfLz4 => "df-lz4",
            Backend::Lz4 => "lz4",
            Backend::Lz4DfLz4 => "lz4+df-lz4",
        }
    }
    fn spillring(self) -> bool {
        !matches!(self, Backend::Default | Backend::DfLz4)
    }
    fn df_lz4(self) -> bool {
        matches!(self, Backend::DfLz4 | Backend::Lz4DfLz4)
    }
}

fn parse_query(s: &str) -> Query {
    match s {
        "order_by" => Query::OrderBy,
        "group_by" => Query::GroupBy,
        "repartition" => Query::Repartition,
        other => panic!("unknown query {other}"),
    }
}

#[derive(Debug, Serialize, serde::Deserialize, Clone, Default)]
struct RunOut {
    backend: String,
    query: String,
    ok: bool,
    error: Option<String>,
    wall_s: f64,
    write_s: f64,
    read_s: f64,
    spill_files: usize,
    /// DataFusion's `spilled_bytes`: the IPC stream's bytes (compressed IPC with `df-lz4`).
    spilled_bytes: usize,
    spilled_rows: usize,
    /// Bytes on disk: the engine's physical bytes, or the default's IPC bytes.
    physical_bytes: u64,
    rows: usize,
    hash: u64,
    peak_rss_kib: u64,
    /// Peaks of the anonymous and the file-backed part of the RSS, sampled every 5 ms
    /// (`RssAnon`, `RssFile`): a mapped spill segment's pages are file-backed page cache.
    peak_anon_kib: u64,
    peak_file_kib: u64,
    page_cache_misses: Option<u64>,
}

struct Args(Vec<String>);

impl Args {
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .position(|a| a == k)
            .and_then(|i| self.0.get(i + 1))
            .map(String::as_str)
    }
    fn req(&self, k: &str) -> &str {
        self.get(k).unwrap_or_else(|| panic!("missing {k}"))
    }
    fn num(&self, k: &str, default: u64) -> u64 {
        self.get(k)
            .map_or(default, |v| v.parse().expect("a number"))
    }
}

fn load(data: &Path, partitions: usize) -> Vec<Vec<RecordBatch>> {
    let f = std::fs::File::open(data).expect("open data");
    let r = FileReader::try_new(std::io::BufReader::new(f), None).expect("IPC file");
    let mut parts = vec![Vec::new(); partitions];
    for (i, b) in r.enumerate() {
        parts[i % partitions].push(b.expect("batch"));
    }
    parts
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|v| v.parse().unwrap_or(0)))
        })
        .unwrap_or(0)
}

fn status_kib(s: &str, key: &str) -> u64 {
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Samples `RssAnon` and `RssFile` every 5 ms until dropped; `peaks` reads the highs.
struct RssSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    peaks: Arc<(AtomicU64, AtomicU64)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let peaks = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let (s, p) = (stop.clone(), peaks.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(st) = std::fs::read_to_string("/proc/self/status") {
                    p.0.fetch_max(status_kib(&st, "RssAnon:"), Ordering::Relaxed);
                    p.1.fetch_max(status_kib(&st, "RssFile:"), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        RssSampler {
            stop,
            peaks,
            thread: Some(thread),
        }
    }

    fn peaks(mut self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.peaks.0.load(Ordering::Relaxed),
            self.peaks.1.load(Ordering::Relaxed),
        )
    }
}

/// Major page faults of this process (reads that went to the device through a map).
fn major_faults() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Field 12 (1-based), after the comm in parentheses.
    s.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(9))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The spill factory of `b` on `root` (with the engine, when it is spillring's).
fn factory(
    b: Backend,
    root: &Path,
    quota: Option<u64>,
) -> (Arc<dyn TempFileFactory>, Option<Engine>) {
    if !b.spillring() {
        // DataFusion's disk manager needs its directories to exist (the engine makes its root).
        std::fs::create_dir_all(root).expect("spill directory");
        let dm = DiskManagerBuilder::default()
            .with_mode(DiskManagerMode::Directories(vec![root.to_path_buf()]))
            .build()
            .expect("disk manager");
        return (Arc::new(DefaultFiles(Arc::new(dm))), None);
    }
    let mut cfg = SpillringFactory::config(root);
    cfg = match b {
        Backend::Buffered => cfg,
        Backend::Direct => cfg.mode(WriteMode::Direct),
        Backend::AutoQuota => cfg.mode(WriteMode::Direct).compression(Compression::Auto),
        Backend::Lz4 | Backend::Lz4DfLz4 => cfg.compression(Compression::Lz4),
        Backend::Default | Backend::DfLz4 => unreachable!("not spillring"),
    };
    if let Some(q) = quota {
        cfg = cfg.max_spill_bytes(q);
    }
    if let Some(mib) = std::env::var("SPILLRING_DF_SEGMENT_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        cfg = cfg.segment_size(mib << 20);
    }
    if std::env::var("SPILLRING_DF_NO_POOL").is_ok() {
        cfg = cfg.pool_max_segments(0);
    }
    let engine = Engine::open(cfg).expect("open engine");
    (
        Arc::new(SpillringFactory::new(engine.clone())),
        Some(engine),
    )
}

fn partitions(q: Query) -> usize {
    match q {
        // See tests/queries.rs: with two partitions DataFusion's own sort refuses some runs.
        Query::OrderBy => 1,
        _ => 2,
    }
}

fn session_for(
    b: Backend,
    parts: &[Vec<RecordBatch>],
    pool: usize,
    f: Arc<dyn TempFileFactory>,
    times: Arc<Times>,
) -> datafusion::prelude::SessionContext {
    let mut cfg = datafusion::prelude::SessionConfig::new();
    if b.df_lz4() {
        cfg = cfg.set_str("datafusion.execution.spill_compression", "lz4_frame");
    }
    session_with(
        parts,
        Some(pool),
        &Spills::Factory(Arc::new(Timed { inner: f, times })),
        cfg,
    )
    .expect("session")
}

fn run_one(a: &Args) -> RunOut {
    let b = Backend::parse(a.req("--backend"));
    let q = parse_query(a.req("--query"));
    let root = PathBuf::from(a.req("--root"));
    let pool = (a.num("--pool-mib", 256) as usize) << 20;
    let quota = a
        .get("--quota-mib")
        .map(|v| v.parse::<u64>().expect("mib") << 20);
    let parts = load(Path::new(a.req("--data")), partitions(q));
    let (f, engine) = factory(b, &root, quota);
    let times = Arc::new(Times::default());
    let ctx = session_for(b, &parts, pool, f, times.clone());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let faults0 = major_faults();
    let sampler = RssSampler::start();
    let t = Instant::now();
    let (r, plan) = rt.block_on(async {
        let plan = q.plan(&ctx).await.expect("plan");
        (run(q, &ctx, &plan).await, plan)
    });
    let wall = t.elapsed().as_secs_f64();
    let (peak_anon_kib, peak_file_kib) = sampler.peaks();
    let (spill_files, spilled_bytes, spilled_rows) = spill_metrics(&plan);
    let physical = match &engine {
        Some(e) => e.metrics().physical_bytes_written,
        None => times.written.load(Ordering::Relaxed),
    };
    let mut out = RunOut {
        backend: b.name().into(),
        query: q.name().into(),
        wall_s: wall,
        write_s: times.write_ns.load(Ordering::Relaxed) as f64 / 1e9,
        read_s: times.read_ns.load(Ordering::Relaxed) as f64 / 1e9,
        spill_files,
        spilled_bytes,
        spilled_rows,
        physical_bytes: physical,
        peak_rss_kib: vm_hwm_kib(),
        peak_anon_kib,
        peak_file_kib,
        page_cache_misses: Some(major_faults() - faults0),
        ..RunOut::default()
    };
    match r {
        Ok(o) => {
            out.ok = true;
            out.rows = o.rows;
            out.hash = o.hash;
        }
        Err(e) => out.error = Some(e.to_string().chars().take(300).collect()),
    }
    drop((plan, ctx));
    if let Some(e) = engine {
        e.settle(Duration::from_secs(30));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Files left after a cancel and after a kill.

#[derive(Debug, Serialize, serde::Deserialize, Clone, Default)]
struct LifeOut {
    backend: String,
    /// Files under the spill root once the cancelled query's stream is dropped (and, for
    /// spillring, the engine settled and its pool trimmed: pooled files are the engine's, for
    /// reuse).
    files_after_cancel: usize,
    /// Live files the engine still lists after the cancel (spillring).
    live_after_cancel: usize,
    /// Files under the root right after the child was killed.
    files_at_kill: usize,
    /// Files left once the next `Engine::open` on the root swept (spillring), or as the kill
    /// left them (default: nothing ever sweeps them).
    files_after_next_open: usize,
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(120), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn life(a: &Args) -> LifeOut {
    let b = Backend::parse(a.req("--backend"));
    let root = PathBuf::from(a.req("--root"));
    let data = PathBuf::from(a.req("--data"));
    let pool = (a.num("--pool-mib", 256) as usize) << 20;
    let parts = load(&data, 1);
    let mut out = LifeOut {
        backend: b.name().into(),
        ..LifeOut::default()
    };
    // Cancel: the ORDER BY's stream dropped while it spills.
    let croot = root.join("cancel");
    {
        let (f, engine) = factory(b, &croot, None);
        let times = Arc::new(Times::default());
        let ctx = session_for(b, &parts, pool, f, times.clone());
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(async {
            let mut s = Query::OrderBy
                .frame(&ctx)
                .await
                .expect("frame")
                .execute_stream()
                .await
                .expect("stream");
            let h = tokio::spawn(async move { while s.next().await.is_some() {} });
            let t2 = times.clone();
            tokio::task::spawn_blocking(move || {
                wait_for("spilling", || t2.written.load(Ordering::Relaxed) > 64 << 20)
            })
            .await
            .expect("wait");
            h.abort();
            let _ = h.await;
        });
        drop(ctx);
        if let Some(e) = &engine {
            e.settle(Duration::from_secs(30));
            out.live_after_cancel = e
                .list_files()
                .iter()
                .filter(|f| f.kind == FileKind::Live)
                .count();
            e.trim_pool();
            e.settle(Duration::from_secs(30));
        }
        out.files_after_cancel = files_under(&croot).len();
    }
    // Kill: a child spilling the ORDER BY, SIGKILLed mid-spill.
    let kroot = root.join("kill");
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .args(["kill-child", "--backend", b.name(), "--data"])
        .arg(&data)
        .arg("--root")
        .arg(&kroot)
        .args(["--pool-mib", &a.num("--pool-mib", 256).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    loop {
        let l = lines.next().expect("the child ended").expect("line");
        if l.trim() == "SPILLING" {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    child.kill().expect("kill");
    child.wait().expect("wait");
    out.files_at_kill = files_under(&kroot).len();
    if b.spillring() {
        let e = Engine::open(EngineConfig::new(&kroot)).expect("reopen");
        wait_for("the sweep", || files_under(&kroot).is_empty());
        e.settle(Duration::from_secs(30));
    }
    out.files_after_next_open = files_under(&kroot).len();
    out
}

fn kill_child(a: &Args) {
    let b = Backend::parse(a.req("--backend"));
    let root = PathBuf::from(a.req("--root"));
    let pool = (a.num("--pool-mib", 256) as usize) << 20;
    let parts = load(Path::new(a.req("--data")), 1);
    let (f, _engine) = factory(b, &root, None);
    let times = Arc::new(Times::default());
    let ctx = session_for(b, &parts, pool, f, times.clone());
    std::thread::spawn(move || {
        wait_for("spilling", || {
            times.written.load(Ordering::Relaxed) > 64 << 20
        });
        println!("SPILLING");
        let _ = std::io::stdout().flush();
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        loop {
            let plan = Query::OrderBy.plan(&ctx).await.expect("plan");
            let _ = run(Query::OrderBy, &ctx, &plan).await;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The driver: interleaved rounds of child runs.

#[derive(Debug, Serialize, serde::Deserialize)]
struct AllOut {
    mib: u64,
    pairs: u64,
    cgroup: Option<String>,
    cgroup_limit_bytes: Option<u64>,
    pools_mib: Vec<(String, u64)>,
    quota_mib: u64,
    runs: Vec<RunOut>,
    compression: Vec<RunOut>,
    life: Vec<LifeOut>,
}

fn pool_mib(q: Query, mib: u64) -> u64 {
    match q {
        // Half the input: the ORDER BY spills about its input; the others a fraction.
        Query::OrderBy => (mib / 2).max(16),
        Query::GroupBy | Query::Repartition => (mib / 12).max(8),
    }
}

/// Longest a child run may take (a 1 GiB ORDER BY takes seconds here).
const CHILD_TIMEOUT: Duration = Duration::from_secs(300);

/// The queries the bench times. The repartition (tests/queries.rs runs it at 96 MiB with an
/// 8 MiB pool) is left out: at 512 MiB with a 42 MiB pool it hung with DataFusion's own temp
/// files, every thread of the run parked (gdb), as it hung at a 1 MiB pool with either backend.
const BENCH_QUERIES: [Query; 2] = [Query::OrderBy, Query::GroupBy];

fn child(exe: &Path, cgroup: Option<&str>, args: &[String]) -> String {
    let mut cmd = match cgroup {
        // The shell joins the cgroup, then becomes the run: everything it maps is charged there.
        Some(cg) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "echo $$ > /sys/fs/cgroup/memory/{cg}/cgroup.procs && exec \"$0\" \"$@\""
                ))
                .arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // A run that takes longer than this is killed and fails the bench, naming the run (see
    // BENCH_QUERIES: DataFusion's repartition hung here with its own temp files).
    let mut ch = cmd
        .args(args)
        // stdout is one JSON line (small: the pipe never fills while we poll); stderr goes
        // to the bench's own.
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run child");
    let started = Instant::now();
    while ch.try_wait().expect("wait child").is_none() {
        if started.elapsed() > CHILD_TIMEOUT {
            let _ = ch.kill();
            let _ = ch.wait();
            panic!("child {args:?} still running after {CHILD_TIMEOUT:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = ch.wait_with_output().expect("child output");
    if !out.status.success() {
        panic!("child {args:?} failed: {}", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON from {args:?}"))
        .to_string()
}

fn all(a: &Args) {
    let exe = std::env::current_exe().expect("exe");
    let data = PathBuf::from(a.req("--data"));
    let root = PathBuf::from(a.req("--root"));
    let mib = a.num("--mib", 1024);
    let pairs = a.num("--pairs", 5);
    let cgroup = a.get("--cgroup").map(str::to_owned);
    if !data.exists() {
        generate(&data, mib);
    }
    let backends = [
        Backend::Default,
        Backend::Buffered,
        Backend::Direct,
        Backend::AutoQuota,
    ];
    // The quota of `auto-quota`: half of what the default spilled of the ORDER BY, found by a
    // first (unmeasured) default run.
    let probe = one(
        &exe,
        cgroup.as_deref(),
        Backend::Default,
        Query::OrderBy,
        &data,
        &root,
        mib,
        None,
    );
    let quota_mib = ((probe.spilled_bytes as u64 >> 20) / 2).max(64);
    eprintln!(
        "probe: default spilled {} B; quota {quota_mib} MiB",
        probe.spilled_bytes
    );
    let mut runs = Vec::new();
    for round in 0..pairs {
        for q in BENCH_QUERIES {
            let mut order = backends.to_vec();
            if round % 2 == 1 {
                order.reverse();
            }
            for b in order {
                let quota = (b == Backend::AutoQuota).then_some(quota_mib);
                let r = one(&exe, cgroup.as_deref(), b, q, &data, &root, mib, quota);
                eprintln!(
                    "round {round} {:>11} {:>11}: ok {} wall {:.2} s write {:.2} read {:.2} spilled {} MiB physical {} MiB rss {} MiB",
                    r.query,
                    r.backend,
                    r.ok,
                    r.wall_s,
                    r.write_s,
                    r.read_s,
                    r.spilled_bytes >> 20,
                    r.physical_bytes >> 20,
                    r.peak_rss_kib >> 10
                );
                runs.push(r);
            }
        }
    }
    // Whether DataFusion's own spill compression should stay on: the ORDER BY, 3 rounds.
    let mut compression = Vec::new();
    for round in 0..3 {
        for b in [
            Backend::DfLz4,
            Backend::Lz4,
            Backend::Lz4DfLz4,
            Backend::Default,
        ] {
            let _ = round;
            let r = one(
                &exe,
                cgroup.as_deref(),
                b,
                Query::OrderBy,
                &data,
                &root,
                mib,
                None,
            );
            eprintln!(
                "compression {:>11}: ok {} wall {:.2} s write {:.2} read {:.2} spilled {} MiB physical {} MiB",
                r.backend,
                r.ok,
                r.wall_s,
                r.write_s,
                r.read_s,
                r.spilled_bytes >> 20,
                r.physical_bytes >> 20
            );
            compression.push(r);
        }
    }
    let mut life_out = Vec::new();
    if cgroup.is_none() {
        for b in [Backend::Default, Backend::Buffered, Backend::Direct] {
            let dir = root.join(format!("life-{}", b.name()));
            let _ = std::fs::remove_dir_all(&dir);
            let args: Vec<String> = [
                "life",
                "--backend",
                b.name(),
                "--data",
                &data.to_string_lossy(),
                "--root",
                &dir.to_string_lossy(),
                "--pool-mib",
                &pool_mib(Query::OrderBy, mib).to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let l: LifeOut = serde_json::from_str(&child(&exe, None, &args)).expect("life json");
            eprintln!("life {:?}", l);
            let _ = std::fs::remove_dir_all(&dir);
            life_out.push(l);
        }
    }
    let limit = cgroup.as_ref().and_then(|cg| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/memory/{cg}/memory.limit_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    let out = AllOut {
        mib,
        pairs,
        cgroup,
        cgroup_limit_bytes: limit,
        pools_mib: BENCH_QUERIES
            .iter()
            .map(|q| (q.name().to_string(), pool_mib(*q, mib)))
            .collect(),
        quota_mib,
        runs,
        compression,
        life: life_out,
    };
    let path = PathBuf::from(a.req("--out"));
    std::fs::write(&path, serde_json::to_string_pretty(&out).expect("json")).expect("write out");
    eprintln!("wrote {}", path.display());
}

#[allow(clippy::too_many_arguments)]
fn one(
    exe: &Path,
    cgroup: Option<&str>,
    b: Backend,
    q: Query,
    data: &Path,
    root: &Path,
    mib: u64,
    quota_mib: Option<u64>,
) -> RunOut {
    let dir = root.join(format!("{}-{}", b.name(), q.name()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut args: Vec<String> = vec![
        "run".into(),
        "--backend".into(),
        b.name().into(),
        "--query".into(),
        q.name().into(),
        "--data".into(),
        data.to_string_lossy().into_owned(),
        "--root".into(),
        dir.to_string_lossy().into_owned(),
        "--pool-mib".into(),
        pool_mib(q, mib).to_string(),
    ];
    if let Some(m) = quota_mib {
        args.push("--quota-mib".into());
        args.push(m.to_string());
    }
    let r: RunOut = serde_json::from_str(&child(exe, cgroup, &args)).expect("run json");
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn generate(data: &Path, mib: u64) {
    let parts = lineitem_batches((mib as usize) << 20, 1);
    let f = std::fs::File::create(data).expect("create data");
    let mut w = FileWriter::try_new(std::io::BufWriter::new(f), &lineitem_schema()).expect("ipc");
    for b in &parts[0] {
        w.write(b).expect("write batch");
    }
    w.finish().expect("finish");
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let a = Args(args.clone());
    match args.first().map(String::as_str) {
        Some("gen") => generate(Path::new(a.req("--data")), a.num("--mib", 1024)),
        Some("run") => println!("{}", serde_json::to_string(&run_one(&a)).expect("json")),
        Some("life") => println!("{}", serde_json::to_string(&life(&a)).expect("json")),
        Some("kill-child") => kill_child(&a),
        Some("all") => all(&a),
        _ => eprintln!("usage: datafusion_spill gen|run|life|all ... (see the file's docs)"),
    }
}
