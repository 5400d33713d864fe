//! The second step of a run: the workers (half plain threads, half async tasks) run ops until
//! the duration or the op count is reached, under a watchdog that samples the open fds, prints
//! the progress and gives up on a stall.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spillring::{Engine, FaultPlan};

use super::FAULT_POINTS;
use super::setup::Setup;
use crate::args::RunArgs;
use crate::check;
use crate::progress::{Out, Ticker};
use crate::report::mib;
use crate::scenario::{self, Ctx, Flavor};
use crate::stats::{Counters, Hists};

/// What the drive measured itself.
#[derive(Debug)]
pub(super) struct Driven {
    /// From the start of the workers' clock until the last of them was joined.
    pub(super) elapsed: Duration,
    /// Most fds open at once (above those of the process at start).
    pub(super) fds_peak: u64,
    /// When that peak was seen, seconds into the run.
    pub(super) fds_peak_at: f64,
}

/// Runs the workers until every one of them is done; merges their histograms.
pub(super) fn drive(
    s: &Setup,
    a: &RunArgs,
    duration: Option<f64>,
    out: &Out,
    fds_before: &BTreeMap<i32, String>,
) -> Result<Driven, String> {
    let w = &a.workload;
    let workers = Workers::spawn(s, w.tasks as usize)?;
    let every = Duration::from_secs_f64(a.progress_secs.max(0.2));
    let ticker = {
        let c = s.ctx.clone();
        let e = s.engine.clone();
        let plan = s.plan.clone();
        let start = s.start;
        let by_ops = matches!((duration, w.ops), (None, Some(_)));
        Ticker::start(out, every, move || {
            status(&c, &e, plan.as_deref(), start, by_ops)
        })
    };
    let fds = watchdog(s, a, fds_before, &workers);
    workers.join(s)?;
    let elapsed = s.start.elapsed();
    ticker.stop();
    out.finish();
    Ok(Driven {
        elapsed,
        fds_peak: fds.peak,
        fds_peak_at: fds.peak_at,
    })
}

/// The running workers.
struct Workers {
    threads: Vec<std::thread::JoinHandle<Hists>>,
    asyncs: Vec<tokio::task::JoinHandle<Hists>>,
}

impl Workers {
    fn spawn(s: &Setup, tasks: usize) -> Result<Workers, String> {
        // Half the tasks are plain threads, half async tasks (a single task is a thread).
        let n_threads = tasks.div_ceil(2);
        let mut threads = Vec::new();
        for wid in 0..n_threads {
            let c = s.ctx.clone();
            let h = std::thread::Builder::new()
                .name(format!("loadgen-task-{wid}"))
                .spawn(move || scenario::block_on(scenario::worker(c, wid, Flavor::Thread)))
                .map_err(|e| format!("spawn a task thread: {e}"))?;
            threads.push(h);
        }
        let asyncs: Vec<_> = (n_threads..tasks)
            .map(|wid| {
                s.rt.spawn(scenario::worker(s.ctx.clone(), wid, Flavor::Async))
            })
            .collect();
        Ok(Workers { threads, asyncs })
    }

    fn finished(&self) -> bool {
        self.threads.iter().all(|h| h.is_finished()) && self.asyncs.iter().all(|h| h.is_finished())
    }

    /// Joins every worker and merges its histograms.
    fn join(self, s: &Setup) -> Result<(), String> {
        for h in self.threads {
            match h.join() {
                Ok(hists) => s.ctx.stats.merge_hists(&hists),
                Err(_) => return Err("a task thread panicked".into()),
            }
        }
        for h in self.asyncs {
            match s.rt.block_on(h) {
                Ok(hists) => s.ctx.stats.merge_hists(&hists),
                Err(e) => return Err(format!("an async task failed: {e}")),
            }
        }
        Ok(())
    }
}

/// Watchdog: the run ends when every worker is done; no op completing for --stall-secs
/// means something hangs. Returns the fds it sampled.
fn watchdog(
    s: &Setup,
    a: &RunArgs,
    fds_before: &BTreeMap<i32, String>,
    workers: &Workers,
) -> FdSampler {
    let ctx = &s.ctx;
    let stall = Duration::from_secs_f64(a.stall_secs.max(1.0));
    let mut last_done = 0;
    let mut last_progress = Instant::now();
    let mut fds = FdSampler::new(fds_before.len() as u64);
    let mut tick = 0u32;
    loop {
        if workers.finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        tick += 1;
        if tick.is_multiple_of(10) {
            fds.sample(ctx, s.start, a.workload.max_fds);
        }
        let d = Counters::get(&ctx.stats.c.ops_done);
        if d != last_done {
            last_done = d;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > stall {
            stalled(ctx, &s.engine, stall);
        }
    }
    fds
}

/// Open fds of the process, sampled: the engine must not hoard them (each is a segment whose
/// blocks stay allocated until it is closed, even once unlinked).
struct FdSampler {
    /// The fds the process had at start.
    base: u64,
    peak: u64,
    peak_at: f64,
    over_reported: bool,
    unreadable_reported: bool,
}

impl FdSampler {
    fn new(base: u64) -> FdSampler {
        FdSampler {
            base,
            peak: 0,
            peak_at: 0.0,
            over_reported: false,
            unreadable_reported: false,
        }
    }

    /// Counts the open fds; a new peak, or the first count above `--max-fds`, is recorded.
    fn sample(&mut self, ctx: &Ctx, start: Instant, max_fds: Option<u64>) {
        let n = match check::fd_count() {
            Ok(n) => n.saturating_sub(self.base),
            Err(e) => {
                if !self.unreadable_reported {
                    self.unreadable_reported = true;
                    ctx.violation("check", e.to_string(), check::PROC_FDS.into(), None);
                }
                0
            }
        };
        if n > self.peak {
            self.peak = n;
            self.peak_at = start.elapsed().as_secs_f64();
            ctx.stats.set_fds_peak(n);
        }
        if let Some(max) = max_fds
            && n > max
            && !self.over_reported
        {
            self.over_reported = true;
            ctx.violation(
                "fds",
                format!(
                    "{n} fds open during the run (limit --max-fds {max}); {} of unlinked files",
                    check::deleted_fds().map_or_else(|e| format!("? ({e})"), |n| n.to_string())
                ),
                "/proc/self/fd".into(),
                None,
            );
        }
    }
}

fn status(
    ctx: &Ctx,
    engine: &Engine,
    plan: Option<&FaultPlan>,
    start: Instant,
    by_ops: bool,
) -> (u64, String, String) {
    let c = &ctx.stats.c;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let done = Counters::get(&c.ops_done);
    let written = Counters::get(&c.bytes_written);
    let faults: u64 = plan.map_or(0, |p| FAULT_POINTS.iter().map(|x| p.fired(*x)).sum());
    let m = engine.metrics();
    let msg = format!(
        "{:.0}s ops {done} ({:.0}/s) wrote {} ({:.0} MiB/s) read {} aborts {} faults {faults} tickets {} pending {} fds peak {} violations {}",
        secs,
        done as f64 / secs,
        mib(written),
        written as f64 / (1u64 << 20) as f64 / secs,
        mib(Counters::get(&c.bytes_read)),
        c.aborts_total(),
        m.tickets_used,
        m.cleanup_pending + m.deletes_in_flight,
        ctx.stats.fds_peak(),
        ctx.stats.violation_count(),
    );
    let short = format!(
        "{done} ops {:.0} MiB/s aborts {} faults {faults} tickets {} violations {}",
        written as f64 / (1u64 << 20) as f64 / secs,
        c.aborts_total(),
        m.tickets_used,
        ctx.stats.violation_count(),
    );
    (if by_ops { done } else { secs as u64 }, short, msg)
}

fn stalled(ctx: &Ctx, engine: &Engine, stall: Duration) -> ! {
    let mut s = format!(
        "loadgen: STALL: no op completed for {:.0} s. Workers:\n",
        stall.as_secs_f64()
    );
    for l in scenario::describe_slots(&ctx.slots) {
        s.push_str("  ");
        s.push_str(&l);
        s.push('\n');
    }
    s.push_str(&format!(
        "  engine metrics: {:?}\n  cleanup: {:?}\n",
        engine.metrics(),
        engine.cleanup_report()
    ));
    ctx.out.line(&s);
    ctx.out.finish();
    std::process::exit(crate::EXIT_STALL);
}
