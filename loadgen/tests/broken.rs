//! Proof that the checker can fail: loadgen built against the deliberately broken engine
//! (feature `broken`: the writer skips its abort check after a file creation) must report the
//! leaked files and exit non-zero, while the same command on the real engine passes.
//!
//! The broken binary is built here with `cargo build -p loadgen --features broken` into its own
//! target directory under this workspace's target dir (kept between runs, so only the first
//! build is slow), or taken from `LOADGEN_BROKEN_BIN` when CI built it beforehand.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{report, run, u};

const BIN: &str = env!("CARGO_BIN_EXE_loadgen");

fn broken_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LOADGEN_BROKEN_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "LOADGEN_BROKEN_BIN={} is not a file",
            p.display()
        );
        return p;
    }
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loadgen-broken");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO")
        .or_else(|| option_env!("CARGO").map(Into::into))
        .unwrap_or_else(|| "cargo".into());
    let build = |offline: bool| {
        let mut c = Command::new(&cargo);
        c.args([
            "build",
            "-p",
            "loadgen",
            "--features",
            "broken",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        // A quick test build: dependencies unoptimised (the workspace optimises them for
        // the data-heavy tests; here it would cost minutes), no debug info, no incremental
        // state.
        .args(["--config", "profile.dev.package.\"*\".opt-level=0"])
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .env("CARGO_INCREMENTAL", "0")
        // Whatever lint levels the caller's flags set, the broken build must not fail on a
        // warning.
        .env("RUSTFLAGS", rustflags())
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS");
        if offline {
            // Every crate is in the local cache already: the test binary was built from it.
            c.arg("--offline");
        }
        c.output().expect("run cargo")
    };
    let mut o = build(true);
    if !o.status.success() {
        o = build(false);
    }
    assert!(
        o.status.success(),
        "building the broken loadgen failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bin = target.join("debug").join("loadgen");
    assert!(bin.is_file(), "no binary at {}", bin.display());
    bin
}

fn rustflags() -> String {
    let mut f = std::env::var("RUSTFLAGS").unwrap_or_default();
    f.push_str(" --cap-lints=warn");
    f.trim().to_owned()
}

fn window_run(bin: &Path, dir: &Path, name: &str) -> (common::Outcome, serde_json::Value) {
    let root = dir.join(name);
    let rep = dir.join(format!("{name}.json"));
    // Every op is cancelled while its writer is paused between a file creation and the abort
    // check: on the broken engine each one leaks that file.
    let o = run(
        bin,
        &[
            "run",
            "--root",
            root.to_str().expect("utf-8 path"),
            "--abort-points",
            "after-create",
            "--abort-rate",
            "1",
            "--fault-rate",
            "0",
            "--ops",
            "6",
            "--tasks",
            "2",
            "--seed",
            "3",
            "--segment-size",
            "128KiB",
            "--progress",
            "none",
            "--report",
            rep.to_str().expect("utf-8 path"),
        ],
        Duration::from_secs(120),
    );
    let r = report(&rep);
    (o, r)
}

#[test]
fn loadgen_reports_the_leaks_of_a_broken_engine() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Control: the same run on the real engine passes.
    let (o, r) = window_run(Path::new(BIN), dir.path(), "good");
    assert_eq!(o.code, Some(0), "{}", o.text());
    assert_eq!(u(&r, &["abort_windows", "reached"]), 6, "{r:#}");
    assert_eq!(u(&r, &["leaks", "files"]), 0, "{r:#}");

    let bin = broken_bin();
    let (o, r) = window_run(&bin, dir.path(), "broken");
    assert_eq!(
        o.code,
        Some(1),
        "the broken engine must fail the run\n{}",
        o.text()
    );
    assert_eq!(r["passed"], false, "{r:#}");
    assert_eq!(u(&r, &["abort_windows", "reached"]), 6, "{r:#}");
    // One file per cancelled window, each named with its path.
    assert_eq!(u(&r, &["leaks", "files"]), 6, "{r:#}");
    let all = format!("{}{}", o.stdout, o.stderr);
    assert!(
        all.contains("VIOLATION [leak] segment file left after the run"),
        "{}",
        o.text()
    );
    assert!(all.contains("spill-segment-"), "{}", o.text());
    assert!(all.contains("FAILED"), "{}", o.text());
}
