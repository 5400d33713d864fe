//! The external sort end to end: order, contents, nothing left behind, Ctrl-C, bad input.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use spillring::Engine;
use spillring_sort::{Plan, RECORD, SortError, SortOptions, generate, sort_file};

fn segment_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().expect("file type").is_dir() {
                stack.push(e.path());
            } else if e.path().to_string_lossy().ends_with(".bin") {
                out.push(e.path());
            }
        }
    }
    out
}

/// The input's records sorted in memory: what the output must be.
fn expected(input: &Path) -> Vec<u8> {
    let mut data = std::fs::read(input).expect("read input");
    let (recs, rest) = data.as_chunks_mut::<RECORD>();
    assert!(rest.is_empty());
    recs.sort_unstable();
    data
}

#[test]
fn sorts_an_input_larger_than_its_budget_and_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let spill = dir.path().join("spill");
    std::fs::create_dir(&spill).expect("spill dir");
    generate(&input, 30_000, 42).expect("generate");
    let len = std::fs::metadata(&input).expect("stat").len();
    let plan = Plan::new(len, 256 << 10).expect("plan");
    assert!(plan.runs >= 10, "many runs: {plan:?}");
    let engine = Engine::open(plan.engine_config(&spill)).expect("open");
    let task = engine.task("sort").expect("task");
    let opts = SortOptions {
        input: input.clone(),
        output: output.clone(),
        plan,
        progress: false,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let report = sort_file(&opts, &task, &cancel, &|| {
        assert!(
            !segment_files(&spill).is_empty(),
            "the runs are spilled before the merge"
        );
    })
    .expect("sort");
    assert_eq!(report.records, 30_000);
    assert_eq!(report.runs, plan.runs);
    let out = std::fs::read(&output).expect("read output");
    for (i, w) in out
        .chunks_exact(RECORD)
        .collect::<Vec<_>>()
        .windows(2)
        .enumerate()
    {
        assert!(w[0] <= w[1], "records {i} and {} out of order", i + 1);
    }
    assert!(
        out == expected(&input),
        "the output is the input's records, sorted"
    );
    task.close();
    assert!(engine.settle(Duration::from_secs(10)));
    assert_eq!(
        segment_files(&spill),
        Vec::<PathBuf>::new(),
        "no spill file left"
    );
}

#[test]
fn a_torn_input_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    std::fs::write(&input, [b'x'; 250]).expect("write");
    let engine =
        Engine::open(spillring::EngineConfig::new(dir.path().join("spill"))).expect("open");
    let task = engine.task("sort").expect("task");
    let opts = SortOptions {
        input,
        output: output.clone(),
        plan: Plan::new(250, 1 << 20).expect("plan"),
        progress: false,
    };
    let e = sort_file(&opts, &task, &Arc::new(AtomicBool::new(false)), &|| {})
        .expect_err("250 bytes are not whole records");
    assert!(matches!(e, SortError::BadInput { len: 250, .. }), "{e:?}");
    assert!(!output.exists());
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_spillring-sort")
}

#[test]
fn the_binary_sorts_and_removes_its_spill_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let st = Command::new(bin())
        .args(["--generate", "20000", "--seed", "9", "--output"])
        .arg(&input)
        .status()
        .expect("run generate");
    assert!(st.success());
    assert_eq!(std::fs::metadata(&input).expect("stat").len(), 20_000 * 100);
    let st = Command::new(bin())
        .args(["--budget", "256K", "--no-progress", "--input"])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .status()
        .expect("run sort");
    assert!(st.success());
    assert!(std::fs::read(&output).expect("output") == expected(&input));
    assert!(
        !dir.path().join(".spillring-sort-spill").exists(),
        "the default spill directory is removed"
    );
}

/// Ctrl-C once the runs are spilled: the process exits with 130, every spilled run is
/// deleted, and no partial output is left.
#[test]
fn ctrl_c_cancels_and_leaves_no_spill_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.dat");
    let output = dir.path().join("out.dat");
    let spill = dir.path().join("spill");
    generate(&input, 20_000, 3).expect("generate");
    let mut child = Command::new(bin())
        .args([
            "--budget",
            "256K",
            "--no-progress",
            "--hold-after-spill",
            "--input",
        ])
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .arg("--spill-dir")
        .arg(&spill)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    loop {
        let l = lines.next().expect("the child says spilled").expect("line");
        if l == "spilled" {
            break;
        }
    }
    let files = segment_files(&spill).len();
    assert!(files > 0, "runs are on disk before the Ctrl-C");
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let st = child.wait().expect("wait");
    assert_eq!(st.code(), Some(130), "cancelled: {rest:?}");
    assert_eq!(
        segment_files(&spill),
        Vec::<PathBuf>::new(),
        "the {files} spilled runs were deleted"
    );
    assert!(!output.exists(), "no partial output");
}
