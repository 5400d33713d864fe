//! Reports: the JSON a run or a crash series writes, the summary table it prints, what
//! machine and commit it ran on, and `summarize`, which merges reports into the checked-in
//! `results/loadgen.json` and `results/LOADGEN.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::args::SummarizeArgs;
use crate::stats::LatSummary;

/// Where a report was made.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub root_fs: String,
}

pub fn machine(root: &Path) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| (kib / (1024.0 * 1024.0) * 10.0).round() / 10.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        memory_gib,
        kernel,
        root_fs: fs_type(root),
    }
}

/// The filesystem type of `p`, from the mount table (longest mount point that holds it).
fn fs_type(p: &Path) -> String {
    let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for l in mounts.lines() {
        let mut f = l.split_whitespace();
        let (Some(_dev), Some(mnt), Some(ty)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let mnt = mnt.replace("\\040", " ");
        if p.starts_with(&mnt) && best.as_ref().is_none_or(|(n, _)| mnt.len() > *n) {
            best = Some((mnt.len(), ty.to_owned()));
        }
    }
    best.map_or_else(|| "unknown".to_owned(), |(_, t)| t)
}

/// What every loadgen report opens with: what ran, from which build, where, with which
/// workload. Flattened into the report's JSON, so its fields stay top-level keys.
#[derive(Debug, Serialize)]
pub struct ReportHead {
    pub kind: &'static str,
    pub name: String,
    pub loadgen_version: &'static str,
    pub seed: u64,
    pub commit: String,
    pub command: Vec<String>,
    pub machine: Machine,
    pub root: std::path::PathBuf,
    pub config: crate::args::Workload,
}

impl ReportHead {
    pub fn new(
        kind: &'static str,
        name: &str,
        seed: u64,
        root: &Path,
        config: &crate::args::Workload,
    ) -> Self {
        ReportHead {
            kind,
            name: name.to_owned(),
            loadgen_version: env!("CARGO_PKG_VERSION"),
            seed,
            commit: commit().to_owned(),
            command: std::env::args().collect(),
            machine: machine(root.parent().unwrap_or(root)),
            root: root.to_path_buf(),
            config: config.clone(),
        }
    }
}

/// The commit loadgen was built from, embedded at compile time by build.rs (`git rev-parse
/// --short HEAD` in its source tree, `-dirty` when files there differ from it; "unknown"
/// without git). Never the commit of whatever repository the current directory is in.
pub fn commit() -> &'static str {
    env!("SPILLRING_COMMIT")
}

/// A seed from the clock, for runs without `--seed`.
pub fn clock_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    crate::data::mix(t ^ u64::from(std::process::id()))
}

/// Leaks found after a run (each must be 0).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Leaks {
    pub files: u64,
    pub tickets: u64,
    pub dirs: u64,
    pub fds: u64,
    pub maps: u64,
    pub published_missing: u64,
    /// A few of the leaked things, with where they are.
    pub examples: Vec<String>,
}

impl Leaks {
    pub fn total(&self) -> u64 {
        self.files + self.tickets + self.dirs + self.fds + self.maps + self.published_missing
    }
}

/// Renders rows as an aligned two-column table.
pub fn table(title: &str, rows: &[(String, String)]) -> String {
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = format!("{title}\n");
    for (k, v) in rows {
        let _ = writeln!(s, "  {k:<w$}  {v}");
    }
    s
}

pub fn lat_cell(l: &LatSummary) -> String {
    if l.count == 0 {
        return "-".into();
    }
    format!(
        "p50 {} p99 {} p99.9 {} max {} (n={})",
        us(l.p50_us),
        us(l.p99_us),
        us(l.p999_us),
        us(l.max_us),
        l.count
    )
}

pub fn us(v: f64) -> String {
    if v >= 1_000_000.0 {
        format!("{:.2} s", v / 1e6)
    } else if v >= 1000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else {
        format!("{v:.1} µs")
    }
}

pub fn mib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

pub fn write_json(path: &Path, v: &impl Serialize) -> std::io::Result<()> {
    if let Some(d) = path.parent()
        && !d.as_os_str().is_empty()
    {
        std::fs::create_dir_all(d)?;
    }
    let s = serde_json::to_string_pretty(v).map_err(std::io::Error::other)?;
    std::fs::write(path, s + "\n")
}

fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(v, |v, k| v.get(k).unwrap_or(&Value::Null))
}

fn num(v: &Value, path: &str) -> f64 {
    get(v, path).as_f64().unwrap_or(0.0)
}

fn int(v: &Value, path: &str) -> u64 {
    get(v, path).as_u64().unwrap_or(0)
}

/// `loadgen summarize`: merges reports into one JSON file and a Markdown page.
pub fn summarize(a: SummarizeArgs) -> i32 {
    let mut runs = Vec::new();
    for p in &a.reports {
        match std::fs::read_to_string(p)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str::<Value>(&s).map_err(|e| e.to_string()))
        {
            Ok(v) => runs.push(v),
            Err(e) => {
                eprintln!("loadgen summarize: {}: {e}", p.display());
                return crate::EXIT_SETUP;
            }
        }
    }
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    let mut aborts: BTreeMap<String, u64> = BTreeMap::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut passed = true;
    let mut worst_abort_p99: f64 = 0.0;
    for r in &runs {
        passed &= get(r, "passed").as_bool().unwrap_or(false);
        let kind = get(r, "kind").as_str().unwrap_or("");
        for (k, path) in [
            ("leaked_files", "leaks.files"),
            ("leaked_tickets", "leaks.tickets"),
            ("leaked_dirs", "leaks.dirs"),
            ("leaked_fds", "leaks.fds"),
            ("violations", "violation_count"),
            ("bytes_written", "bytes_written"),
            ("bytes_read", "bytes_read"),
            ("ops", "ops.done"),
            ("faults", "faults_total"),
            ("aborts", "aborts_total"),
        ] {
            *totals.entry(k).or_default() += num(r, path);
        }
        if kind == "crash" {
            *totals.entry("kills").or_default() += num(r, "kills");
            *totals.entry("orphan_files_at_kill").or_default() += num(r, "orphan_files_total");
        }
        if let Some(m) = get(r, "aborts_by_point").as_object() {
            for (k, v) in m {
                *aborts.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
        if let Some(m) = get(r, "faults_injected").as_object() {
            for (k, v) in m {
                *faults.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
            }
        }
        worst_abort_p99 = worst_abort_p99.max(num(r, "latency.abort_to_clean.p99_us"));
    }
    let commit = commit();
    let root = std::env::temp_dir();
    let m = machine(&root);
    let merged = serde_json::json!({
        "command": a.command,
        "commit": commit,
        "machine": m,
        "passed": passed,
        "totals": totals,
        "aborts_by_point": aborts,
        "faults_injected": faults,
        "worst_abort_to_clean_p99_us": worst_abort_p99,
        "runs": runs,
    });
    if let Err(e) = write_json(&a.json, &merged) {
        eprintln!("loadgen summarize: {}: {e}", a.json.display());
        return crate::EXIT_SETUP;
    }
    let md = markdown(
        &a.command, commit, &m, &runs, &totals, &aborts, &faults, passed,
    );
    if let Err(e) = std::fs::write(&a.markdown, md) {
        eprintln!("loadgen summarize: {}: {e}", a.markdown.display());
        return crate::EXIT_SETUP;
    }
    if passed { 0 } else { crate::EXIT_VIOLATION }
}

#[allow(clippy::too_many_arguments)]
fn markdown(
    command: &str,
    commit: &str,
    m: &Machine,
    runs: &[Value],
    totals: &BTreeMap<&str, f64>,
    aborts: &BTreeMap<String, u64>,
    faults: &BTreeMap<String, u64>,
    passed: bool,
) -> String {
    let t = |k: &str| totals.get(k).copied().unwrap_or(0.0) as u64;
    let mut s = String::new();
    let _ = writeln!(s, "# loadgen: the standard stress and crash set\n");
    let _ = writeln!(
        s,
        "Written by `scripts/stress.sh`; do not edit by hand. Every figure comes from the JSON \
         reports merged into `results/loadgen.json`.\n"
    );
    let _ = writeln!(s, "- command: `{command}`");
    let _ = writeln!(s, "- commit: `{commit}`");
    let _ = writeln!(
        s,
        "- machine: {} CPUs ({}), {} GiB, Linux {}, spill root on {}",
        m.cpus, m.cpu_model, m.memory_gib, m.kernel, m.root_fs
    );
    let _ = writeln!(
        s,
        "- result: **{}**\n",
        if passed {
            "passed: no violation, nothing leaked"
        } else {
            "FAILED"
        }
    );
    let _ = writeln!(s, "## Totals\n");
    let _ = writeln!(s, "| what | value |\n|---|---|");
    for (k, v) in [
        ("task spills (ops)", t("ops").to_string()),
        ("aborts", t("aborts").to_string()),
        ("faults injected", t("faults").to_string()),
        ("kills (SIGKILL)", t("kills").to_string()),
        (
            "segment files of killed children swept",
            t("orphan_files_at_kill").to_string(),
        ),
        (
            "bytes written / read",
            format!("{} / {}", mib(t("bytes_written")), mib(t("bytes_read"))),
        ),
        (
            "worst abort-to-clean p99",
            us(runs
                .iter()
                .map(|r| num(r, "latency.abort_to_clean.p99_us"))
                .fold(0.0, f64::max)),
        ),
        ("leaked files", t("leaked_files").to_string()),
        ("leaked tickets", t("leaked_tickets").to_string()),
        ("leaked directories", t("leaked_dirs").to_string()),
        ("leaked fds", t("leaked_fds").to_string()),
        ("violations", t("violations").to_string()),
    ] {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(s, "\n## Aborts by point\n\n| point | aborts |\n|---|---|");
    for (k, v) in aborts {
        let _ = writeln!(s, "| {k} | {v} |");
    }
    let _ = writeln!(
        s,
        "\n## Faults injected\n\n| fault point | faults |\n|---|---|"
    );
    for (k, v) in faults {
        let _ = writeln!(s, "| `{k}` | {v} |");
    }
    let _ = writeln!(
        s,
        "\n## Runs\n\n| run | mode | seconds | ops | aborts | faults | write MiB/s | read MiB/s | write enqueue p99 | rotation p99 | read p99 | abort-to-clean p50 / p99 / max | tickets high-water | open fds peak | cleanup retries | leaks | passed |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in runs
        .iter()
        .filter(|r| get(r, "kind").as_str() == Some("run"))
    {
        let kind = get(r, "kind").as_str().unwrap_or("?");
        let name = get(r, "name").as_str().unwrap_or(kind);
        let _ = writeln!(
            s,
            "| {name} | {} {} | {:.1} | {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} / {} / {} | {} | {} | {} | {} | {} |",
            get(r, "config.mode").as_str().unwrap_or("-"),
            get(r, "backend").as_str().unwrap_or("-"),
            num(r, "elapsed_secs"),
            int(r, "ops.done"),
            int(r, "aborts_total"),
            int(r, "faults_total"),
            num(r, "throughput.write_mib_s"),
            num(r, "throughput.read_mib_s"),
            us(num(r, "latency.write_enqueue.p99_us")),
            us(num(r, "latency.segment_rotation.p99_us")),
            us(num(r, "latency.read.p99_us")),
            us(num(r, "latency.abort_to_clean.p50_us")),
            us(num(r, "latency.abort_to_clean.p99_us")),
            us(num(r, "latency.abort_to_clean.max_us")),
            int(r, "tickets_high_water"),
            int(r, "fds_peak"),
            int(r, "cleanup_retries"),
            int(r, "leaks.files")
                + int(r, "leaks.tickets")
                + int(r, "leaks.dirs")
                + int(r, "leaks.fds"),
            if get(r, "passed").as_bool().unwrap_or(false) {
                "yes"
            } else {
                "**no**"
            },
        );
    }
    let _ = writeln!(s, "\n## Commands\n");
    for r in runs {
        let argv: Vec<&str> = get(r, "command")
            .as_array()
            .map(|a| a.iter().skip(1).filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // The report path is a temporary file of the script: leave it out.
        let mut shown = Vec::new();
        let mut it = argv.into_iter();
        while let Some(x) = it.next() {
            if x == "--report" {
                it.next();
            } else {
                shown.push(x);
            }
        }
        let _ = writeln!(s, "- `loadgen {}`", shown.join(" "));
    }
    for r in runs
        .iter()
        .filter(|r| get(r, "kind").as_str() == Some("crash"))
    {
        let _ = writeln!(
            s,
            "\n## Crash series `{}`\n\n{} kills; {} segment files of the killed children were on disk at the kills; \
             the next open swept them in p50 {} / max {} (time from open until the root held no file of the dead process). \
             A bystander engine kept a live spill open across every kill and read it back intact: {}.",
            get(r, "name").as_str().unwrap_or("crash"),
            int(r, "kills"),
            int(r, "orphan_files_total"),
            us(num(r, "latency.sweep.p50_us")),
            us(num(r, "latency.sweep.max_us")),
            if get(r, "bystander_ok").as_bool().unwrap_or(false) {
                "yes"
            } else {
                "**no**"
            },
        );
    }
    s
}
