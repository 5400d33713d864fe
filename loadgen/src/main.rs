//! `loadgen`: the stress, fault and crash load generator for spillring.
//!
//! ```text
//! loadgen run      [--duration S | --ops N] [--tasks N] [--abort-rate P] [--fault-rate P] ...
//! loadgen crash    [--kills N] [the workload flags of `run`]
//! loadgen summarize REPORT.json... --json OUT --markdown OUT
//! ```
//!
//! `run` drives many concurrent task spills (plain threads and async tasks on a multi-thread
//! tokio runtime) through every path of the engine, aborts some at chosen points, injects
//! faults, and then checks the invariants against the filesystem itself: no segment file left,
//! no ticket held, every record read back equal to what was written, no published file
//! deleted, no fd and no map leaked. `crash` SIGKILLs `run` children and checks that the next
//! engine sweeps what they left. Any violation is printed with what and where, and the exit
//! code is 1.
//!
//! Modules: [`args`] (the command line), [`data`] (records and checksums), [`scenario`] (one
//! task's life and its abort points), [`run`] (a run and its final checks), [`crash`],
//! [`check`] (filesystem invariants), [`watch`] (abort-to-clean timing), [`stats`],
//! [`progress`] and [`report`].

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod args;
mod check;
mod crash;
mod data;
mod progress;
mod report;
mod run;
mod scenario;
mod stats;
mod watch;

use clap::Parser;

/// Exit code of a run that found a violation.
pub const EXIT_VIOLATION: i32 = 1;
/// Exit code of a usage or setup error.
pub const EXIT_SETUP: i32 = 2;
/// Exit code of a run that stalled (no progress for `--stall-secs`).
pub const EXIT_STALL: i32 = 3;

fn main() {
    let cli = args::Cli::parse();
    let code = match cli.cmd {
        args::Cmd::Run(a) => run::main(a),
        args::Cmd::Crash(a) => crash::main(a),
        args::Cmd::Summarize(a) => report::summarize(a),
    };
    std::process::exit(code);
}
