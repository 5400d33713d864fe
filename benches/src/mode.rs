//! How a bench binary was asked to run: quick (CI-sized) mode, test mode, or a profile loop.

use std::time::Duration;

/// True when `SPILLRING_BENCH_QUICK=1`: CI-sized runs that only prove the benches still work.
pub fn quick() -> bool {
    std::env::var("SPILLRING_BENCH_QUICK").is_ok_and(|v| v == "1" || v == "true")
}

/// True when the binary runs as a test (`cargo test --benches` / `--all-targets` run bench
/// targets without `--bench`): every bench then does a seconds-long smoke pass of its real
/// paths and writes no results.
pub fn test_mode() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// Which profile loop a bench binary should run instead of its measurements
/// (`SPILLRING_BENCH_PROFILE`), and for how long (`SPILLRING_BENCH_PROFILE_SECS`, default 5).
/// `scripts/bench-report.sh` runs these under `perf record` when a goal is missed.
pub fn profile_request() -> Option<(String, Duration)> {
    let what = std::env::var("SPILLRING_BENCH_PROFILE").ok()?;
    let secs = std::env::var("SPILLRING_BENCH_PROFILE_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(5.0);
    Some((what, Duration::from_secs_f64(secs)))
}

/// The value of the environment variable `var` parsed as a `T`, or `default` when it is unset
/// or does not parse (the benches' size and repetition overrides).
pub fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}
