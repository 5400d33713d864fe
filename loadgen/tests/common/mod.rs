//! Helpers shared by loadgen's integration tests: run the binary with a time limit, read its
//! JSON report.
#![allow(dead_code)]

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished loadgen process said.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn text(&self) -> String {
        format!(
            "exit code {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `bin` with `args`; kills it and fails the test after `limit`.
pub fn run(bin: &Path, args: &[&str], limit: Duration) -> Outcome {
    let mut c = Command::new(bin);
    c.args(args);
    run_command(c, args, limit)
}

/// Runs `c` (whose arguments `args` name it in a failure); kills it and fails the test after
/// `limit`.
pub fn run_command(mut c: Command, args: &[&str], limit: Duration) -> Outcome {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", c.get_program()));
    // Drain both pipes on threads so that a chatty child never blocks.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let o = Outcome {
        code: status.and_then(|s| s.code()),
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    };
    assert!(
        status.is_some(),
        "loadgen {args:?} did not finish within {limit:?}\n{}",
        o.text()
    );
    o
}

/// Reads a JSON report.
pub fn report(p: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("parse {}: {e}", p.display()))
}

/// `v[a][b]...` as u64 (panics with the report when missing).
pub fn u(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut cur = v;
    for k in path {
        cur = &cur[*k];
    }
    cur.as_u64()
        .unwrap_or_else(|| panic!("report has no number at {path:?}: {v:#}"))
}
