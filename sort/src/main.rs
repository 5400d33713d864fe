//! `spillring-sort`: sorts a file of 100-byte records larger than its memory budget through
//! spillring (see the crate docs), or generates such a file.
//!
//! ```text
//! spillring-sort --input in.dat --output out.dat --budget 256M [--spill-dir DIR] [--no-progress]
//! spillring-sort --generate 2684354 --seed 1 --output in.dat
//! ```
//!
//! Ctrl-C cancels the sort's task scope: the engine deletes every spilled run, the partial
//! output is removed, and the process exits with status 130.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use spillring::Engine;
use spillring_sort::{Plan, SortError, SortOptions, generate, parse_size, sort_file};

#[derive(Parser, Debug)]
#[command(version, about = "External sort of 100-byte records through spillring")]
struct Cli {
    /// The input file of 100-byte records.
    #[arg(long, required_unless_present = "generate")]
    input: Option<PathBuf>,
    /// The output file.
    #[arg(long)]
    output: PathBuf,
    /// Memory budget for run buffers and the merge (bytes, or with K, M, G).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    budget: usize,
    /// Where the runs are spilled (default: a directory next to the output, removed after).
    #[arg(long)]
    spill_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Generate this many records into --output instead of sorting.
    #[arg(long)]
    generate: Option<u64>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 20261201)]
    seed: u64,
    /// Test hook: once the runs are spilled, print "spilled" and wait for Ctrl-C.
    #[arg(long, hide = true)]
    hold_after_spill: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(SortError::Cancelled) => {
            eprintln!("cancelled: spilled runs deleted, partial output removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), SortError> {
    if let Some(n) = cli.generate {
        return generate(&cli.output, n, cli.seed);
    }
    let Some(input) = cli.input.clone() else {
        unreachable!("clap requires --input without --generate")
    };
    let len = std::fs::metadata(&input)
        .map_err(|source| SortError::Io {
            op: "stat",
            path: input.clone(),
            source,
        })?
        .len();
    let plan = Plan::new(len, cli.budget)?;
    let (spill_dir, made) = match &cli.spill_dir {
        Some(d) => (d.clone(), false),
        None => {
            let parent = cli
                .output
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            (parent.join(".spillring-sort-spill"), true)
        }
    };
    std::fs::create_dir_all(&spill_dir).map_err(|source| SortError::Io {
        op: "create",
        path: spill_dir.clone(),
        source,
    })?;
    let engine = Engine::open(plan.engine_config(&spill_dir))?;
    let task = engine.task("external-sort")?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let (task, cancel) = (task.clone(), cancel.clone());
        // The handler runs on ctrlc's own thread: cancelling the scope there is fine.
        ctrlc::set_handler(move || {
            cancel.store(true, Ordering::Release);
            task.cancel();
        })
        .map_err(|e| SortError::Io {
            op: "install Ctrl-C handler",
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })?;
    }
    let opts = SortOptions {
        input,
        output: cli.output.clone(),
        plan,
        progress: !cli.no_progress,
    };
    let hold = || {
        if cli.hold_after_spill {
            eprintln!("spilled");
            let t = Instant::now();
            while !cancel.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    };
    let t = Instant::now();
    let r = sort_file(&opts, &task, &cancel, &hold);
    // Success or not, the scope's close deletes whatever is still spilled; the shutdown
    // waits for those deletes (and reports any it could not confirm).
    if r.is_err() {
        task.cancel();
    } else {
        task.close();
    }
    drop(task);
    let left = engine.shutdown(Duration::from_secs(30));
    if made {
        let _ = std::fs::remove_dir_all(&spill_dir);
    }
    let report = r?;
    eprintln!(
        "sorted {} records in {:.2} s (runs {:.2} s: {} runs in {} segments of {} KiB; merge {:.2} s); shutdown: {left:?}",
        report.records,
        t.elapsed().as_secs_f64(),
        report.run_phase.as_secs_f64(),
        report.runs,
        report.segments,
        plan.segment_size >> 10,
        report.merge_phase.as_secs_f64(),
    );
    Ok(())
}
