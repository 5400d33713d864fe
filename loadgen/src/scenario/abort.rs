//! The abort points, one function each: the op's spill is cancelled (or abandoned) at that point
//! and every call after it must report the abort.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use spillring::{FaultPoint, SpillError};

use super::ops::Op;
use super::phase::Phase;
use crate::stats::Counters;

/// Records kept past the engine's life.
const SURVIVORS: usize = 16;

impl Op<'_> {
    pub(super) async fn before_first_write(&mut self) {
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
            // Every call on a cancelled scope says Aborted (issue 13, point 3).
            Err(SpillError::Aborted) => {}
            Err(e) => self.bad(
                "api",
                "writer",
                format!("task.writer() on a cancelled scope: {e} instead of Aborted"),
            ),
        }
    }

    pub(super) async fn mid_write(&mut self) {
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

    pub(super) async fn after_create(&mut self) {
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

    pub(super) async fn hand_off(&mut self) {
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

    pub(super) async fn after_finish(&mut self) {
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

    pub(super) async fn mid_read(&mut self) {
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

    pub(super) async fn abandon(&mut self) {
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
