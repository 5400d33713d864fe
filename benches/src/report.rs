//! The JSON every bench writes to [`out_dir`](crate::out_dir), which
//! `scripts/bench_report.py` reads.

use std::io;
use std::path::PathBuf;

use spillring::Engine;

use crate::{dirs::out_dir, mode::test_mode};

/// Writes `value` like [`write_json`], except in [`test_mode`], where it only says it ran.
pub fn write_results(name: &str, value: &serde_json::Value) -> io::Result<()> {
    if test_mode() {
        eprintln!("spillring-bench {name}: smoke pass ok (test mode, no results written)");
        return Ok(());
    }
    write_json(name, value).map(drop)
}

/// Writes `value` as pretty JSON to `<out_dir>/<name>.json` and says where.
pub fn write_json(name: &str, value: &serde_json::Value) -> io::Result<PathBuf> {
    let path = out_dir()?.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    std::fs::write(&path, text + "\n")?;
    eprintln!("spillring-bench: wrote {}", path.display());
    Ok(path)
}

/// One-line description of the engine build a result came from.
pub fn engine_info(engine: &Engine) -> serde_json::Value {
    let m = engine.metrics();
    serde_json::json!({ "backend": m.backend, "write_mode": m.write_mode })
}
