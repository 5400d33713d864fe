//! `loadgen crash`: runs `loadgen run` as a child process on a root, SIGKILLs it at a random
//! moment while it has segment files on disk, reopens an engine on the same root, waits for the
//! sweep, and checks on the filesystem that nothing of the dead process is left, that the
//! caller-owned published files were not touched, and that a bystander engine's live spill
//! (open across every kill and sweep) is intact. Repeats `--kills N` times.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use spillring::{Engine, EngineConfig, SpilledState, TaskSpill};

use crate::args::{Backend, CrashArgs, Progress, Workload};
use crate::check::{self, FileId};
use crate::data::{Expect, Pool, Rng, mix, record_len};
use crate::progress::Out;
use crate::report::{self, Leaks, Machine, lat_cell, table};
use crate::run::finish_report;
use crate::stats::{LatSummary, Violation, new_hist, record, summarize};

#[derive(Debug, Serialize)]
pub struct CrashReport {
    pub kind: &'static str,
    pub name: String,
    pub loadgen_version: &'static str,
    pub seed: u64,
    pub commit: String,
    pub command: Vec<String>,
    pub machine: Machine,
    pub root: PathBuf,
    pub config: Workload,
    /// `--backend`: `auto`, or the backend that had to run.
    pub backend_requested: Backend,
    /// The backend the engines that swept after each kill ran on ("io_uring" or "psync").
    pub backend: String,
    pub elapsed_secs: f64,
    pub kills: u64,
    /// Segment files of the killed children on disk right after their deaths.
    pub orphan_files_total: u64,
    pub orphan_files_swept: u64,
    pub kill_reports: Vec<KillReport>,
    pub latency: BTreeMap<&'static str, LatSummary>,
    pub bystander_ok: bool,
    pub leaks: Leaks,
    pub violation_count: u64,
    pub violations: Vec<Violation>,
    pub passed: bool,
}

#[derive(Debug, Serialize)]
pub struct KillReport {
    pub kill: u32,
    pub child_pid: u32,
    pub dead_engine: String,
    /// How long the child ran after its first segment file appeared.
    pub delay_ms: u64,
    pub segment_files_at_kill: u64,
    pub task_dirs_at_kill: u64,
    pub published_files_at_kill: u64,
    /// Orphan files the next engine's sweep deleted (its metric).
    pub orphan_files_swept: u64,
    /// From the next engine's open until the root held nothing of the dead process.
    pub sweep_ms: f64,
    pub child_status: String,
}

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

/// A spill of another engine, kept open across every kill: it must survive the sweeps.
struct Bystander {
    engine: Engine,
    task: TaskSpill,
    state: SpilledState,
    expect: Vec<Expect>,
}

fn bystander(w: &Workload, root: &Path, seed: u64) -> Result<Bystander, String> {
    let roots = w.spill_roots(root);
    let mut cfg = EngineConfig::new(&roots[0]);
    for r in &roots[1..] {
        cfg = cfg.add_root(r);
    }
    let engine = Engine::open(cfg.segment_size(64 << 10).io_buffer_size(16 << 10))
        .map_err(|e| format!("open the bystander engine: {e}"))?;
    let task = engine
        .task("bystander")
        .map_err(|e| format!("bystander task: {e}"))?;
    let mut w = task
        .writer()
        .map_err(|e| format!("bystander writer: {e}"))?;
    let pool = Pool::new(seed, 1 << 20);
    let mut rng = Rng::new(mix(seed ^ 0xB157));
    let mut expect = Vec::new();
    for _ in 0..400 {
        let len = record_len(&mut rng, 32 << 10);
        let rec: Bytes = pool.record(&mut rng, len);
        expect.push(Expect::of(&rec));
        w.write(rec).map_err(|e| format!("bystander write: {e}"))?;
    }
    let state = w.finish().map_err(|e| format!("bystander finish: {e}"))?;
    Ok(Bystander {
        engine,
        task,
        state,
        expect,
    })
}

impl Bystander {
    /// Reads the spill back and checks it; then closes everything.
    fn verify_and_close(self, st: &mut State) -> bool {
        let mut ok = true;
        match self.state.reader() {
            Ok(mut r) => {
                let mut i = 0;
                loop {
                    match r.next_record() {
                        Ok(Some(b)) => {
                            if let Some(why) = self.expect.get(i).and_then(|e| e.mismatch(&b)) {
                                st.bad(
                                    "bystander",
                                    format!("record {i}: {why}"),
                                    "bystander spill".into(),
                                );
                                ok = false;
                                break;
                            }
                            i += 1;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            st.bad(
                                "bystander",
                                format!(
                                    "a live engine's spill was damaged by a sweep: record {i}: {e}"
                                ),
                                format!("{:?}", self.state.paths()),
                            );
                            ok = false;
                            break;
                        }
                    }
                }
                if ok && i != self.expect.len() {
                    st.bad(
                        "bystander",
                        format!("read {i} records, {} were written", self.expect.len()),
                        "bystander spill".into(),
                    );
                    ok = false;
                }
            }
            Err(e) => {
                st.bad(
                    "bystander",
                    format!("reader: {e}"),
                    "bystander spill".into(),
                );
                ok = false;
            }
        }
        drop(self.state);
        self.task.close();
        if !self.engine.settle(Duration::from_secs(30)) {
            st.bad(
                "settle",
                "the bystander engine did not settle".into(),
                "bystander".into(),
            );
        }
        let r = self.engine.shutdown(Duration::from_secs(10));
        if !r.drained || r.tickets_held != 0 {
            st.bad(
                "leak",
                format!("bystander shutdown left work: {r:?}"),
                "bystander".into(),
            );
        }
        ok
    }
}

pub fn main(a: CrashArgs) -> i32 {
    let seed = a.workload.seed.unwrap_or_else(report::clock_seed);
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
        backends.insert(engine.backend());
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
    let deadline = Instant::now() + Duration::from_secs(2);
    let fds = loop {
        match check::leaked_fds(fds_before) {
            Ok(f) if !f.is_empty() && Instant::now() <= deadline => {}
            Ok(f) => break f,
            Err(e) => {
                st.bad(
                    "check",
                    format!("the fd leak check cannot run: {e}"),
                    check::PROC_FDS.into(),
                );
                break Vec::new();
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    for f in fds {
        leaks.fds += 1;
        st.bad("leak", format!("fd leaked: {f}"), check::PROC_FDS.into());
    }
    match check::spill_maps(root) {
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
        kind: "crash",
        name: a.name.clone(),
        loadgen_version: env!("CARGO_PKG_VERSION"),
        seed,
        commit: report::commit().to_owned(),
        command: std::env::args().collect(),
        machine: report::machine(root.parent().unwrap_or(root)),
        root: root.to_path_buf(),
        config: a.workload.clone(),
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

fn spawn_child(
    exe: &Path,
    root: &Path,
    seed: u64,
    w: &Workload,
    log: &Path,
) -> Result<Child, String> {
    let log = std::fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
    Command::new(exe)
        .arg("run")
        .arg("--root")
        .arg(root)
        .args(["--seed", &seed.to_string()])
        .args([
            "--duration",
            "3600",
            "--progress",
            "none",
            "--stall-secs",
            "3600",
            "--crash-child",
        ])
        .args(w.child_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", exe.display()))
}

/// Waits for the child's READY line; returns its engine's process directories (one per root).
fn wait_ready(child: &mut Child, timeout: Duration) -> Result<Vec<PathBuf>, String> {
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    if let Some(p) = line.trim().strip_prefix("LOADGEN-READY ") {
                        let _ = tx.send(Some(p.split('\t').map(PathBuf::from).collect()));
                        // Keep draining so the child never blocks on a full pipe.
                        let mut sink = String::new();
                        while r.read_line(&mut sink).is_ok_and(|n| n > 0) {
                            sink.clear();
                        }
                        return;
                    }
                }
            }
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(Some(p)) => Ok(p),
        Ok(None) => Err("the child exited before it was ready".into()),
        Err(_) => Err("the child did not get ready in time".into()),
    }
}

/// A child's log file, removed when the kill is done with it (or the series gave up).
struct ChildLog(PathBuf);

impl Drop for ChildLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn child_log_violations(log: &Path, st: &mut State, k: u32) {
    let Ok(text) = std::fs::read_to_string(log) else {
        return;
    };
    for l in text
        .lines()
        .filter(|l| l.contains("VIOLATION") || l.contains("STALL") || l.contains("panicked"))
    {
        st.bad(
            "child",
            l.to_owned(),
            format!("child {k} ({})", log.display()),
        );
    }
}

fn count_segments(dirs: &[PathBuf]) -> usize {
    dirs.iter()
        .map(|d| check::scan_root(d, &[], &[]).map_or(0, |s| s.segment_files.len()))
        .sum()
}

/// True if no segment file under `root` was written by engine `dead`, looking into every
/// directory except live bystanders'.
fn nothing_of(root: &Path, dead: u64, ours: &[PathBuf], bystanders: &[PathBuf]) -> bool {
    let Ok(s) = check::scan_root(root, ours, bystanders) else {
        return false;
    };
    !s.segment_files
        .iter()
        .any(|f| check::segment_engine(f).is_none_or(|id| id == dead))
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, FileId)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let p = e.path();
            check::file_id(&p).ok().map(|id| (p, id))
        })
        .collect()
}

fn summary(r: &CrashReport) -> String {
    let rows = vec![
        ("seed".to_string(), r.seed.to_string()),
        ("commit".into(), r.commit.clone()),
        (
            "backend".into(),
            format!(
                "{} (--backend {})",
                r.backend,
                crate::args::value_name(r.backend_requested)
            ),
        ),
        ("elapsed".into(), format!("{:.1} s", r.elapsed_secs)),
        ("kills".into(), r.kills.to_string()),
        (
            "segment files at the kills".into(),
            format!(
                "{} (swept by the next open: {})",
                r.orphan_files_total, r.orphan_files_swept
            ),
        ),
        ("open-to-clean sweep".into(), lat_cell(&r.latency["sweep"])),
        ("bystander spill intact".into(), r.bystander_ok.to_string()),
        (
            "leaks".into(),
            format!(
                "files {}, dirs {}, fds {}, maps {}",
                r.leaks.files, r.leaks.dirs, r.leaks.fds, r.leaks.maps
            ),
        ),
        ("violations".into(), r.violation_count.to_string()),
        (
            "result".into(),
            if r.passed {
                "PASSED".into()
            } else {
                "FAILED".into()
            },
        ),
    ];
    table(&format!("loadgen crash `{}`", r.name), &rows)
}
