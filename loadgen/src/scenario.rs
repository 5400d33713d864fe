//! One op: a task's whole spill life (writer, finish, read-back, publish, close), or the same
//! life cancelled at one of the abort points. The same code runs on plain threads (blocking
//! calls, driven by a tiny `block_on`) and as async tasks on the tokio runtime (`write_async`,
//! `finish_async`); [`Flavor`] picks the calls.
//!
//! Every engine result is judged by [`verdict`]: with no cancel issued, only admission
//! refusals, a full device and (with faults on) an I/O error carrying the errno loadgen injects
//! ([`crate::run::INJECTED_ERRNO`], which real storage never returns) are acceptable; after a
//! cancel, only `Aborted` (or an injected fault that won the race). Anything else, a bare
//! `NotFound` after a cancel above all, is a violation, printed with the op and the stage.

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use spillring::{
    Engine, FaultPlan, FaultPoint, SpillError, SpillReader, SpillWriter, SpilledState, TaskSpill,
};

use crate::args::AbortPoint;
use crate::check::{self, FileId};
use crate::data::{Expect, Pool, Rng, op_seed, record_len};
use crate::progress::Out;
use crate::stats::{Counters, Hists, Stats, Violation, record};
use crate::watch::WatchTx;

/// How a worker calls the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// A plain thread: `write`, `finish`, blocking waits.
    Thread,
    /// An async task on the multi-thread tokio runtime: `write_async`, `finish_async`.
    Async,
}

/// What a worker is doing, for the stall report.
#[derive(Debug, Default)]
pub struct Slot {
    pub op: AtomicU64,
    phase: AtomicU8,
}

impl Slot {
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    /// The phase last set (`None` for a value no phase has, which cannot happen).
    pub fn phase(&self) -> Option<Phase> {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }
}

/// A worker's phase, as the stall report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Idle,
    Writing,
    Finishing,
    Reading,
    Publishing,
    Cancelling,
    WaitingForControl,
    Closing,
    Done,
}

impl Phase {
    /// Every phase, in the order of their values.
    pub const ALL: [Phase; 9] = [
        Phase::Idle,
        Phase::Writing,
        Phase::Finishing,
        Phase::Reading,
        Phase::Publishing,
        Phase::Cancelling,
        Phase::WaitingForControl,
        Phase::Closing,
        Phase::Done,
    ];

    /// The name printed in the stall report.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Writing => "writing",
            Phase::Finishing => "finishing",
            Phase::Reading => "reading",
            Phase::Publishing => "publishing",
            Phase::Cancelling => "cancelling",
            Phase::WaitingForControl => "waiting for control",
            Phase::Closing => "closing",
            Phase::Done => "done",
        }
    }

    fn from_u8(v: u8) -> Option<Phase> {
        Phase::ALL.get(usize::from(v)).copied()
    }
}

/// A published file loadgen now owns.
#[derive(Debug)]
pub struct Published {
    pub op: u64,
    pub path: PathBuf,
    pub id: FileId,
}

/// What the workers share.
#[derive(Debug)]
pub struct Ctx {
    pub engine: Engine,
    pub seed: u64,
    pub points: Vec<AbortPoint>,
    pub abort_rate: f64,
    pub faults: bool,
    pub read_rate: f64,
    pub publish_rate: f64,
    pub max_task_bytes: u64,
    pub max_record: u64,
    pub segment_size: u64,
    pub io_buffer_size: u64,
    pub pool: Pool,
    pub stats: Stats,
    pub out: Out,
    pub watch: WatchTx,
    pub published_dir: PathBuf,
    pub published: Mutex<Vec<Published>>,
    /// Records read before a cancel and kept (zero-copy, into maps of deleted files) until
    /// after the engine is dropped.
    pub survivors: Mutex<Vec<(u64, Bytes, Expect)>>,
    pub stop: AtomicBool,
    pub next_op: AtomicU64,
    pub ops_limit: Option<u64>,
    pub deadline: Option<Instant>,
    pub slots: Vec<Slot>,
}

/// Records kept past the engine's life.
const SURVIVORS: usize = 16;

/// Published files kept before loadgen checks and deletes the older ones (bounds the disk).
const PUBLISHED_KEEP: usize = 64;

impl Ctx {
    pub fn violation(&self, kind: &'static str, what: String, at: String, op: Option<u64>) {
        self.stats
            .violation(&self.out, Violation { kind, what, at, op });
    }

    /// Checks that the published files (all, or all but the newest `keep`) are still the files
    /// published, then deletes them: loadgen owns them.
    pub fn trim_published(&self, keep: usize) {
        let old: Vec<Published> = {
            let mut p = self.published.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() <= keep {
                return;
            }
            let n = p.len() - keep;
            p.drain(..n).collect()
        };
        for f in old {
            match check::file_id(&f.path) {
                Ok(id) if id == f.id => {}
                Ok(id) => self.violation(
                    "published",
                    format!("published file changed: was {:?}, now {id:?}", f.id),
                    f.path.display().to_string(),
                    Some(f.op),
                ),
                Err(e) => self.violation(
                    "published",
                    format!("published file deleted or unreadable: {e}"),
                    f.path.display().to_string(),
                    Some(f.op),
                ),
            }
            match std::fs::remove_file(&f.path) {
                Ok(()) => Counters::add(&self.stats.c.published_deleted_by_loadgen, 1),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => self.out.line(&format!(
                    "loadgen: could not delete published file {}: {e}",
                    f.path.display()
                )),
            }
        }
    }

    fn done(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// A worker's own state: its latency histograms and records kept past their spill's abort.
#[derive(Debug)]
pub struct Worker {
    pub wid: usize,
    pub flavor: Flavor,
    pub hists: Hists,
    /// Records read before a cancel, kept (zero-copy, pointing into a map of a file since
    /// deleted) and checked again at the next op.
    kept: Vec<(u64, Bytes, Expect)>,
}

/// Runs ops until the run ends; returns the worker's histograms.
pub async fn worker(ctx: Arc<Ctx>, wid: usize, flavor: Flavor) -> Hists {
    let mut wk = Worker {
        wid,
        flavor,
        hists: Hists::default(),
        kept: Vec::new(),
    };
    loop {
        if ctx.done() {
            break;
        }
        let idx = ctx.next_op.fetch_add(1, Ordering::Relaxed);
        if ctx.ops_limit.is_some_and(|n| idx >= n) {
            break;
        }
        let slot = &ctx.slots[wid];
        slot.op.store(idx, Ordering::Relaxed);
        Counters::add(&ctx.stats.c.ops_started, 1);
        Counters::add(
            match flavor {
                Flavor::Thread => &ctx.stats.c.ops_thread,
                Flavor::Async => &ctx.stats.c.ops_async,
            },
            1,
        );
        if let Some(mut op) = Op::new(&ctx, &mut wk, idx) {
            op.run().await;
        }
        slot.set_phase(Phase::Idle);
        Counters::add(&ctx.stats.c.ops_done, 1);
        check_kept(&ctx, &mut wk);
    }
    check_kept(&ctx, &mut wk);
    ctx.slots[wid].set_phase(Phase::Done);
    wk.hists
}

fn check_kept(ctx: &Ctx, wk: &mut Worker) {
    for (op, b, e) in wk.kept.drain(..) {
        Counters::add(&ctx.stats.c.kept_records_checked, 1);
        if let Some(why) = e.mismatch(&b) {
            ctx.violation(
                "data",
                format!(
                    "a record read before the cancel changed after its file was deleted: {why}"
                ),
                format!("op{op} kept record"),
                Some(op),
            );
        }
    }
}

/// Drives a future on this thread (plain-thread workers never return `Pending` except while a
/// control thread runs, and then are woken by nothing but their own blocking calls).
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// A control thread: cancels from another thread, or waits at a pause point then cancels.
enum Ctl<T> {
    Thread(std::thread::JoinHandle<T>),
    Tokio(tokio::task::JoinHandle<T>),
}

fn spawn_ctl<T: Send + 'static>(flavor: Flavor, f: impl FnOnce() -> T + Send + 'static) -> Ctl<T> {
    match flavor {
        Flavor::Thread => Ctl::Thread(std::thread::spawn(f)),
        // The blocking pool, never a runtime worker: a worker may be held at a pause point.
        Flavor::Async => Ctl::Tokio(tokio::task::spawn_blocking(f)),
    }
}

impl<T> Ctl<T> {
    async fn join(self) -> Option<T> {
        match self {
            Ctl::Thread(h) => h.join().ok(),
            Ctl::Tokio(h) => h.await.ok(),
        }
    }
}

async fn sleep(flavor: Flavor, d: Duration) {
    match flavor {
        Flavor::Thread => std::thread::sleep(d),
        Flavor::Async => tokio::time::sleep(d).await,
    }
}

/// How long a writer waits out `LedgerFull` / `QuotaExceeded` before it gives up.
const ADMISSION_PATIENCE: Duration = Duration::from_secs(3);

/// Whether an error is acceptable where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The expected abort of a cancelled op.
    Aborted,
    /// A fault explains it: one loadgen injected (its errno), or a full device.
    Fault,
    /// An admission refusal (ledger full, quota exceeded): no file was created.
    Refused,
    /// A violation, and why.
    Bad(String),
}

/// True if `e` is an I/O error with the errno loadgen's fault plan injects: a fault of ours,
/// not something the engine or the storage did.
pub fn is_injected(e: &SpillError) -> bool {
    matches!(e, SpillError::Io { .. })
        && e.os_error().and_then(std::io::Error::raw_os_error) == Some(crate::run::INJECTED_ERRNO)
}

/// Judges an engine error. `cancelled`: the op's scope was cancelled (or the cancel races the
/// call); `faults`: loadgen's fault plan is armed.
///
/// An I/O error is acceptable only when it carries the errno loadgen injects (so only with
/// faults on): a fault-caused error is distinguishable from a cancel, and any other I/O error
/// (a bare `NotFound` of a file an abort deleted, above all) is a violation even with faults
/// on. A full device (`StorageFull`, which loadgen also injects) and an admission refusal are
/// the environment's doing and acceptable either way; `Aborted` only after a cancel.
pub fn verdict(e: &SpillError, cancelled: bool, faults: bool) -> Verdict {
    match e {
        SpillError::Aborted if cancelled => Verdict::Aborted,
        SpillError::Aborted => {
            Verdict::Bad(format!("Aborted although the task was not cancelled: {e}"))
        }
        SpillError::StorageFull { .. } => Verdict::Fault,
        // After a cancel: a refusal from a retry loop that gave up before the cancel landed.
        SpillError::LedgerFull { .. } | SpillError::QuotaExceeded { .. } => Verdict::Refused,
        SpillError::Io { .. } if faults && is_injected(e) => Verdict::Fault,
        _ if cancelled => Verdict::Bad(format!(
            "after a cancel: {e} (expected Aborted, or an injected fault with errno {}: an \
             executor must be able to tell a cancel from a fault)",
            crate::run::INJECTED_ERRNO
        )),
        SpillError::Io { .. } if faults => Verdict::Bad(format!(
            "I/O error that no injected fault explains (loadgen injects errno {}): {e}",
            crate::run::INJECTED_ERRNO
        )),
        _ => Verdict::Bad(format!("unexpected error: {e}")),
    }
}

struct Op<'a> {
    ctx: &'a Ctx,
    wk: &'a mut Worker,
    idx: u64,
    id: String,
    rng: Rng,
    task: TaskSpill,
    /// What every record written so far must read back as.
    recs: Vec<Expect>,
    written: u64,
}

impl<'a> Op<'a> {
    fn new(ctx: &'a Ctx, wk: &'a mut Worker, idx: u64) -> Option<Op<'a>> {
        let id = format!("op{idx}");
        let task = match ctx.engine.task(&id) {
            Ok(t) => t,
            Err(e) => {
                ctx.violation(
                    "api",
                    format!("engine.task() failed on an open engine: {e}"),
                    format!("op{idx} stage task"),
                    Some(idx),
                );
                return None;
            }
        };
        Some(Op {
            rng: Rng::new(op_seed(ctx.seed, idx)),
            ctx,
            wk,
            idx,
            id,
            task,
            recs: Vec::new(),
            written: 0,
        })
    }

    fn phase(&self, p: Phase) {
        self.ctx.slots[self.wk.wid].set_phase(p);
    }

    fn flavor(&self) -> Flavor {
        self.wk.flavor
    }

    fn at(&self, stage: &str) -> String {
        format!(
            "op{} stage {stage} ({} worker {})",
            self.idx,
            match self.wk.flavor {
                Flavor::Thread => "thread",
                Flavor::Async => "async",
            },
            self.wk.wid
        )
    }

    fn bad(&self, kind: &'static str, stage: &str, what: String) {
        self.ctx
            .violation(kind, what, self.at(stage), Some(self.idx));
    }

    /// Judges an error seen where no cancel was issued (see [`verdict`]); reports a violation.
    fn judge(&self, stage: &str, e: &SpillError) -> Verdict {
        let v = verdict(e, false, self.ctx.faults);
        match &v {
            Verdict::Fault => Counters::add(&self.ctx.stats.c.ops_failed_by_fault, 1),
            Verdict::Bad(why) => self.bad("api", stage, why.clone()),
            Verdict::Aborted | Verdict::Refused => {}
        }
        v
    }

    /// Judges an error seen after (or racing) a cancel (see [`verdict`]); reports a violation.
    fn judge_cancelled(&self, stage: &str, e: &SpillError) -> Verdict {
        let v = verdict(e, true, self.ctx.faults);
        if let Verdict::Bad(why) = &v {
            self.bad("api", stage, why.clone());
        }
        v
    }

    /// Judges the error of a reader or a read of a live state (nobody cancelled it): a
    /// violation unless an injected fault explains it.
    fn judge_live_read(&self, stage: &str, at: usize, e: &SpillError) -> Verdict {
        let v = match verdict(e, false, self.ctx.faults) {
            Verdict::Fault => Verdict::Fault,
            Verdict::Bad(why) => Verdict::Bad(why),
            // Neither a refusal nor an abort is an answer a read of a live state may give.
            Verdict::Aborted | Verdict::Refused => Verdict::Bad(format!("unexpected error: {e}")),
        };
        match &v {
            Verdict::Fault => Counters::add(&self.ctx.stats.c.ops_failed_by_fault, 1),
            Verdict::Bad(why) => self.bad(
                "api",
                stage,
                format!("at record {at} of a live state: {why}"),
            ),
            Verdict::Aborted | Verdict::Refused => {}
        }
        v
    }

    /// A call that must fail with `Aborted` now that the cancel returned. (`write`, `finish`
    /// and `read` errors were tallied by their wrappers; the others are tallied here.)
    fn expect_aborted<T>(&self, stage: &str, r: Result<T, SpillError>) {
        match r {
            Ok(_) => self.bad(
                "api",
                stage,
                "succeeded after the task was cancelled".into(),
            ),
            Err(e) => {
                if !matches!(stage, "write" | "finish" | "read") {
                    self.ctx.stats.error(stage, &e);
                }
                if !matches!(e, SpillError::Aborted) {
                    self.bad(
                        "api",
                        stage,
                        format!("after a cancel: {e} instead of Aborted"),
                    );
                }
            }
        }
    }

    fn next_record(&mut self) -> Bytes {
        let len = record_len(&mut self.rng, self.ctx.max_record);
        self.ctx.pool.record(&mut self.rng, len)
    }

    fn target_bytes(&mut self) -> u64 {
        self.rng.log_uniform(1, self.ctx.max_task_bytes.max(1))
    }

    /// One record, retrying admission refusals for a while.
    async fn write(&mut self, w: &mut SpillWriter, rec: Bytes) -> Result<(), SpillError> {
        self.phase(Phase::Writing);
        let expect = Expect::of(&rec);
        let started = Instant::now();
        loop {
            let segs = w.segments();
            let t = Instant::now();
            let r = match self.flavor() {
                Flavor::Thread => w.write(rec.clone()),
                Flavor::Async => w.write_async(rec.clone()).await,
            };
            let dt = t.elapsed();
            match r {
                Ok(()) => {
                    record(&mut self.wk.hists.write_enqueue, dt);
                    if w.segments() != segs {
                        record(&mut self.wk.hists.segment_rotation, dt);
                    }
                    self.recs.push(expect);
                    self.written += rec.len() as u64;
                    let c = &self.ctx.stats.c;
                    Counters::add(&c.bytes_written, rec.len() as u64);
                    Counters::add(&c.records_written, 1);
                    return Ok(());
                }
                Err(e @ (SpillError::LedgerFull { .. } | SpillError::QuotaExceeded { .. })) => {
                    self.ctx.stats.error("write", &e);
                    Counters::add(&self.ctx.stats.c.admission_retries, 1);
                    if started.elapsed() > ADMISSION_PATIENCE || self.ctx.done() {
                        Counters::add(&self.ctx.stats.c.ops_gave_up_admission, 1);
                        return Err(e);
                    }
                    let ms = 1 + self.rng.below(4);
                    sleep(self.flavor(), Duration::from_millis(ms)).await;
                }
                Err(e) => {
                    self.ctx.stats.error("write", &e);
                    return Err(e);
                }
            }
        }
    }

    /// Writes records until `target` bytes are written. Judges an error (no cancel issued).
    async fn write_upto(&mut self, w: &mut SpillWriter, target: u64) -> bool {
        while self.written < target || self.recs.is_empty() {
            let rec = self.next_record();
            if let Err(e) = self.write(w, rec).await {
                self.judge("write", &e);
                return false;
            }
        }
        true
    }

    async fn finish(&mut self, w: SpillWriter) -> Result<SpilledState, SpillError> {
        self.phase(Phase::Finishing);
        let t = Instant::now();
        let r = match self.flavor() {
            Flavor::Thread => w.finish(),
            Flavor::Async => w.finish_async().await,
        };
        record(&mut self.wk.hists.finish, t.elapsed());
        if let Err(e) = &r {
            self.ctx.stats.error("finish", e);
        }
        r
    }

    /// Reads from record `from` on, checking each record, up to `upto` records in all (or to
    /// the end, which must come exactly after the last record written). Returns the next index,
    /// or the error with the index where it happened. Mismatches are violations.
    fn read(
        &mut self,
        r: &mut SpillReader,
        from: usize,
        upto: Option<usize>,
        mut keep: Option<&mut Vec<(u64, Bytes, Expect)>>,
    ) -> Result<usize, (usize, SpillError)> {
        self.phase(Phase::Reading);
        let mut i = from;
        loop {
            if upto.is_some_and(|u| i >= u) {
                return Ok(i);
            }
            let t = Instant::now();
            let rec = r.next_record();
            record(&mut self.wk.hists.read, t.elapsed());
            match rec {
                Ok(Some(b)) => {
                    match self.recs.get(i) {
                        None => {
                            self.bad(
                                "data",
                                "read",
                                format!(
                                    "record {i} read back, only {} were written",
                                    self.recs.len()
                                ),
                            );
                            return Ok(i);
                        }
                        Some(e) => {
                            if let Some(why) = e.mismatch(&b) {
                                self.bad("data", "read", format!("record {i}: {why}"));
                                return Ok(i);
                            }
                            if let Some(k) = keep.as_deref_mut()
                                && k.len() < 4
                            {
                                k.push((self.idx, b.clone(), *e));
                            }
                        }
                    }
                    let c = &self.ctx.stats.c;
                    Counters::add(&c.bytes_read, b.len() as u64);
                    Counters::add(&c.records_read, 1);
                    i += 1;
                }
                Ok(None) => {
                    if i != self.recs.len() {
                        self.bad(
                            "data",
                            "read",
                            format!(
                                "reader ended after {i} records, {} were written",
                                self.recs.len()
                            ),
                        );
                    }
                    return Ok(i);
                }
                Err(e) => {
                    self.ctx.stats.error("read", &e);
                    return Err((i, e));
                }
            }
        }
    }

    /// Reads the whole state back (sometimes through two interleaved readers) and checks it.
    fn read_back(&mut self, st: &SpilledState) {
        let mut r1 = match st.reader() {
            Ok(r) => r,
            Err(e) => {
                self.ctx.stats.error("reader", &e);
                self.judge_live_read("reader", 0, &e);
                return;
            }
        };
        let two = self.rng.chance(0.2);
        let half = self.recs.len() / 2;
        let r = if two {
            self.read(&mut r1, 0, Some(half), None).and_then(|i| {
                let mut r2 = st.clone().into_reader().map_err(|e| (0, e))?;
                self.read(&mut r2, 0, None, None)?;
                drop(r2);
                self.read(&mut r1, i, None, None)
            })
        } else {
            self.read(&mut r1, 0, None, None)
        };
        if let Err((i, e)) = r {
            self.judge_live_read("read", i, &e);
        }
        Counters::add(&self.ctx.stats.c.ops_read_back, 1);
    }

    fn publish(&mut self, st: SpilledState) {
        self.phase(Phase::Publishing);
        let ctx = self.ctx;
        match st.publish(&ctx.published_dir, &self.id) {
            Ok(paths) => {
                if let Err(why) = check::verify_published(&paths, &self.recs) {
                    self.bad("published", "publish", why);
                }
                let mut ids = Vec::with_capacity(paths.len());
                for p in paths {
                    match check::file_id(&p) {
                        Ok(id) => ids.push(Published {
                            op: self.idx,
                            path: p,
                            id,
                        }),
                        Err(e) => self.bad(
                            "published",
                            "publish",
                            format!("published file {} missing at once: {e}", p.display()),
                        ),
                    }
                }
                let c = &ctx.stats.c;
                Counters::add(&c.ops_published, 1);
                Counters::add(&c.published_files, ids.len() as u64);
                ctx.published
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(ids);
                ctx.trim_published(PUBLISHED_KEEP);
            }
            Err(e) => {
                ctx.stats.error("publish", &e);
                self.bad("api", "publish", format!("publish of a live state: {e}"));
            }
        }
    }

    /// Cancels now (this thread) and starts timing abort-to-clean if files exist.
    fn cancel_now(&self, files: bool) {
        self.phase(Phase::Cancelling);
        let t0 = Instant::now();
        self.task.cancel();
        if files {
            self.ctx.watch.aborted(self.idx, t0);
        }
    }

    /// Cancels from a control thread after a short random delay.
    /// Arms a pause of this task's writer at `point` and returns the control thread that
    /// cancels the task once the writer is paused there (or once `done` says the writer got
    /// past without pausing), then releases it. Its result: whether the pause was reached.
    fn cancel_at(&mut self, point: FaultPoint, done: Arc<AtomicBool>, files: bool) -> Ctl<bool> {
        let plan = FaultPlan::new(op_seed(self.ctx.seed, self.idx));
        let pause = plan.pause_once(point);
        self.task.set_fault_plan(plan);
        let (task, watch, idx) = (self.task.clone(), self.ctx.watch.clone(), self.idx);
        spawn_ctl(self.flavor(), move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            let reached = loop {
                if pause.wait_reached(Duration::from_millis(2)) {
                    break true;
                }
                if done.load(Ordering::Acquire) || Instant::now() > deadline {
                    break false;
                }
            };
            let t0 = Instant::now();
            task.cancel();
            if reached && files {
                watch.aborted(idx, t0);
            }
            pause.release();
            reached
        })
    }

    fn cancel_soon(&mut self, files: bool) -> Ctl<()> {
        Counters::add(&self.ctx.stats.c.cross_thread_cancels, 1);
        let task = self.task.clone();
        let watch = self.ctx.watch.clone();
        let idx = self.idx;
        let delay = Duration::from_micros(self.rng.below(300));
        spawn_ctl(self.flavor(), move || {
            std::thread::sleep(delay);
            let t0 = Instant::now();
            task.cancel();
            if files {
                watch.aborted(idx, t0);
            }
        })
    }

    async fn run(&mut self) {
        let ctx = self.ctx;
        let abort = !ctx.points.is_empty() && self.rng.chance(ctx.abort_rate);
        if abort {
            let p = ctx.points[self.rng.below(ctx.points.len() as u64) as usize];
            ctx.stats.abort(p);
            match p {
                AbortPoint::BeforeFirstWrite => self.before_first_write().await,
                AbortPoint::MidWrite => self.mid_write().await,
                AbortPoint::AfterCreate => self.after_create().await,
                AbortPoint::HandOff => self.hand_off().await,
                AbortPoint::AfterFinish => self.after_finish().await,
                AbortPoint::MidRead => self.mid_read().await,
                AbortPoint::Abandon => self.abandon().await,
            }
        } else {
            Counters::add(&ctx.stats.c.ops_normal, 1);
            self.normal().await;
        }
        self.phase(Phase::Closing);
        self.task.close();
    }

    fn writer(&self) -> Option<SpillWriter> {
        match self.task.writer() {
            Ok(w) => Some(w),
            Err(e) => {
                self.ctx.stats.error("writer", &e);
                self.bad(
                    "api",
                    "writer",
                    format!("task.writer() on an open scope: {e}"),
                );
                None
            }
        }
    }

    /// Writes this op's target amount and finishes: the state, or `None` after judging
    /// whatever error ended the spill.
    async fn spill_to_target(&mut self) -> Option<SpilledState> {
        let mut w = self.writer()?;
        let target = self.target_bytes();
        if !self.write_upto(&mut w, target).await {
            return None;
        }
        match self.finish(w).await {
            Ok(st) => Some(st),
            Err(e) => {
                self.judge("finish", &e);
                None
            }
        }
    }

    async fn normal(&mut self) {
        let Some(st) = self.spill_to_target().await else {
            return;
        };
        if self.rng.chance(self.ctx.read_rate) {
            self.read_back(&st);
        }
        if self.rng.chance(self.ctx.publish_rate) {
            self.publish(st);
            // The published files are the caller's: a cancel of the scope must not touch them.
            if self.rng.chance(0.5) {
                self.task.cancel();
            }
        } else {
            drop(st);
        }
    }

    async fn before_first_write(&mut self) {
        let Some(mut w) = self.writer() else { return };
        self.cancel_now(false);
        let rec = self.next_record();
        let r = self.write(&mut w, rec).await;
        self.expect_aborted("write", r);
        match self.task.writer() {
            Ok(_) => self.bad(
                "api",
                "writer",
                "task.writer() succeeded on a cancelled scope".into(),
            ),
            Err(SpillError::Closed { .. }) => {}
            Err(e) => self.bad(
                "api",
                "writer",
                format!("task.writer() on a cancelled scope: {e} instead of Closed"),
            ),
        }
    }

    async fn mid_write(&mut self) {
        let Some(mut w) = self.writer() else { return };
        // Cancel once a staging buffer went out, so that writes are in flight.
        let buf = self.ctx.io_buffer_size;
        let cut = buf + 1 + self.rng.below(buf * 4);
        let target = cut + self.target_bytes();
        if !self.write_upto(&mut w, cut).await {
            return;
        }
        let files = w.segments() > 0;
        if self.rng.chance(0.5) {
            self.cancel_now(files);
            let rec = self.next_record();
            let r = self.write(&mut w, rec).await;
            self.expect_aborted("write", r);
            return;
        }
        // From another thread, while this one keeps writing.
        let ctl = self.cancel_soon(files);
        let mut failed = false;
        while self.written < target {
            let rec = self.next_record();
            if let Err(e) = self.write(&mut w, rec).await {
                self.judge_cancelled("write", &e);
                failed = true;
                break;
            }
        }
        self.phase(Phase::WaitingForControl);
        ctl.join().await;
        if !failed {
            let r = self.finish(w).await;
            match r {
                Ok(_) => self.bad(
                    "api",
                    "finish",
                    "finish succeeded after the task was cancelled".into(),
                ),
                Err(e) => {
                    self.judge_cancelled("finish", &e);
                }
            }
        }
    }

    async fn after_create(&mut self) {
        let Some(mut w) = self.writer() else { return };
        // Pause at the first segment's creation, or at a rotation.
        if self.rng.chance(0.5) && !self.write_upto(&mut w, self.ctx.segment_size / 2).await {
            return;
        }
        // The writer will sit between its file creation and its abort check: cancel there.
        let writer_done = Arc::new(AtomicBool::new(false));
        let ctl = self.cancel_at(FaultPoint::WriterAfterCreate, writer_done.clone(), true);
        let cap = self.written + 2 * self.ctx.segment_size + self.ctx.max_record;
        let mut err = None;
        while self.written <= cap {
            let rec = self.next_record();
            if let Err(e) = self.write(&mut w, rec).await {
                err = Some(e);
                break;
            }
        }
        writer_done.store(true, Ordering::Release);
        self.phase(Phase::WaitingForControl);
        let reached = ctl.join().await.unwrap_or(false);
        let c = &self.ctx.stats.c;
        Counters::add(
            if reached {
                &c.windows_reached
            } else {
                &c.windows_missed
            },
            1,
        );
        match err {
            Some(e) if reached => {
                if !matches!(e, SpillError::Aborted) {
                    self.bad(
                        "api",
                        "write",
                        format!("a write paused between its file creation and the abort check returned {e} after the cancel, not Aborted"),
                    );
                }
            }
            Some(e) => {
                // The window was not reached: the writer failed first (an injected fault).
                self.judge_cancelled("write", &e);
            }
            None => {
                let r = self.finish(w).await;
                self.expect_aborted("finish", r);
            }
        }
    }

    async fn hand_off(&mut self) {
        let Some(mut w) = self.writer() else { return };
        let target = self.target_bytes();
        if !self.write_upto(&mut w, target).await {
            return;
        }
        // finish() will hold the files between the writer and the state: cancel there.
        let files = w.segments() > 0;
        let finished = Arc::new(AtomicBool::new(false));
        let ctl = self.cancel_at(FaultPoint::WriterHandOff, finished.clone(), files);
        let r = self.finish(w).await;
        finished.store(true, Ordering::Release);
        self.phase(Phase::WaitingForControl);
        let reached = ctl.join().await.unwrap_or(false);
        let c = &self.ctx.stats.c;
        Counters::add(
            if reached {
                &c.handoff_reached
            } else {
                &c.handoff_missed
            },
            1,
        );
        match r {
            Ok(st) => {
                if reached {
                    self.bad(
                        "api",
                        "finish",
                        "finish() cancelled in its hand-off window returned a state, not Aborted"
                            .into(),
                    );
                }
                self.expect_aborted("reader", st.reader());
            }
            Err(e) if reached => {
                if !matches!(e, SpillError::Aborted) {
                    self.bad(
                        "api",
                        "finish",
                        format!("finish() cancelled in its hand-off window: {e}, not Aborted"),
                    );
                }
            }
            Err(e) => {
                self.judge_cancelled("finish", &e);
            }
        }
    }

    async fn after_finish(&mut self) {
        let Some(mut w) = self.writer() else { return };
        let target = self.target_bytes();
        if !self.write_upto(&mut w, target).await {
            return;
        }
        if self.rng.chance(0.3) {
            // The cancel races finish().
            let ctl = self.cancel_soon(w.segments() > 0);
            let r = self.finish(w).await;
            self.phase(Phase::WaitingForControl);
            ctl.join().await;
            match r {
                Ok(st) => self.expect_aborted("reader", st.reader()),
                Err(e) => {
                    self.judge_cancelled("finish", &e);
                }
            }
            return;
        }
        let st = match self.finish(w).await {
            Ok(st) => st,
            Err(e) => {
                self.judge("finish", &e);
                return;
            }
        };
        let files = st.segments() > 0;
        if self.rng.chance(0.3) {
            // Closing the scope at the task's end closes the state the same way.
            self.phase(Phase::Cancelling);
            let t0 = Instant::now();
            self.task.close();
            if files {
                self.ctx.watch.aborted(self.idx, t0);
            }
        } else {
            self.cancel_now(files);
        }
        if !st.is_aborted() {
            self.bad(
                "api",
                "state",
                "SpilledState::is_aborted() is false after the scope closed".into(),
            );
        }
        match self.rng.below(4) {
            0 => self.expect_aborted("reader", st.reader()),
            1 => self.expect_aborted("reader", st.clone().reader()),
            2 => self.expect_aborted("into_reader", st.into_reader()),
            _ => {
                let dir = self.ctx.published_dir.clone();
                let id = self.id.clone();
                self.expect_aborted("publish", st.publish(&dir, &id));
            }
        }
    }

    async fn mid_read(&mut self) {
        let Some(st) = self.spill_to_target().await else {
            return;
        };
        let mut r = match st.reader() {
            Ok(r) => r,
            Err(e) => {
                self.ctx.stats.error("reader", &e);
                self.judge_live_read("reader", 0, &e);
                return;
            }
        };
        let n = self.recs.len();
        let cut = self.rng.below(n as u64 + 1) as usize;
        let mut kept = Vec::new();
        let at = match self.read(&mut r, 0, Some(cut), Some(&mut kept)) {
            Ok(i) => i,
            Err((i, e)) => {
                self.judge_live_read("read", i, &e);
                return;
            }
        };
        let files = st.segments() > 0;
        if self.rng.chance(0.5) {
            self.cancel_now(files);
        } else {
            // From another thread while this one keeps reading.
            let ctl = self.cancel_soon(files);
            let res = self.read(&mut r, at, None, Some(&mut kept));
            self.phase(Phase::WaitingForControl);
            ctl.join().await;
            if let Err((_, e)) = res {
                self.judge_cancelled("read", &e);
            }
        }
        // The cancel returned: the next call must report it.
        self.expect_aborted("read", r.next_record());
        drop(r);
        drop(st);
        // A few records also outlive the engine: checked after it is gone.
        if let Some(first) = kept.first() {
            let mut s = self.ctx.survivors.lock().unwrap_or_else(|e| e.into_inner());
            if s.len() < SURVIVORS {
                s.push(first.clone());
            }
        }
        self.wk.kept.extend(kept);
    }

    async fn abandon(&mut self) {
        match self.rng.below(3) {
            0 => {
                // Drop the writer with writes in flight; the scope stays open for a moment.
                let Some(mut w) = self.writer() else { return };
                let target = self.ctx.io_buffer_size + 1 + self.target_bytes();
                if !self.write_upto(&mut w, target).await {
                    return;
                }
                let files = w.segments() > 0;
                let t0 = Instant::now();
                drop(w);
                if files {
                    self.ctx.watch.aborted(self.idx, t0);
                }
            }
            1 => {
                // Drop the last grant without reading (or half way through reading).
                let Some(st) = self.spill_to_target().await else {
                    return;
                };
                let files = st.segments() > 0;
                if self.rng.chance(0.5) {
                    // Nobody cancelled this state: its reader and reads are judged like any.
                    match st.reader() {
                        Ok(mut r) => {
                            let half = self.recs.len() / 2;
                            if let Err((i, e)) = self.read(&mut r, 0, Some(half), None) {
                                self.judge_live_read("read", i, &e);
                            }
                            drop(r);
                        }
                        Err(e) => {
                            self.ctx.stats.error("reader", &e);
                            self.judge_live_read("reader", 0, &e);
                        }
                    }
                }
                let t0 = Instant::now();
                drop(st);
                if files {
                    self.ctx.watch.aborted(self.idx, t0);
                }
            }
            _ => {
                // Drop every handle of the task while its writer lives: the scope closes.
                let Some(mut w) = self.writer() else { return };
                let target = self.target_bytes();
                if !self.write_upto(&mut w, target).await {
                    return;
                }
                let files = w.segments() > 0;
                // Keep a (fresh, unused) scope in the op so that the op's own can be dropped.
                let spare = match self.ctx.engine.task(&format!("{}-spare", self.id)) {
                    Ok(t) => t,
                    Err(e) => {
                        self.bad(
                            "api",
                            "task",
                            format!("engine.task() on an open engine: {e}"),
                        );
                        return;
                    }
                };
                let t0 = Instant::now();
                drop(std::mem::replace(&mut self.task, spare));
                if files {
                    self.ctx.watch.aborted(self.idx, t0);
                }
                let rec = self.next_record();
                let r = self.write(&mut w, rec).await;
                self.expect_aborted("write", r);
            }
        }
    }
}

/// A stall report line per worker.
pub fn describe_slots(slots: &[Slot]) -> Vec<String> {
    slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "worker {i}: op{} {}",
                s.op.load(Ordering::Relaxed),
                s.phase().map_or("?", Phase::as_str)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::INJECTED_ERRNO;

    fn io(e: std::io::Error) -> SpillError {
        SpillError::Io {
            op: "open",
            path: "/r/spillring-0/op1/spill-segment-000001.bin".into(),
            source: e,
        }
    }

    fn errno(n: i32) -> SpillError {
        io(std::io::Error::from_raw_os_error(n))
    }

    /// The stall report names the phases as it always did.
    #[test]
    fn phases_keep_their_values_and_names() {
        let names = [
            "idle",
            "writing",
            "finishing",
            "reading",
            "publishing",
            "cancelling",
            "waiting for control",
            "closing",
            "done",
        ];
        for (i, p) in Phase::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i, "{p:?}");
            assert_eq!(p.as_str(), names[i]);
            assert_eq!(Phase::from_u8(i as u8), Some(p));
        }
        assert_eq!(Phase::from_u8(9), None);
        let slot = Slot::default();
        assert_eq!(slot.phase(), Some(Phase::Idle));
        slot.set_phase(Phase::WaitingForControl);
        assert_eq!(
            describe_slots(std::slice::from_ref(&slot)),
            ["worker 0: op0 waiting for control"]
        );
    }

    fn is_bad(v: &Verdict) -> bool {
        matches!(v, Verdict::Bad(_))
    }

    /// Invariant 6: a reader whose files an abort deleted reports Aborted, never a bare
    /// NotFound, and faults being on must not excuse one.
    #[test]
    fn after_a_cancel_only_the_injected_errno_is_a_fault() {
        for faults in [true, false] {
            for e in [
                io(std::io::ErrorKind::NotFound.into()),
                errno(libc::ENOENT),
                errno(libc::EIO),
                errno(libc::EBADF),
                errno(libc::ECANCELED),
                SpillError::Closed { what: "writer" },
                SpillError::WriterFailed,
            ] {
                let v = verdict(&e, true, faults);
                assert!(is_bad(&v), "{e} after a cancel (faults {faults}): {v:?}");
            }
        }
        let v = verdict(&io(std::io::ErrorKind::NotFound.into()), true, true);
        let Verdict::Bad(why) = v else { unreachable!() };
        assert!(why.contains("after a cancel"), "{why}");
        assert_eq!(verdict(&errno(INJECTED_ERRNO), true, true), Verdict::Fault);
        // Without a plan nothing is injected: not even that errno is excused.
        assert!(is_bad(&verdict(&errno(INJECTED_ERRNO), true, false)));
        assert_eq!(verdict(&SpillError::Aborted, true, true), Verdict::Aborted);
        assert_eq!(verdict(&SpillError::Aborted, true, false), Verdict::Aborted);
        let full = SpillError::StorageFull {
            op: "write",
            path: "/r/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(verdict(&full, true, true), Verdict::Fault);
        assert_eq!(
            verdict(&SpillError::LedgerFull { capacity: 4 }, true, true),
            Verdict::Refused
        );
    }

    #[test]
    fn without_a_cancel_only_the_injected_errno_is_a_fault() {
        assert_eq!(verdict(&errno(INJECTED_ERRNO), false, true), Verdict::Fault);
        for faults in [true, false] {
            for e in [
                errno(libc::EIO),
                errno(libc::ENOENT),
                SpillError::Aborted,
                SpillError::WriterFailed,
            ] {
                let v = verdict(&e, false, faults);
                assert!(is_bad(&v), "{e} without a cancel (faults {faults}): {v:?}");
            }
        }
        assert!(is_bad(&verdict(&errno(INJECTED_ERRNO), false, false)));
        assert_eq!(
            verdict(
                &SpillError::QuotaExceeded {
                    limit: 1,
                    in_use: 1,
                    requested: 1
                },
                false,
                false
            ),
            Verdict::Refused
        );
        assert!(is_injected(&errno(INJECTED_ERRNO)));
        assert!(!is_injected(&errno(libc::EIO)));
        assert!(!is_injected(&SpillError::Aborted));
    }
}
