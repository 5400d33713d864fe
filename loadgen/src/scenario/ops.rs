//! One op: its spill scope, the writes (with admission retries), the finish, the checked
//! reads, the publish, and the normal life of a spill; the abort points are in [`super::abort`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use spillring::{SpillError, SpillReader, SpillWriter, SpilledState, TaskSpill};

use super::phase::Phase;
use super::worker::Worker;
use super::{Ctx, Flavor, Published};
use crate::args::AbortPoint;
use crate::check;
use crate::data::{Expect, Rng, op_seed, record_len};
use crate::stats::{Counters, record};

async fn sleep(flavor: Flavor, d: Duration) {
    match flavor {
        Flavor::Thread => std::thread::sleep(d),
        Flavor::Async => tokio::time::sleep(d).await,
    }
}

/// How long a writer waits out `LedgerFull` / `QuotaExceeded` before it gives up.
const ADMISSION_PATIENCE: Duration = Duration::from_secs(3);

/// Published files kept before loadgen checks and deletes the older ones (bounds the disk).
const PUBLISHED_KEEP: usize = 64;

/// One op in progress: its scope, its random choices, and what it wrote so far.
pub(super) struct Op<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) wk: &'a mut Worker,
    pub(super) idx: u64,
    pub(super) id: String,
    pub(super) rng: Rng,
    pub(super) task: TaskSpill,
    /// What every record written so far must read back as.
    pub(super) recs: Vec<Expect>,
    pub(super) written: u64,
}

impl<'a> Op<'a> {
    pub(super) fn new(ctx: &'a Ctx, wk: &'a mut Worker, idx: u64) -> Option<Op<'a>> {
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

    pub(super) fn phase(&self, p: Phase) {
        self.ctx.slots[self.wk.wid].set_phase(p);
    }

    pub(super) fn flavor(&self) -> Flavor {
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

    pub(super) fn bad(&self, kind: &'static str, stage: &str, what: String) {
        self.ctx
            .violation(kind, what, self.at(stage), Some(self.idx));
    }

    pub(super) fn next_record(&mut self) -> Bytes {
        let len = record_len(&mut self.rng, self.ctx.max_record);
        self.ctx.pool.record(&mut self.rng, len)
    }

    pub(super) fn target_bytes(&mut self) -> u64 {
        self.rng.log_uniform(1, self.ctx.max_task_bytes.max(1))
    }

    /// One record, retrying admission refusals for a while.
    pub(super) async fn write(
        &mut self,
        w: &mut SpillWriter,
        rec: Bytes,
    ) -> Result<(), SpillError> {
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
    pub(super) async fn write_upto(&mut self, w: &mut SpillWriter, target: u64) -> bool {
        while self.written < target || self.recs.is_empty() {
            let rec = self.next_record();
            if let Err(e) = self.write(w, rec).await {
                self.judge("write", &e);
                return false;
            }
        }
        true
    }

    pub(super) async fn finish(&mut self, w: SpillWriter) -> Result<SpilledState, SpillError> {
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
    pub(super) fn read(
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

    pub(super) async fn run(&mut self) {
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

    pub(super) fn writer(&self) -> Option<SpillWriter> {
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
    pub(super) async fn spill_to_target(&mut self) -> Option<SpilledState> {
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
}
