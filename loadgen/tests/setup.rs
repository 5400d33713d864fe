//! What a run leaves and names outside its checks: a run whose configuration the engine
//! refuses removes the fresh temp root it made, and a report names the commit loadgen was built
//! from, not the one of the repository the current directory is in.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Outcome, report};

const BIN: &str = env!("CARGO_BIN_EXE_loadgen");

/// Runs loadgen with `TMPDIR` set to `tmp` (where it makes its fresh root without `--root`).
fn run_in_tmp(tmp: &Path, args: &[&str]) -> Outcome {
    let mut c = Command::new(BIN);
    c.args(args).env("TMPDIR", tmp);
    common::run_command(c, args, Duration::from_secs(120))
}

fn left_in(tmp: &Path) -> Vec<String> {
    std::fs::read_dir(tmp)
        .expect("tmp")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_refused_config_leaves_no_fresh_root_behind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = run_in_tmp(
        tmp.path(),
        &[
            "run",
            "--segment-size",
            "1000",
            "--ops",
            "5",
            "--seed",
            "11",
            "--progress",
            "none",
        ],
    );
    assert_eq!(o.code, Some(2), "{}", o.text());
    assert!(o.stderr.contains("invalid configuration"), "{}", o.text());
    // The root it would have used was under TMPDIR (loadgen-<pid>-<seed>): gone.
    assert!(
        o.stderr.contains(&*tmp.path().to_string_lossy()),
        "{}",
        o.text()
    );
    let left = left_in(tmp.path());
    assert!(
        left.is_empty(),
        "left in the temp dir: {left:?}\n{}",
        o.text()
    );

    // The same with several roots (sub-roots under the fresh root).
    let o = run_in_tmp(
        tmp.path(),
        &[
            "run",
            "--segment-size",
            "1000",
            "--roots",
            "3",
            "--ops",
            "5",
            "--progress",
            "none",
        ],
    );
    assert_eq!(o.code, Some(2), "{}", o.text());
    let left = left_in(tmp.path());
    assert!(
        left.is_empty(),
        "left in the temp dir: {left:?}\n{}",
        o.text()
    );
}

#[test]
fn a_crash_series_whose_children_cannot_start_leaves_no_fresh_root_behind() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // The bystander engine opens (its own config), the first child's engine refuses the
    // configuration: the series stops, and takes its root and the child's log with it.
    let o = run_in_tmp(
        tmp.path(),
        &[
            "crash",
            "--kills",
            "1",
            "--segment-size",
            "1000",
            "--seed",
            "12",
            "--progress",
            "none",
        ],
    );
    assert_eq!(o.code, Some(2), "{}", o.text());
    assert!(o.stderr.contains("invalid configuration"), "{}", o.text());
    let left = left_in(tmp.path());
    assert!(
        left.is_empty(),
        "left in the temp dir: {left:?}\n{}",
        o.text()
    );
}

/// The report's commit is the one loadgen was built from (embedded by build.rs), even when
/// loadgen runs inside another git repository.
#[test]
fn the_report_names_the_build_commit_not_the_current_directory_one() {
    let built = env!("SPILLRING_COMMIT");
    assert!(!built.is_empty());
    let other = tempfile::tempdir().expect("tempdir");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(other.path())
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
    };
    let theirs = match (
        git(&["init", "-q"]),
        git(&["commit", "-q", "--allow-empty", "-m", "other"]),
        git(&["rev-parse", "--short", "HEAD"]),
    ) {
        (Ok(a), Ok(b), Ok(c)) if a.status.success() && b.status.success() && c.status.success() => {
            Some(String::from_utf8_lossy(&c.stdout).trim().to_owned())
        }
        // Without git the other repository cannot be made; the rest still holds.
        _ => None,
    };
    let rep = other.path().join("run.json");
    let root = other.path().join("root");
    let mut c = Command::new(BIN);
    c.current_dir(other.path()).args([
        "run",
        "--root",
        root.to_str().expect("utf-8 path"),
        "--ops",
        "3",
        "--tasks",
        "1",
        "--fault-rate",
        "0",
        "--progress",
        "none",
        "--report",
        rep.to_str().expect("utf-8 path"),
    ]);
    let o = common::run_command(c, &["run"], Duration::from_secs(120));
    assert_eq!(o.code, Some(0), "{}", o.text());
    let r = report(&rep);
    assert_eq!(r["commit"], built, "{r:#}");
    if let Some(theirs) = theirs {
        assert!(
            !built.starts_with(&theirs),
            "{built} is the other repository's {theirs}"
        );
    }
    // The summary names it too.
    assert!(o.stdout.contains(built), "{}", o.text());
}
