//! The engine's memory bound covers reading too (issue 25, item 5): 128 writers of 2 MiB
//! each under a 64 MiB `max_buffer_memory`, read back and dropped. Before, segment maps kept
//! with pooled files had a fixed 1 GiB bound of their own: 170 MiB of RSS after the read-back
//! and 166 MiB still held after the states were dropped.

#[macro_use]
mod common;
use common::*;

use spillring::{BackendKind, Bytes, Engine};

per_backend!(reading_back_stays_within_the_memory_bound,);

/// This process's resident set and its peak, in bytes.
fn rss_and_peak() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib = |key: &str| -> u64 {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            << 10
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

const BUDGET: usize = 64 << 20;
const WRITERS: u64 = 128;
const RECORD: usize = 64 << 10;
/// Records per writer: 2 MiB each.
const PER_WRITER: u64 = 32;

fn reading_back_stays_within_the_memory_bound(b: BackendKind) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (base, _) = rss_and_peak();
    let engine = Engine::open(
        spillring::EngineConfig::new(dir.path())
            .backend(b)
            .max_buffer_memory(BUDGET as u64),
    )
    .unwrap();
    let task = engine.task("memory").unwrap();
    let mut writers: Vec<_> = (0..WRITERS).map(|_| task.writer().unwrap()).collect();
    for i in 0..PER_WRITER {
        for (w, writer) in writers.iter_mut().enumerate() {
            let n = w as u64 * PER_WRITER + i;
            writer.write(Bytes::from(record(n, RECORD))).unwrap();
        }
    }
    let states: Vec<_> = writers.into_iter().map(|w| w.finish().unwrap()).collect();
    let (written, _) = rss_and_peak();
    for (w, st) in states.iter().enumerate() {
        let mut n = w as u64 * PER_WRITER;
        for rec in st.reader().unwrap() {
            assert!(rec.unwrap()[..] == record(n, RECORD)[..], "record {n}");
            n += 1;
        }
        assert_eq!(n, (w as u64 + 1) * PER_WRITER);
    }
    let (read, peak) = rss_and_peak();
    drop(states);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (held, _) = rss_and_peak();
    let (maps, map_bytes) = spillring::testing::kept_maps(&engine);
    // The gauges say the same (issue 25: staging buffers, kept maps and fds as metrics).
    let m = engine.metrics();
    assert_eq!(m.kept_map_bytes, map_bytes);
    let bufs = spillring::testing::buffer_stats(&engine);
    assert_eq!(m.staging_buffer_bytes, bufs.mapped as u64);
    assert!(
        m.staging_buffer_bytes > 0 && m.staging_buffer_bytes <= BUDGET as u64,
        "{m:?}"
    );
    assert_eq!(
        m.open_fds,
        spillring::testing::fd_stats(&engine).open as u64
    );
    let text = m.to_prometheus();
    for name in ["staging_buffer_bytes", "kept_map_bytes", "open_fds"] {
        assert!(
            text.contains(&format!("spillring_{name} ")),
            "{name}: {text}"
        );
    }
    let mib = |x: u64| x.saturating_sub(base) >> 20;
    let figures = format!(
        "RSS growth: {} MiB written, {} MiB read back, peak {} MiB, {} MiB held after the states dropped; {maps} kept maps of {} MiB",
        mib(written),
        mib(read),
        mib(peak),
        mib(held),
        map_bytes >> 20
    );
    eprintln!("{figures}");
    assert!(map_bytes <= BUDGET as u64, "{figures}");
    assert!(peak - base <= 2 * BUDGET as u64, "{figures}");
    assert!(held.saturating_sub(base) <= 2 * BUDGET as u64, "{figures}");
    task.close();
    assert_clean(&engine, dir.path());
}
