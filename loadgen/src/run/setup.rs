//! The first step of a run: the root and the published directory, the engine (with the fault
//! plan), the abort-to-clean watcher, the context the workers share, and the tokio runtime.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillring::{Engine, FaultPlan};

use super::{backend_mismatch, engine_config, fault_plan};
use crate::args::RunArgs;
use crate::data::Pool;
use crate::progress::Out;
use crate::scenario::{Ctx, Slot};
use crate::stats::Stats;
use crate::watch::Watcher;

/// What a run set up, for the steps after it. (The fields drop in this order on an error.)
#[derive(Debug)]
pub(super) struct Setup {
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) ctx: Arc<Ctx>,
    /// When the workers' clock started (the deadline of `--duration` counts from it).
    pub(super) start: Instant,
    /// The engine's process directories, one per root.
    pub(super) proc_dirs: Vec<PathBuf>,
    pub(super) engine: Engine,
    pub(super) plan: Option<Arc<FaultPlan>>,
    pub(super) published_dir: PathBuf,
    /// The backend the engine runs on.
    pub(super) backend: &'static str,
}

/// Sets a run up; the watcher comes apart from the rest because the checks consume it.
pub(super) fn setup(
    a: &RunArgs,
    seed: u64,
    root: &Path,
    duration: Option<f64>,
    out: &Out,
) -> Result<(Setup, Watcher), String> {
    let w = &a.workload;
    std::fs::create_dir_all(root).map_err(|e| format!("create root {}: {e}", root.display()))?;
    let published_dir = root.join("loadgen-published");
    std::fs::create_dir_all(&published_dir)
        .map_err(|e| format!("create {}: {e}", published_dir.display()))?;
    let plan = (w.fault_rate > 0.0).then(|| fault_plan(seed, w.fault_rate, &w.fault_points));
    let mut cfg = engine_config(w, root);
    if let Some(p) = &plan {
        cfg = cfg.fault_plan(p.clone());
    }
    let engine = Engine::open(cfg).map_err(|e| format!("open engine: {e}"))?;
    let backend = engine.backend();
    let backend_wrong = backend_mismatch(w.backend, backend);
    if !a.crash_child {
        out.line(&format!(
            "loadgen run: backend {backend} (--backend {})",
            crate::args::value_name(w.backend)
        ));
    }
    let proc_dirs = engine.process_dirs();
    if a.crash_child {
        let dirs: Vec<String> = proc_dirs.iter().map(|d| d.display().to_string()).collect();
        println!("LOADGEN-READY {}", dirs.join("\t"));
        let _ = std::io::stdout().flush();
    }
    let watcher = Watcher::start(proc_dirs.clone()).map_err(|e| format!("start watcher: {e}"))?;
    let tasks = w.tasks as usize;
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        engine: engine.clone(),
        seed,
        points: w.points(),
        abort_rate: w.abort_rate,
        faults: plan.is_some(),
        read_rate: w.read_rate,
        publish_rate: w.publish_rate,
        max_task_bytes: w.max_task_bytes,
        max_record: w.max_record,
        segment_size: w.segment_size,
        io_buffer_size: w.io_buffer_size.min(w.segment_size),
        pool: Pool::new(
            seed,
            (w.max_record as usize).clamp(4 << 20, 256 << 20) + (1 << 20),
        ),
        stats: Stats::default(),
        out: out.clone(),
        watch: watcher.tx(),
        published_dir: published_dir.clone(),
        published: Mutex::new(Vec::new()),
        survivors: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        next_op: AtomicU64::new(0),
        ops_limit: w.ops,
        deadline: duration.map(|d| start + Duration::from_secs_f64(d)),
        slots: (0..tasks).map(|_| Slot::default()).collect(),
    });
    if let Some(why) = &backend_wrong {
        // Not the run that was asked for: no op runs; the checks and the report still do.
        ctx.violation(
            "backend",
            why.clone(),
            format!("engine {:016x}", engine.id()),
            None,
        );
        ctx.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(w.runtime_threads as usize)
        .enable_time()
        .thread_name("loadgen-async")
        .build()
        .map_err(|e| format!("start the tokio runtime: {e}"))?;
    let s = Setup {
        rt,
        ctx,
        start,
        proc_dirs,
        engine,
        plan,
        published_dir,
        backend: backend.as_str(),
    };
    Ok((s, watcher))
}
