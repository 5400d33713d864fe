//! Embeds the commit loadgen is built from as `SPILLRING_COMMIT` (read with `env!` by the
//! report): `git rev-parse --short HEAD` in this package's directory, with `-dirty` when
//! `git status --porcelain` lists changes, or "unknown" without git (or outside a repository).
//! A `SPILLRING_COMMIT` set in the build's environment wins (a build from a source archive).
//!
//! Reruns when the checkout moves (HEAD, the branch HEAD names, the packed refs), when the index
//! changes, and when the sources that go into the binary change (so `-dirty` follows edits).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SPILLRING_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    let commit = match std::env::var("SPILLRING_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_owned(),
        _ => from_git(&dir).unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=SPILLRING_COMMIT={commit}");
}

/// Runs git in `dir` (never taking the index lock: a `git status` here must not rewrite the
/// index it watches); its trimmed stdout, if it ran and succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

fn from_git(dir: &Path) -> Option<String> {
    let head = git(dir, &["rev-parse", "--short", "HEAD"]).filter(|h| !h.is_empty())?;
    watch_repository(dir);
    let dirty = git(dir, &["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// Asks cargo to rerun this script when the commit or the working tree may have changed.
fn watch_repository(dir: &Path) {
    let abs = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() { p } else { dir.join(p) }
    };
    let rerun = |p: &Path| {
        // A path that does not exist would make cargo rerun the script at every build.
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    };
    if let Some(git_dir) = git(dir, &["rev-parse", "--git-dir"]).map(abs) {
        rerun(&git_dir.join("HEAD"));
        rerun(&git_dir.join("index"));
    }
    // A commit moves the branch HEAD names, not HEAD itself.
    if let Some(common) = git(dir, &["rev-parse", "--git-common-dir"]).map(abs) {
        if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
            rerun(&common.join(branch));
        }
        rerun(&common.join("packed-refs"));
    }
    // `-dirty` follows edits of what goes into the binary: loadgen and the engine.
    for p in [
        "src",
        "Cargo.toml",
        "../engine/src",
        "../engine/Cargo.toml",
        "../Cargo.lock",
    ] {
        rerun(&dir.join(p));
    }
}
