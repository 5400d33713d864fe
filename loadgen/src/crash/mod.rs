//! `loadgen crash`: runs `loadgen run` as a child process on a root, SIGKILLs it at a random
//! moment while it has segment files on disk, reopens an engine on the same root, waits for the
//! sweep, and checks on the filesystem that nothing of the dead process is left, that the
//! caller-owned published files were not touched, and that a bystander engine's live spill
//! (open across every kill and sweep) is intact. Repeats `--kills N` times.
//!
//! The parts: [`child`] (the `run` child: its start, its log, what it leaves on disk),
//! [`bystander`] (the other engine's spill that must survive) and [`report`] (the JSON report
//! and the summary).

mod bystander;
mod child;
mod report;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use spillring::Engine;

use crate::args::{CrashArgs, Progress};
use crate::check;
use crate::data::{Rng, mix};
use crate::progress::Out;
use crate::report::Leaks;
use crate::run::finish_report;
use crate::stats::{Violation, new_hist, record, summarize};

use bystander::bystander;
use child::{
    ChildLog, child_log_violations, count_segments, nothing_of, snapshot, spawn_child, wait_ready,
};
use report::{CrashReport, KillReport, summary};

struct State {
    out: Out,
    violations: Vec<Violation>,
    count: u64,
}

impl State {
    fn bad(&mut self, kind: &'static str, what: String, at: String) {
        let v = Violation {
            kind,
            what,
            at,
            op: None,
        };
        self.out.line(&v.to_string());
        self.count += 1;
        if self.violations.len() < 500 {
            self.violations.push(v);
        }
    }
}

pub fn main(a: CrashArgs) -> i32 {
    let seed = a.workload.seed.unwrap_or_else(crate::report::clock_seed);
    // Without it there is no fd leak check: a run that cannot check must not pass.
    let fds_before = match check::fds() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("loadgen crash: {e}");
            return crate::EXIT_SETUP;
        }
    };
    let (root, own_root) = match &a.workload.root {
        Some(r) => (r.clone(), false),
        None => (crate::run::fresh_root("loadgen-crash", seed), true),
    };
    let out = match a.progress {
        Progress::None => Out::quiet(),
        _ => Out::new(
            Progress::Plain,
            crate::progress::Goal::Ops(u64::from(a.kills)),
        ),
    };
    let quiet = matches!(a.progress, Progress::None);
    if !quiet {
        out.line(&format!(
            "loadgen crash: seed {seed}, root {}, {} kills",
            root.display(),
            a.kills
        ));
    }
    let mut st = State {
        out: out.clone(),
        violations: Vec::new(),
        count: 0,
    };
    let rep = match execute(&a, seed, &root, &mut st, quiet, &fds_before) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen crash: {e}");
            if own_root {
                crate::run::remove_fresh_root(&root, &a.workload, "loadgen crash");
            }
            return crate::EXIT_SETUP;
        }
    };
    if own_root && rep.leaks.total() == 0 {
        let _ = std::fs::remove_dir(&root);
    } else if rep.leaks.total() > 0 {
        eprintln!(
            "loadgen crash: the root is kept for inspection: {}",
            root.display()
        );
    }
    finish_report(&rep, a.report.as_deref(), a.json, &summary(&rep))
}

fn execute(
    a: &CrashArgs,
    seed: u64,
    root: &Path,
    st: &mut State,
    quiet: bool,
    fds_before: &BTreeMap<i32, String>,
) -> Result<CrashReport, String> {
    let start = Instant::now();
    std::fs::create_dir_all(root).map_err(|e| format!("create root {}: {e}", root.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("find own binary: {e}"))?;
    let published_dir = root.join("loadgen-published");
    let by = bystander(&a.workload, root, seed)?;
    let spill_roots = a.workload.spill_roots(root);
    let by_dirs = by.engine.process_dirs();
    let mut rng = Rng::new(mix(seed ^ 0xC4A5));
    let mut sweep = new_hist();
    let mut kills = Vec::new();
    let mut orphan_files_total = 0;
    let mut orphan_files_swept = 0;
    let mut backends = std::collections::BTreeSet::new();
    for k in 0..a.kills {
        let child_seed = mix(seed.wrapping_add(u64::from(k) + 1));
        let log_file = ChildLog(
            std::env::temp_dir().join(format!("loadgen-crash-{}-child{k}.log", std::process::id())),
        );
        let log = log_file.0.as_path();
        let mut child = spawn_child(&exe, root, child_seed, &a.workload, log)?;
        let pid = child.id();
        let ready = wait_ready(&mut child, Duration::from_secs(30));
        let dead_dirs = match ready {
            Ok(d) => d,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                child_log_violations(log, st, k);
                // What the child said (e.g. that the engine refused the configuration).
                let said = std::fs::read_to_string(log).unwrap_or_default();
                let said = said.trim();
                return Err(if said.is_empty() {
                    format!("child {k}: {e}")
                } else {
                    format!("child {k}: {e}; it said: {said}")
                });
            }
        };
        let dead_id = dead_dirs
            .first()
            .and_then(|d| check::proc_dir_engine(d))
            .unwrap_or(0);
        // Kill it while it has files on disk: wait for the first segment, then a random delay.
        let first = Instant::now();
        while count_segments(&dead_dirs) == 0 && first.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(2));
        }
        let span = a.max_delay_ms.saturating_sub(a.min_delay_ms);
        let delay = Duration::from_millis(a.min_delay_ms + rng.below(span + 1));
        std::thread::sleep(delay);
        if let Ok(Some(s)) = child.try_wait() {
            st.bad(
                "crash",
                format!("the child exited by itself before the kill: {s}"),
                format!("child {k} pid {pid}"),
            );
        }
        let _ = child.kill(); // SIGKILL
        let status = child
            .wait()
            .map_err(|e| format!("wait for child {k}: {e}"))?;
        let status_s = match status.signal() {
            Some(sig) => format!("killed by signal {sig}"),
            None => format!("exited: {status}"),
        };
        child_log_violations(log, st, k);
        // What the dead process left.
        let (mut files_at_kill, mut dirs_at_kill) = (0, 0);
        for d in &dead_dirs {
            if let Ok(s) = check::scan_root(d, &[], &[]) {
                files_at_kill += s.segment_files.len() as u64;
                dirs_at_kill += s.dirs.len() as u64;
            }
        }
        orphan_files_total += files_at_kill;
        let published = snapshot(&published_dir);

        // The next engine on the root sweeps the dead one's directory in the background.
        let t0 = Instant::now();
        let engine = Engine::open(crate::run::engine_config(&a.workload, root))
            .map_err(|e| format!("reopen: {e}"))?;
        if let Some(why) = crate::run::backend_mismatch(a.workload.backend, engine.backend()) {
            st.bad("backend", why, format!("kill {k}: reopened engine"));
        }
        backends.insert(engine.backend().as_str());
        let settled = engine.settle(Duration::from_secs(60));
        let mut gone = false;
        while t0.elapsed() < Duration::from_secs(60) {
            if dead_dirs.iter().all(|d| !d.exists())
                && nothing_of(root, dead_id, &engine.process_dirs(), &by_dirs)
            {
                gone = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let took = t0.elapsed();
        record(&mut sweep, took);
        let at = format!("kill {k}: dead engine {dead_id:016x} ({dead_dirs:?})");
        if !settled {
            st.bad(
                "settle",
                "the reopened engine did not settle within 60 s".into(),
                at.clone(),
            );
        }
        if !gone {
            st.bad(
                "leak",
                "files of the dead process are still under the root after the sweep".into(),
                at.clone(),
            );
        }
        let own = engine.process_dirs();
        match check::scan_root(root, &own, std::slice::from_ref(&published_dir)) {
            Ok(s) => {
                for f in &s.segment_files {
                    let owner = check::segment_engine(f);
                    st.bad(
                        "leak",
                        format!(
                            "segment file left after the sweep (written by engine {})",
                            owner.map_or_else(|| "?".into(), |id| format!("{id:016x}"))
                        ),
                        f.display().to_string(),
                    );
                }
                for d in s
                    .dirs
                    .iter()
                    .filter(|d| !own.contains(d) && !spill_roots.contains(d))
                {
                    st.bad(
                        "leak",
                        "directory left after the sweep".into(),
                        d.display().to_string(),
                    );
                }
                for f in &s.other_files {
                    st.bad(
                        "leak",
                        "stray file left after the sweep".into(),
                        f.display().to_string(),
                    );
                }
                if s.live_dirs != by_dirs {
                    st.bad(
                        "crash",
                        format!("live engines under the root: {:?}, expected only the bystander {by_dirs:?}", s.live_dirs),
                        root.display().to_string(),
                    );
                }
            }
            Err(e) => st.bad("check", format!("scan: {e}"), root.display().to_string()),
        }
        // Published files are the caller's: the sweep must not touch them. Then loadgen
        // deletes them.
        for (p, id) in &published {
            match check::file_id(p) {
                Ok(now) if now == *id => {}
                Ok(now) => st.bad(
                    "published",
                    format!("changed by the sweep: {id:?} -> {now:?}"),
                    p.display().to_string(),
                ),
                Err(e) => st.bad(
                    "published",
                    format!("deleted by the sweep: {e}"),
                    p.display().to_string(),
                ),
            }
            let _ = std::fs::remove_file(p);
        }
        let swept = engine.metrics().orphan_files_swept;
        orphan_files_swept += swept;
        let r = engine.shutdown(Duration::from_secs(10));
        if !r.drained || r.tickets_held != 0 {
            st.bad(
                "leak",
                format!("the reopened engine's shutdown left work: {r:?}"),
                at.clone(),
            );
        }
        drop(engine);
        if !quiet {
            st.out.line(&format!(
                "loadgen crash: kill {}/{}: pid {pid} ({status_s}) after {} ms with {files_at_kill} segment files in {dirs_at_kill} task dirs; swept {swept} in {:.1} ms",
                k + 1,
                a.kills,
                delay.as_millis(),
                took.as_secs_f64() * 1000.0
            ));
        }
        kills.push(KillReport {
            kill: k,
            child_pid: pid,
            dead_engine: format!("{dead_id:016x}"),
            delay_ms: delay.as_millis() as u64,
            segment_files_at_kill: files_at_kill,
            task_dirs_at_kill: dirs_at_kill,
            published_files_at_kill: published.len() as u64,
            orphan_files_swept: swept,
            sweep_ms: took.as_secs_f64() * 1000.0,
            child_status: status_s,
        });
    }
    let bystander_ok = by.verify_and_close(st);
    let _ = std::fs::remove_dir(&published_dir);

    // Nothing may be left: no file, no directory, no fd, no map.
    let mut leaks = Leaks::default();
    match check::scan_root(root, &[], &[]) {
        Ok(mut s) => {
            s.dirs.retain(|d| !spill_roots.contains(d));
            if s.is_empty() && s.live_dirs.is_empty() {
                for r in spill_roots.iter().filter(|r| r.as_path() != root) {
                    let _ = std::fs::remove_dir(r);
                }
            }
            leaks.files = (s.segment_files.len() + s.other_files.len()) as u64;
            leaks.dirs = (s.dirs.len() + s.live_dirs.len()) as u64;
            for p in s
                .segment_files
                .iter()
                .chain(&s.other_files)
                .chain(&s.dirs)
                .chain(&s.live_dirs)
            {
                leaks.examples.push(p.display().to_string());
                st.bad(
                    "leak",
                    "left under the root at the end".into(),
                    p.display().to_string(),
                );
            }
        }
        Err(e) => st.bad("check", format!("scan: {e}"), root.display().to_string()),
    }
    let fds =
        match check::poll_until_empty(Duration::from_secs(2), || check::leaked_fds(fds_before)) {
            Ok(f) => f,
            Err(e) => {
                st.bad(
                    "check",
                    format!("the fd leak check cannot run: {e}"),
                    check::PROC_FDS.into(),
                );
                Vec::new()
            }
        };
    for f in fds {
        leaks.fds += 1;
        st.bad("leak", format!("fd leaked: {f}"), check::PROC_FDS.into());
    }
    match check::poll_until_empty(Duration::from_secs(2), || check::spill_maps(root)) {
        Ok(maps) => {
            for l in maps {
                leaks.maps += 1;
                st.bad(
                    "leak",
                    format!("segment still mapped: {l}"),
                    check::PROC_MAPS.into(),
                );
            }
        }
        Err(e) => st.bad(
            "check",
            format!("the map leak check cannot run: {e}"),
            check::PROC_MAPS.into(),
        ),
    }
    let mut latency = BTreeMap::new();
    latency.insert("sweep", summarize(&sweep));
    let passed = st.count == 0 && leaks.total() == 0 && bystander_ok;
    Ok(CrashReport {
        head: crate::report::ReportHead::new("crash", &a.name, seed, root, &a.workload),
        backend_requested: a.workload.backend,
        backend: backends.into_iter().collect::<Vec<_>>().join(","),
        elapsed_secs: start.elapsed().as_secs_f64(),
        kills: kills.len() as u64,
        orphan_files_total,
        orphan_files_swept,
        kill_reports: kills,
        latency,
        bystander_ok,
        leaks,
        violation_count: st.count,
        violations: st.violations.clone(),
        passed,
    })
}
