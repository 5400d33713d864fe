//! Diagnostic (issue 24, point 3): the yielding bench's loop (`benches/yielding.rs`: a
//! `current_thread` runtime, the spill and a 1 ms timer as `tokio::spawn`ed tasks; buffered
//! mode, yielding on unless `SPILLRING_PROBE_NOYIELD`, direct with `SPILLRING_PROBE_DIRECT`),
//! with every poll of the spill task timed. Prints, per phase (0 write, 1 finish, 2 read),
//! the timer's lateness and the spill polls' durations, the polls over `SPILLRING_PROBE_US`
//! (1000) us, and with `SPILLRING_PROBE_TICKS` every tick.
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use spillring::testing::set_cooperative_yield;
use spillring::{Engine, EngineConfig, WriteMode};
use spillring_benches::{KIB, MIB, env_or, scratch};

/// Phase << 32 | record index.
type Where = Arc<AtomicU64>;

fn at(phase: u64, idx: usize) -> u64 {
    phase << 32 | idx as u64
}

/// Each poll: (ms since start, poll us, where before, where after, pending).
type Polls = Arc<Mutex<Vec<(f64, u64, u64, u64, bool)>>>;
/// Each long poll: (ms, wall us, user us, sys us, voluntary switches, involuntary, where).
type Long = Arc<Mutex<Vec<(f64, u64, i64, i64, i64, i64, u64)>>>;

struct Timed<F> {
    f: Pin<Box<F>>,
    at: Where,
    start: Instant,
    polls: Polls,
    thresh: u64,
    long: Long,
}

/// This thread's (user us, sys us, voluntary, involuntary context switches).
fn usage() -> (i64, i64, i64, i64) {
    // SAFETY: `rusage` is plain integers, for which all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage` for the call.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    (
        ru.ru_utime.tv_sec * 1_000_000 + ru.ru_utime.tv_usec,
        ru.ru_stime.tv_sec * 1_000_000 + ru.ru_stime.tv_usec,
        ru.ru_nvcsw,
        ru.ru_nivcsw,
    )
}

impl<F: Future> Future for Timed<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let w0 = self.at.load(Ordering::Relaxed);
        let u0 = usage();
        let t0 = Instant::now();
        let r = self.f.as_mut().poll(cx);
        let d = t0.elapsed().as_micros() as u64;
        let u1 = usage();
        if d >= self.thresh {
            self.long.lock().unwrap().push((
                t0.duration_since(self.start).as_secs_f64() * 1e3,
                d,
                u1.0 - u0.0,
                u1.1 - u0.1,
                u1.2 - u0.2,
                u1.3 - u0.3,
                w0,
            ));
        }
        let w1 = self.at.load(Ordering::Relaxed);
        let ms = t0.duration_since(self.start).as_secs_f64() * 1e3;
        self.polls
            .lock()
            .unwrap()
            .push((ms, d, w0, w1, r.is_pending()));
        r
    }
}

struct CallerYield {
    every: Duration,
    since: Instant,
}

impl CallerYield {
    fn new(us: u64) -> Self {
        CallerYield {
            every: Duration::from_micros(us),
            since: Instant::now(),
        }
    }

    async fn tick(&mut self) {
        if !self.every.is_zero() && self.since.elapsed() >= self.every {
            tokio::task::yield_now().await;
            self.since = Instant::now();
        }
    }
}

fn pct(v: &mut [u64]) -> String {
    v.sort_unstable();
    if v.is_empty() {
        return "none".into();
    }
    let q = |p: usize| v[(v.len() * p / 100).min(v.len() - 1)];
    format!(
        "n={} p50={} p90={} p99={} max={} sum={}",
        v.len(),
        q(50),
        q(90),
        q(99),
        v[v.len() - 1],
        v.iter().sum::<u64>()
    )
}

fn main() {
    let direct = std::env::var("SPILLRING_PROBE_DIRECT").is_ok();
    let yielding = std::env::var("SPILLRING_PROBE_NOYIELD").is_err();
    let total = env_or("SPILLRING_YIELD_MIB", 768usize) * MIB;
    let record = env_or("SPILLRING_YIELD_RECORD", 64 * KIB);
    let thresh = env_or("SPILLRING_PROBE_US", 1000u64);
    set_cooperative_yield(yielding);
    // A caller-side `tokio::task::yield_now` every this many us (0: never): tokio defers its
    // wake past the driver's poll, so the timer is checked at every such yield.
    let caller_us = env_or("SPILLRING_PROBE_CALLER_YIELD_US", 0u64);
    let mode = if direct {
        WriteMode::Direct
    } else {
        WriteMode::Buffered
    };
    let dir = scratch("yprobe").expect("scratch");
    let engine = Engine::open(EngineConfig::new(dir.path()).mode(mode)).expect("open");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let rec = Bytes::from(
        (0..record)
            .map(|i| (i as u8).wrapping_mul(31))
            .collect::<Vec<u8>>(),
    );
    let n = total / record;
    let wh: Where = Arc::new(AtomicU64::new(0));
    let polls = Arc::new(Mutex::new(Vec::new()));
    let long = Arc::new(Mutex::new(Vec::new()));
    let ticks: Arc<Mutex<Vec<(f64, u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let (ws, rs) = rt.block_on(async {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tk, w3, d2) = (ticks.clone(), wh.clone(), done.clone());
        let timer = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !d2.load(Ordering::Relaxed) {
                let due = every.tick().await;
                let now = Instant::now();
                tk.lock().unwrap().push((
                    now.duration_since(start).as_secs_f64() * 1e3,
                    now.saturating_duration_since(due.into_std()).as_micros() as u64,
                    w3.load(Ordering::Relaxed),
                ));
            }
        });
        let (a2, e2) = (wh.clone(), engine.clone());
        let mut cy = CallerYield::new(caller_us);
        let fut = async move {
            let task = e2.task("yprobe").unwrap();
            let t0 = Instant::now();
            let mut w = task.writer().unwrap();
            for i in 0..n {
                a2.store(at(0, i), Ordering::Relaxed);
                w.write_async(rec.clone()).await.unwrap();
                cy.tick().await;
            }
            a2.store(at(1, n), Ordering::Relaxed);
            let st = w.finish_async().await.unwrap();
            let ws = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let mut r = st.reader().unwrap();
            let mut i = 0;
            a2.store(at(2, 0), Ordering::Relaxed);
            while let Some(_b) = r.next_record_async().await.unwrap() {
                i += 1;
                a2.store(at(2, i), Ordering::Relaxed);
                cy.tick().await;
            }
            let rs = t1.elapsed().as_secs_f64();
            a2.store(at(3, 0), Ordering::Relaxed);
            drop((r, st));
            task.close();
            (ws, rs)
        };
        let timed = Timed {
            f: Box::pin(fut),
            at: wh.clone(),
            start,
            polls: polls.clone(),
            thresh,
            long: long.clone(),
        };
        let r = tokio::spawn(timed).await.unwrap();
        done.store(true, Ordering::Relaxed);
        timer.await.unwrap();
        r
    });
    let per_seg = (64 * MIB) / record;
    let polls = polls.lock().unwrap();
    let ticks = ticks.lock().unwrap();
    println!(
        "mode={mode:?} yielding={yielding} caller_yield_us={caller_us} write_s={ws:.3} read_s={rs:.3} polls={} records={n} (~{per_seg}/segment)",
        polls.len()
    );
    let mut all: Vec<u64> = ticks.iter().map(|t| t.1).collect();
    println!("timer all: {}", pct(&mut all));
    for ph in 0..4u64 {
        let mut l: Vec<u64> = ticks
            .iter()
            .filter(|t| t.2 >> 32 == ph)
            .map(|t| t.1)
            .collect();
        let mut p: Vec<u64> = polls
            .iter()
            .filter(|p| p.2 >> 32 == ph)
            .map(|p| p.1)
            .collect();
        let pend = polls.iter().filter(|p| p.2 >> 32 == ph && p.4).count();
        println!("phase {ph}: timer late us {}", pct(&mut l));
        println!("phase {ph}: spill polls us {} pending={pend}", pct(&mut p));
    }
    // Polls between two timer fires: count and sum of durations.
    let mut gaps = Vec::new();
    let mut j = 0;
    for w in ticks.windows(2) {
        let (a, b) = (w[0].0, w[1].0);
        let (mut c, mut s) = (0u64, 0u64);
        while j < polls.len() && polls[j].0 < b {
            if polls[j].0 >= a {
                c += 1;
                s += polls[j].1;
            }
            j += 1;
        }
        gaps.push((b - a, c, s, w[1].1, w[1].2));
    }
    gaps.sort_by_key(|g| std::cmp::Reverse(g.3));
    println!(
        "latest ticks: (gap since previous tick ms, spill polls in it, their sum us, late us, phase:idx)"
    );
    for g in gaps.iter().take(8) {
        println!(
            "  gap={:.2}ms polls={} sum={}us late={}us at {}:{}",
            g.0,
            g.1,
            g.2,
            g.3,
            g.4 >> 32,
            g.4 & 0xffff_ffff
        );
    }
    for (t, d, us, sy, v, iv, w0) in long.lock().unwrap().iter() {
        println!(
            "long poll t={t:9.2}ms wall={d}us user={us}us sys={sy}us vol_cs={v} invol_cs={iv} phase {} idx {} seg~{}",
            w0 >> 32,
            w0 & 0xffff_ffff,
            (w0 & 0xffff_ffff) as usize / per_seg,
        );
    }
    let _ = thresh;
    if std::env::var("SPILLRING_PROBE_TICKS").is_ok() {
        for (t, us, w) in ticks.iter() {
            println!(
                "tick t={t:9.2}ms late={:.3}ms phase={} idx={}",
                *us as f64 / 1000.0,
                w >> 32,
                w & 0xffff_ffff
            );
        }
    }
}
