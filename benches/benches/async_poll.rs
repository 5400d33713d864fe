//! Async poll: how long one poll of an `_async` call holds a tokio worker (issue 13, point 2).
//!
//! The tokio scenario, small enough for about a minute: one engine (default config:
//! 64 MiB segments, 1 MiB staging buffers, the segment pool on) on the disk root
//! (`SPILLRING_BENCH_ROOT`, see `scratch`), a multi-thread runtime with 2 workers, and
//! `TASKS` tokio tasks at once, each a task scope with one writer that spills 1-20 MiB
//! (a deterministic spread) in 64 KiB records with `write_async`, `finish_async`, then reads
//! every record back and checks its length and first bytes, yielding to the runtime after each
//! record as a producer or consumer fed from elsewhere would. Beside them one task sleeps 1 ms
//! in a loop and records how late each timer fired (the worst, and how many fired > 10 ms late).
//!
//! Every engine future is wrapped in [`Timed`], which times each `poll` call: the figure is
//! the longest single poll per call (`write_async`, `finish_async`, the read) and the number
//! of polls over 10 ms. The read is `next_record_async` where the engine has it; on a tree
//! without it (the "before" figures) it is `next_record` called inside a poll, timed the same
//! way, which is what an async caller of that tree runs.
//!
//! Modes interleave (buffered, direct, buffered, ...) for `REPS` repetitions each; the JSON
//! gives every run and per mode the median and min/max over repetitions.
//!
//! Each poll is also measured on the worker thread itself (`getrusage(RUSAGE_THREAD)` and
//! `CLOCK_THREAD_CPUTIME_ID` around it): its CPU time, and whether the thread slept in the
//! kernel during it (a voluntary context switch: a blocking syscall, a page fault that waited
//! for the disk, a lock that parked). On a shared machine a poll's wall time mostly measures
//! preemption (another process ran), which these two do not count.
//!
//! Goal (the async rule, "an `_async` call never makes a blocking syscall on the caller's
//! thread"): no poll during which the worker slept in the kernel (`polls_blocked` = 0 in every
//! run; judged by `scripts/bench_report.py`: the bench writes figures only). The longest poll
//! (wall and CPU), polls over 10 ms and the timer are context.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::json;
use spillring::{Engine, EngineConfig, WriteMode};
use spillring_benches::{
    KIB, MIB, engine_info, env_or, median, quick, scratch, test_mode, write_results,
};

const RECORD: usize = 64 * KIB;
const SLOW_POLL: Duration = Duration::from_millis(10);

/// The longest poll and the count of slow polls of one kind of call.
#[derive(Default)]
struct PollStats {
    max_ns: AtomicU64,
    slow: AtomicU64,
    polls: AtomicU64,
    /// The most CPU time (user + system) the worker thread spent in one poll.
    max_cpu_ns: AtomicU64,
    /// Polls over 10 ms of thread CPU time.
    slow_cpu: AtomicU64,
    /// Polls during which the worker thread slept in the kernel (a voluntary context switch:
    /// blocking I/O, a page fault that waited for the disk, a lock that parked).
    blocked: AtomicU64,
}

/// What the calling thread used so far: CPU time (ns) and voluntary context switches.
fn thread_usage() -> (u64, u64) {
    // SAFETY: getrusage and clock_gettime write into the zeroed structs passed; both are
    // checked (a failure reads as zero).
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        let nvcsw = if libc::getrusage(libc::RUSAGE_THREAD, &mut ru) == 0 {
            ru.ru_nvcsw as u64
        } else {
            0
        };
        let mut ts: libc::timespec = std::mem::zeroed();
        let cpu = if libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) == 0 {
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
        } else {
            0
        };
        (cpu, nvcsw)
    }
}

impl PollStats {
    fn record(&self, d: Duration, cpu_ns: u64, switched: bool) {
        let ns = d.as_nanos() as u64;
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
        self.max_cpu_ns.fetch_max(cpu_ns, Ordering::Relaxed);
        self.polls.fetch_add(1, Ordering::Relaxed);
        if d > SLOW_POLL {
            self.slow.fetch_add(1, Ordering::Relaxed);
        }
        if cpu_ns > SLOW_POLL.as_nanos() as u64 {
            self.slow_cpu.fetch_add(1, Ordering::Relaxed);
        }
        if switched {
            self.blocked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "max_poll_ms": self.max_ns.load(Ordering::Relaxed) as f64 / 1e6,
            "polls_over_10ms": self.slow.load(Ordering::Relaxed),
            "max_poll_cpu_ms": self.max_cpu_ns.load(Ordering::Relaxed) as f64 / 1e6,
            "polls_over_10ms_cpu": self.slow_cpu.load(Ordering::Relaxed),
            "polls_blocked": self.blocked.load(Ordering::Relaxed),
            "polls": self.polls.load(Ordering::Relaxed),
        })
    }
}

#[derive(Default)]
struct Stats {
    write: PollStats,
    finish: PollStats,
    read: PollStats,
    timer_late_max_ns: AtomicU64,
    timer_late_over_10ms: AtomicU64,
    timer_fires: AtomicU64,
}

/// Times every `poll` of the future it wraps.
struct Timed<'a, F> {
    inner: F,
    stats: &'a PollStats,
}

impl<F: Future + Unpin> Future for Timed<'_, F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let (cpu0, sw0) = thread_usage();
        let t = Instant::now();
        let r = Pin::new(&mut self.inner).poll(cx);
        let d = t.elapsed();
        let (cpu1, sw1) = thread_usage();
        self.stats.record(d, cpu1.saturating_sub(cpu0), sw1 > sw0);
        r
    }
}

fn timed<F: Future>(stats: &PollStats, f: F) -> Timed<'_, Pin<Box<F>>> {
    Timed {
        inner: Box::pin(f),
        stats,
    }
}

/// Bytes task `t` spills: 1-20 MiB, spread deterministically.
fn spill_bytes(t: usize) -> usize {
    let mib = 1 + (t * 7 + 3) % 20;
    mib * MIB
}

fn payload(t: usize, i: usize) -> Bytes {
    let mut v = vec![(t as u8).wrapping_mul(31) ^ (i as u8); RECORD];
    v[..8].copy_from_slice(&(((t as u64) << 32) | i as u64).to_le_bytes());
    Bytes::from(v)
}

/// Reads the next record. The "after" tree has `next_record_async`; the "before" tree
/// called `next_record` here (see the module docs).
async fn read_next(r: &mut spillring::SpillReader) -> spillring::Result<Option<Bytes>> {
    r.next_record_async().await
}

async fn one_task(engine: Engine, t: usize, stats: Arc<Stats>) -> usize {
    let task = engine.task(&format!("async-poll-{t}")).expect("task");
    let mut w = task.writer().expect("writer");
    let n = spill_bytes(t) / RECORD;
    for i in 0..n {
        timed(&stats.write, w.write_async(payload(t, i)))
            .await
            .expect("write_async");
        // A producer gets its records from somewhere (a channel, a socket): it yields to the
        // runtime between them. Without this, a loop of calls that complete at once holds the
        // worker for the whole spill, whatever the engine does, and the timer would measure
        // the loop.
        tokio::task::yield_now().await;
    }
    let st = timed(&stats.finish, w.finish_async())
        .await
        .expect("finish_async");
    let mut r = st.reader().expect("reader");
    let mut got = 0;
    while let Some(rec) = timed(&stats.read, read_next(&mut r)).await.expect("read") {
        assert_eq!(rec.len(), RECORD);
        let id = u64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
        assert_eq!(id, ((t as u64) << 32) | got as u64, "record order");
        got += 1;
        tokio::task::yield_now().await;
    }
    assert_eq!(got, n);
    drop((r, st));
    task.close();
    got * RECORD
}

fn run(mode: WriteMode, tasks: usize) -> serde_json::Value {
    let dir = scratch("async-poll").expect("create a scratch directory");
    let engine = Engine::open(EngineConfig::new(dir.path()).mode(mode)).expect("open engine");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let stats = Arc::new(Stats::default());
    let t0 = Instant::now();
    let bytes = rt.block_on(async {
        let stop = Arc::new(AtomicBool::new(false));
        let timer = {
            let (stop, stats) = (stop.clone(), stats.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let late = at.elapsed().saturating_sub(Duration::from_millis(1));
                    stats
                        .timer_late_max_ns
                        .fetch_max(late.as_nanos() as u64, Ordering::Relaxed);
                    stats.timer_fires.fetch_add(1, Ordering::Relaxed);
                    if late > SLOW_POLL {
                        stats.timer_late_over_10ms.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        };
        let handles: Vec<_> = (0..tasks)
            .map(|t| tokio::spawn(one_task(engine.clone(), t, stats.clone())))
            .collect();
        let mut bytes = 0;
        for h in handles {
            bytes += h.await.expect("spill task");
        }
        stop.store(true, Ordering::Relaxed);
        timer.await.expect("timer task");
        bytes
    });
    let secs = t0.elapsed().as_secs_f64();
    drop(rt);
    let info = engine_info(&engine);
    let _ = engine.shutdown(Duration::from_secs(30));
    let max_all = [&stats.write, &stats.finish, &stats.read]
        .iter()
        .map(|s| s.max_ns.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    let kinds = [&stats.write, &stats.finish, &stats.read];
    let slow_all: u64 = kinds.iter().map(|s| s.slow.load(Ordering::Relaxed)).sum();
    let blocked_all: u64 = kinds
        .iter()
        .map(|s| s.blocked.load(Ordering::Relaxed))
        .sum();
    let polls_all: u64 = kinds.iter().map(|s| s.polls.load(Ordering::Relaxed)).sum();
    let max_cpu_all = kinds
        .iter()
        .map(|s| s.max_cpu_ns.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0) as f64
        / 1e6;
    let r = json!({
        "mode": mode.as_str(),
        "engine": info,
        "tasks": tasks,
        "bytes": bytes,
        "seconds": secs,
        "write_async": stats.write.json(),
        "finish_async": stats.finish.json(),
        "read": stats.read.json(),
        "max_poll_ms": max_all,
        "polls_over_10ms": slow_all,
        "max_poll_cpu_ms": max_cpu_all,
        "polls_blocked": blocked_all,
        "polls": polls_all,
        "timer_late_max_ms": stats.timer_late_max_ns.load(Ordering::Relaxed) as f64 / 1e6,
        "timer_fires": stats.timer_fires.load(Ordering::Relaxed),
        "timer_late_over_10ms": stats.timer_late_over_10ms.load(Ordering::Relaxed),
    });
    eprintln!(
        "async_poll {:8} max poll {:7.2} ms (write {:.2}, finish {:.2}, read {:.2}), {} polls > 10 ms; max poll CPU {:.2} ms; polls that blocked {} (write {}, finish {}, read {}) of {}; timer late max {:.2} ms ({} of {} > 10 ms), {:.1} MiB in {:.1} s",
        mode.as_str(),
        max_all,
        r["write_async"]["max_poll_ms"].as_f64().unwrap_or(0.0),
        r["finish_async"]["max_poll_ms"].as_f64().unwrap_or(0.0),
        r["read"]["max_poll_ms"].as_f64().unwrap_or(0.0),
        slow_all,
        max_cpu_all,
        blocked_all,
        r["write_async"]["polls_blocked"],
        r["finish_async"]["polls_blocked"],
        r["read"]["polls_blocked"],
        polls_all,
        r["timer_late_max_ms"].as_f64().unwrap_or(0.0),
        r["timer_late_over_10ms"],
        r["timer_fires"],
        bytes as f64 / MIB as f64,
        secs
    );
    r
}

fn summary(runs: &[serde_json::Value], mode: &str, key: &str) -> serde_json::Value {
    let mut v: Vec<f64> = runs
        .iter()
        .filter(|r| r["mode"] == mode)
        .filter_map(|r| r[key].as_f64())
        .collect();
    if v.is_empty() {
        return json!(null);
    }
    let (min, max) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    json!({ "median": median(&mut v), "min": min, "max": max, "n": v.len() })
}

fn main() {
    let (tasks, reps) = if test_mode() {
        (4, 1)
    } else if quick() {
        (16, 2)
    } else {
        (32, 4)
    };
    let tasks = env_or("SPILLRING_ASYNC_TASKS", tasks);
    let reps = env_or("SPILLRING_ASYNC_REPS", reps);
    let mut runs = Vec::new();
    for rep in 0..reps {
        // Interleaved, and the order flips each repetition so drift hits both modes alike.
        let order = if rep % 2 == 0 {
            [WriteMode::Buffered, WriteMode::Direct]
        } else {
            [WriteMode::Direct, WriteMode::Buffered]
        };
        for mode in order {
            let mut r = run(mode, tasks);
            r["rep"] = json!(rep);
            runs.push(r);
        }
    }
    let mut modes = serde_json::Map::new();
    for mode in ["buffered", "direct"] {
        let worst = summary(&runs, mode, "max_poll_ms");
        let blocked = summary(&runs, mode, "polls_blocked");
        modes.insert(
            mode.into(),
            json!({
                "max_poll_ms": worst,
                "polls_over_10ms": summary(&runs, mode, "polls_over_10ms"),
                "max_poll_cpu_ms": summary(&runs, mode, "max_poll_cpu_ms"),
                "polls_blocked": blocked,
                "timer_late_max_ms": summary(&runs, mode, "timer_late_max_ms"),
            }),
        );
    }
    let doc = json!({
        "bench": "async_poll",
        "tasks": tasks,
        "reps": reps,
        "record_bytes": RECORD,
        "workers": 2,
        "modes": modes,
        "runs": runs,
    });
    write_results("async-poll", &doc).expect("write results");
}
