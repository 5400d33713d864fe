//! Scale: 10,000 concurrent open spills (issue 10, "10,000 tasks spilling at once").
//!
//! One engine, N task scopes (one per simulated task, as an executor makes them). Three
//! phases, each holding all N at once:
//! 1. **writers**: each task opens a writer and writes `per_writer` bytes (4 KiB records);
//!    all N writers stay open;
//! 2. **held states**: each writer finishes; all N `SpilledState`s are held;
//! 3. **readers mid-read**: each state gets a reader that has read its first record; all N
//!    readers are held, then each reads the rest (every byte is checked by its frame CRC and
//!    counted).
//!
//! Reported: refused calls per phase (any error: the goal is none), extra process fds
//! (counted in `/proc/self/fd`, sampled every 250 spills; goal <= 2,048), the engine's fd
//! bound and its evictions, RSS per idle open writer (RSS delta over the writers phase / N),
//! phase times, and whether every file was deleted after. Before the bench starts, the soft
//! `RLIMIT_NOFILE` is set to 20,000 (the limit of the measurement) or the hard limit
//! if lower. `--quick` (`SPILLRING_BENCH_QUICK=1`): still 10,000 spills, 16 KiB each.

use std::time::{Duration, Instant};

use serde_json::json;
use spillring::testing::fd_stats;
use spillring::{Engine, EngineConfig, SpillReader, SpillWriter, SpilledState, TaskSpill};
use spillring_benches::{
    KIB, MIB, engine_info, quick, rss_bytes, scratch, test_mode, write_results,
};

/// Goal from issue 10: at most this many extra fds with 10,000 spills open.
const GOAL_EXTRA_FDS: usize = 2048;
const RECORD: usize = 4 * KIB;
const SAMPLE_EVERY: usize = 250;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Sets the soft `RLIMIT_NOFILE` to `want` (or the hard limit if lower); the soft limit set.
fn set_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a live rlimit; results checked.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = want.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
    r.rlim_cur
}

fn payload(task: usize, k: usize) -> Vec<u8> {
    let mut v = vec![0u8; RECORD];
    v[..8].copy_from_slice(&(task as u64).to_le_bytes());
    v[8..16].copy_from_slice(&(k as u64).to_le_bytes());
    v
}

/// Peak extra fds, sampled.
struct Peak {
    base: usize,
    max: usize,
}

impl Peak {
    fn sample(&mut self) {
        self.max = self.max.max(open_fds().saturating_sub(self.base));
    }
}

fn main() {
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"scale".contains(f.as_str())
    {
        return;
    }
    let (n, per_writer) = if test_mode() {
        (300, 16 * KIB)
    } else if quick() {
        (10_000, 16 * KIB)
    } else {
        (10_000, 128 * KIB)
    };
    let records = per_writer / RECORD;
    let nofile = set_nofile(20_000);
    let dir = scratch("scale").expect("create a scratch directory");
    // The defaults but for the segment pool (off: every file is deleted, checked below) and
    // a staging buffer of 64 KiB (the default 1 MiB staging buffer per open writer would be
    // the figure's whole story).
    let io_buffer = 64 * KIB;
    let cfg = EngineConfig::new(dir.path())
        .segment_size(MIB as u64)
        .io_buffer_size(io_buffer as u64)
        .pool_max_segments(0);
    let engine = Engine::open(cfg).expect("open engine");
    let max_open_files = fd_stats(&engine).max;
    // Warm the lanes and the reaper.
    {
        let t = engine.task("warm").expect("task");
        let mut w = t.writer().expect("writer");
        w.write_slice(&payload(0, 0)).expect("write");
        drop(w.finish().expect("finish"));
        t.close();
        assert!(engine.settle(Duration::from_secs(30)));
    }
    let base_fds = open_fds();
    let mut peak = Peak {
        base: base_fds,
        max: 0,
    };
    let tasks: Vec<TaskSpill> = (0..n)
        .map(|i| engine.task(&format!("t{i}")).expect("task"))
        .collect();
    let rss0 = rss_bytes();

    // Phase 1: n open writers, each having written `per_writer` bytes.
    let t = Instant::now();
    let mut refused_writers = 0usize;
    let mut writers: Vec<(usize, SpillWriter)> = Vec::with_capacity(n);
    for (i, task) in tasks.iter().enumerate() {
        let w = task.writer().and_then(|mut w| {
            for k in 0..records {
                w.write_slice(&payload(i, k))?;
            }
            Ok(w)
        });
        match w {
            Ok(w) => writers.push((i, w)),
            Err(e) => {
                if refused_writers == 0 {
                    eprintln!("scale: writer {i} refused: {e}");
                }
                refused_writers += 1;
            }
        }
        if i % SAMPLE_EVERY == SAMPLE_EVERY - 1 {
            peak.sample();
        }
    }
    peak.sample();
    let writers_secs = t.elapsed().as_secs_f64();
    let rss_writers = rss_bytes();
    let fds_writers = open_fds() - base_fds;
    let per_writer_rss = (rss_writers.saturating_sub(rss0)) as f64 / writers.len().max(1) as f64;

    // Phase 2: n held states.
    let t = Instant::now();
    let mut refused_states = 0usize;
    let mut states: Vec<(usize, SpilledState)> = Vec::with_capacity(n);
    for (j, (i, w)) in writers.into_iter().enumerate() {
        match w.finish() {
            Ok(s) => states.push((i, s)),
            Err(e) => {
                if refused_states == 0 {
                    eprintln!("scale: finish {i} refused: {e}");
                }
                refused_states += 1;
            }
        }
        if j % SAMPLE_EVERY == SAMPLE_EVERY - 1 {
            peak.sample();
        }
    }
    peak.sample();
    let states_secs = t.elapsed().as_secs_f64();
    let fds_states = open_fds() - base_fds;
    let rss_states = rss_bytes();

    // Phase 3: n readers, each past its first record.
    let t = Instant::now();
    let mut refused_readers = 0usize;
    let mut bad = 0usize;
    let mut readers: Vec<(usize, SpillReader)> = Vec::with_capacity(n);
    for (j, (i, s)) in states.iter().enumerate() {
        let r = s
            .reader()
            .and_then(|mut r| r.next_record().map(|rec| (r, rec)));
        match r {
            Ok((r, Some(rec))) => {
                if rec[..] != payload(*i, 0)[..] {
                    bad += 1;
                }
                readers.push((*i, r));
            }
            Ok((_, None)) => bad += 1,
            Err(e) => {
                if refused_readers == 0 {
                    eprintln!("scale: reader {i} refused: {e}");
                }
                refused_readers += 1;
            }
        }
        if j % SAMPLE_EVERY == SAMPLE_EVERY - 1 {
            peak.sample();
        }
    }
    peak.sample();
    let readers_secs = t.elapsed().as_secs_f64();
    let fds_readers = open_fds() - base_fds;
    let rss_readers = rss_bytes();
    let mut read_bytes = 0u64;
    for (i, r) in readers.iter_mut() {
        let mut k = 1;
        loop {
            match r.next_record() {
                Ok(Some(rec)) => {
                    if rec[..] != payload(*i, k)[..] {
                        bad += 1;
                    }
                    read_bytes += rec.len() as u64;
                    k += 1;
                }
                Ok(None) => break,
                Err(e) => {
                    eprintln!("scale: reading spill {i}: {e}");
                    bad += 1;
                    break;
                }
            }
        }
        if k != records {
            bad += 1;
        }
    }
    peak.sample();
    let fds = fd_stats(&engine);
    drop(readers);
    drop(states);
    for t in &tasks {
        t.close();
    }
    let settled = engine.settle(Duration::from_secs(300));
    let m = engine.metrics();
    let files_left = std::fs::read_dir(dir.path())
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_dir(e.path()).ok())
                .map(|sub| sub.count())
                .sum::<usize>()
        })
        .unwrap_or(0);
    let refused = refused_writers + refused_states + refused_readers;
    eprintln!(
        "scale: {n} spills x {} KiB: refused {refused}, peak extra fds {} (bound {max_open_files}), RSS per idle open writer {:.0} B, bad records {bad}, files left {files_left}",
        per_writer / KIB,
        peak.max,
        per_writer_rss,
    );
    let info = engine_info(&engine);
    drop(tasks);
    drop(engine);
    let met = refused == 0 && peak.max <= GOAL_EXTRA_FDS && bad == 0 && files_left == 0;
    write_results(
        "scale",
        &json!({
            "bench": "scale",
            "what": "10,000 concurrent open spills: writers that each wrote the given bytes, then their held states, then readers mid-read, all held at once by one engine; extra fds counted in /proc/self/fd",
            "engine": info,
            "spills": n,
            "bytes_per_writer": per_writer,
            "record_bytes": RECORD,
            "io_buffer_size": io_buffer,
            "segment_size": MIB,
            "rlimit_nofile_soft": nofile,
            "max_open_files": max_open_files,
            "goal_extra_fds_max": GOAL_EXTRA_FDS,
            "refused": refused,
            "refused_writers": refused_writers,
            "refused_states": refused_states,
            "refused_readers": refused_readers,
            "bad_records": bad,
            "read_bytes": read_bytes,
            "peak_extra_fds": peak.max,
            "extra_fds_writers": fds_writers,
            "extra_fds_states": fds_states,
            "extra_fds_readers": fds_readers,
            "fd_evictions": fds.evictions,
            "rss_bytes_per_idle_writer": per_writer_rss,
            "rss_delta_writers_bytes": rss_writers.saturating_sub(rss0),
            "rss_delta_states_bytes": rss_states.saturating_sub(rss0),
            "rss_delta_readers_bytes": rss_readers.saturating_sub(rss0),
            "phase_seconds": {"writers": writers_secs, "states": states_secs, "readers": readers_secs},
            "settled": settled,
            "files_left": files_left,
            "files_deleted": m.files_deleted,
            "met": met,
        }),
    )
    .expect("write the bench results");
}
