//! One buffer flush, for `scripts/flush-path.sh` (issue 24: "a buffer flush's path touches
//! <= 12 files"): a writer fills its staging buffer with 4 KiB records until the buffer is
//! written, then once more, and finishes. Run under callgrind by the script, which counts the
//! engine's source files whose code runs inside the flush (`flush_staging_with` on the
//! writer's thread, the I/O thread's handling of the write op and its completion).
//!
//! `cargo run -p spillring --example flush_path -- [buffered|direct] [uring|psync]` (it exits
//! without deleting its files: the script removes its directory).

use spillring::{BackendKind, Bytes, Engine, EngineConfig, WriteMode};

fn main() -> spillring::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = if args.iter().any(|a| a == "direct") {
        WriteMode::Direct
    } else {
        WriteMode::Buffered
    };
    let backend = if args.iter().any(|a| a == "psync") {
        BackendKind::Psync
    } else {
        BackendKind::Uring
    };
    let root = std::env::temp_dir().join(format!("spillring-flush-path-{}", std::process::id()));
    let engine = Engine::open(EngineConfig::new(&root).mode(mode).backend(backend))?;
    let task = engine.task("flush-path")?;
    let mut w = task.writer()?;
    let rec = Bytes::from(vec![7u8; 4096]);
    // Two buffers' worth (the default staging buffer is 1 MiB): at least two flushes.
    for _ in 0..520 {
        w.write(rec.clone())?;
    }
    let state = w.finish()?;
    println!(
        "{} records in {} segment(s) under {}",
        state.records(),
        state.segments(),
        root.display()
    );
    // Out without the deletes (their unlinks are not the flush's path): the script removes
    // the directory.
    std::process::exit(0)
}
