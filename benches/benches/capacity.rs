//! Capacity (dhat): heap retained per cleanup ticket when the ledger is full of files whose
//! deletes failed.
//!
//! For each scale N (powers of two up to 65,536 = the default ledger capacity, and the points just
//! past them, where the queue's buffer has just doubled: see `main`) a fresh engine spills
//! N one-record segment files through the real path (`writer` → `write` → `finish` → drop the
//! `SpilledState`), with every unlink failing (`IoUnlink` and `CleanupUnlink` fail with EIO and
//! the cleanup worker's retry delay is an hour). Each failed delete turns the file's ticket into
//! a name-only record in the cleanup worker's queue. The dhat baseline is taken after the engine,
//! the task and its directory exist and a warm-up of 160 spills with working deletes ran (so the
//! engine's bounded spare lists are full), and before anything is allocated for the N tickets; the
//! figure is (heap live once all N records sit in the queue) − baseline, over N: everything the
//! whole process still holds for them (ledger, records, queue, and anything else), not a sum of
//! `size_of`s. At N = 65,536 one more write must fail with `LedgerFull`.

use std::time::{Duration, Instant};

use serde_json::json;
use spillring::testing::CLEANUP_RECORD_BYTES;
use spillring::{EngineConfig, FaultPlan, FaultPoint, SpillError, TaskSpill, WriteMode};
use spillring_benches::{
    GatedDhat, HeapProfile, KIB, open_engine, out_dir, quick, scratch_meta, test_mode, wait_for,
    write_results,
};

#[global_allocator]
static ALLOC: GatedDhat = GatedDhat;

const CAPACITY: usize = 65_536;
/// Spills before the baseline: enough to fill the engine's bounded spare lists (see `measure`).
const WARM_UP: usize = 160;

/// One spill whose files end up waiting for deletion: the same calls an executor makes.
fn spill_one(task: &TaskSpill, record: &[u8]) -> spillring::Result<()> {
    let mut w = task.writer()?;
    w.write_slice(record)?;
    let state = w.finish()?;
    drop(state); // the last grant: the delete is queued (and fails, by the fault plan)
    Ok(())
}

fn measure(n: usize, save_sites: bool) -> serde_json::Value {
    let dir = scratch_meta("capacity").expect("create a scratch directory");
    // The profile covers the whole engine's life, so the baseline counts every block live at
    // that point (a block allocated before a dhat profile starts is invisible to it, and a
    // channel block replaced during the fill would otherwise look like growth).
    let save = save_sites.then(|| {
        out_dir()
            .expect("bench output directory")
            .join(format!("dhat-capacity-{n}.json"))
    });
    let prof = HeapProfile::start(save.as_deref());
    let plan = FaultPlan::new(4);
    let engine = open_engine(
        EngineConfig::new(dir.path())
            .mode(WriteMode::Buffered)
            .segment_size(64 * KIB as u64)
            .io_buffer_size((64 * KIB) as u64)
            .ticket_capacity(CAPACITY)
            .cleanup_retry_delay(Duration::from_secs(3600))
            // The segment pool would keep released files for reuse instead of deleting them;
            // this figure is about the records of deletes that failed.
            .pool_max_segments(0)
            .fault_plan(plan.clone()),
        "capacity",
    );
    let task = engine.task("capacity").expect("task");
    let record = [0x5au8; 100];
    // Warm-up with working deletes: the task directory, the I/O thread's channel blocks, the
    // staging buffers and the fd cache's kept spares (64 slots and 64 handles: a bounded,
    // fixed amount, which 16 warm-up spills left two-thirds empty, so it was counted against
    // the tickets) exist before the baseline, as they would in a running engine.
    for _ in 0..WARM_UP {
        spill_one(&task, &record).expect("warm-up spill");
    }
    assert!(
        engine.settle(Duration::from_secs(30)),
        "warm-up deletes settle"
    );
    plan.fail_always(FaultPoint::IoUnlink, libc::EIO);
    plan.fail_always(FaultPoint::CleanupUnlink, libc::EIO);

    let base = prof.stats();
    let t = Instant::now();
    for i in 0..n {
        spill_one(&task, &record).unwrap_or_else(|e| panic!("spill {i} of {n}: {e}"));
    }
    let fill = t.elapsed();
    // Every delete has failed and its record waits in the cleanup worker's queue.
    wait_for("all records queued", Duration::from_secs(120), || {
        let m = engine.metrics();
        m.cleanup_pending == n as u64 && m.deletes_in_flight == 0
    });
    // Let the reaper close the last file descriptors (its queue is transient).
    std::thread::sleep(Duration::from_millis(100));
    // Only the figures: a `Metrics` snapshot held across `after` counted its own heap (272 B).
    let (backend, tickets_used, cleanup_pending) = {
        let m = engine.metrics();
        (m.backend, m.tickets_used, m.cleanup_pending)
    };
    let full_refused = if n == CAPACITY {
        let mut w = task.writer().expect("writer at capacity");
        matches!(w.write_slice(&record), Err(SpillError::LedgerFull { .. }))
    } else {
        false
    };
    let after = prof.stats();
    // Ends the profile here: with a file name, dhat saves the live blocks by allocation site.
    drop(prof);

    let retained = after.curr_bytes as i64 - base.curr_bytes as i64;
    let blocks = after.curr_blocks as i64 - base.curr_blocks as i64;
    let per_ticket = retained as f64 / n as f64;
    eprintln!(
        "capacity: {n:>6} tickets held by name-only records: {retained} bytes retained in {blocks} blocks = {per_ticket:.2} bytes/ticket (fill {fill:.2?})"
    );
    assert_eq!(
        tickets_used, n as u64,
        "every failed delete keeps its ticket"
    );

    // Let the deletes succeed and check that everything is released.
    plan.clear(FaultPoint::IoUnlink);
    plan.clear(FaultPoint::CleanupUnlink);
    engine.retry_cleanup_now();
    let drained = engine.settle(Duration::from_secs(300));
    let left = engine.metrics().tickets_used;
    task.close();
    drop(engine);
    json!({
        "tickets": n,
        "backend": backend,
        "retained_bytes": retained,
        "retained_blocks": blocks,
        "bytes_per_ticket": per_ticket,
        "baseline_bytes": base.curr_bytes,
        "tickets_used": tickets_used,
        "cleanup_pending": cleanup_pending,
        "ledger_full_refused_next": if n == CAPACITY { json!(full_refused) } else { json!(null) },
        "released_after_recovery": drained && left == 0,
        "fill_seconds": fill.as_secs_f64(),
        "dhat_sites": save.map(|p| p.display().to_string()),
    })
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument that is not ours skips the bench.
    if let Some(f) = std::env::args().skip(1).find(|a| !a.starts_with('-'))
        && !"capacity".contains(f.as_str())
    {
        return;
    }
    // The queue grows one 1 KiB chunk (128 records) at a time; it grew by doubling before, so
    // the points just past powers of two were the worst. They are kept, with the powers of two
    // themselves: the goal is checked at the worst point measured, not the best.
    let scales: &[usize] = if test_mode() {
        &[256]
    } else if quick() {
        &[1_025, 16_384, 16_385, 32_769, 65_536]
    } else {
        &[1_024, 1_025, 16_384, 16_385, 32_769, 40_000, 65_536]
    };
    let points: Vec<serde_json::Value> = scales
        .iter()
        .map(|&n| measure(n, n == CAPACITY && !test_mode()))
        .collect();
    let at_cap = points
        .iter()
        .find(|p| p["tickets"] == CAPACITY)
        .and_then(|p| p["bytes_per_ticket"].as_f64());
    let worst = points
        .iter()
        .filter_map(|p| Some((p["tickets"].as_u64()?, p["bytes_per_ticket"].as_f64()?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    write_results(
        "capacity",
        &json!({
            "bench": "capacity",
            "what": "heap retained per ticket held by a name-only cleanup record (dhat, whole process), baseline taken before anything is allocated for the tickets",
            "record_struct_bytes": CLEANUP_RECORD_BYTES,
            "bytes_per_ticket_at_capacity": at_cap,
            "worst_bytes_per_ticket": worst.map(|w| w.1),
            "worst_at_tickets": worst.map(|w| w.0),
            "points": points,
        }),
    )
    .expect("write the bench results");
}
