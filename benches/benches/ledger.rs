//! Ledger (criterion): reserve + release of one ticket, single-threaded and with both cores
//! contending, against the floor of any shared counter (one `fetch_add` + one `fetch_sub` on an
//! `AtomicUsize`) measured the same way in the same run.
//!
//! The engine's ledger is reached through `spillring::testing::LedgerProbe`, which wraps the
//! engine's own `Ledger` (the type every writer reserves from), not a copy.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, LazyLock};
use std::time::{Duration, Instant};

use criterion::BenchmarkId;
use serde_json::json;
use spillring::testing::LedgerProbe;
use spillring_benches::{Samples, criterion, write_results};

static SAMPLES: LazyLock<Samples> = LazyLock::new(Samples::default);
const SAMPLE_SIZE: usize = 30;

fn ledger_op(l: &LedgerProbe) {
    let t = l.reserve(black_box(64 << 20)).expect("a ticket");
    drop(black_box(t));
}

fn atomic_op(a: &AtomicUsize) {
    black_box(a.fetch_add(1, Ordering::AcqRel));
    black_box(a.fetch_sub(1, Ordering::AcqRel));
}

/// Times `iters` ops on this thread while a second thread does the same ops on the same
/// structure (2 cores: both really run at once).
fn contended(iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            barrier.wait();
            for _ in 0..iters {
                op();
            }
        });
        barrier.wait();
        let t = Instant::now();
        for _ in 0..iters {
            op();
        }
        t.elapsed()
    })
}

fn main() {
    let mut c = criterion(SAMPLE_SIZE, Duration::from_secs(2));
    let ledger = LedgerProbe::new(65_536, None);
    let counter = AtomicUsize::new(0);
    {
        let mut g = c.benchmark_group("ledger");
        for threads in [1usize, 2] {
            let l = &ledger;
            let a = &counter;
            g.bench_function(BenchmarkId::new("reserve_release", threads), |b| {
                b.iter_custom(|iters| {
                    let d = if threads == 1 {
                        let t = Instant::now();
                        for _ in 0..iters {
                            ledger_op(l);
                        }
                        t.elapsed()
                    } else {
                        contended(iters, &|| ledger_op(l))
                    };
                    SAMPLES.record(&format!("reserve_release/{threads}"), iters, d);
                    d
                })
            });
            g.bench_function(BenchmarkId::new("atomic_counter_baseline", threads), |b| {
                b.iter_custom(|iters| {
                    let d = if threads == 1 {
                        let t = Instant::now();
                        for _ in 0..iters {
                            atomic_op(a);
                        }
                        t.elapsed()
                    } else {
                        contended(iters, &|| atomic_op(a))
                    };
                    SAMPLES.record(&format!("atomic_counter_baseline/{threads}"), iters, d);
                    d
                })
            });
        }
        g.finish();
    }
    c.final_summary();
    if SAMPLES.ids().is_empty() {
        return;
    }
    assert_eq!(ledger.used(), 0, "every ticket went back");
    let rows: Vec<serde_json::Value> = [1, 2]
        .iter()
        .map(|t| {
            let l = SAMPLES.median_ns(&format!("reserve_release/{t}"), SAMPLE_SIZE);
            let a = SAMPLES.median_ns(&format!("atomic_counter_baseline/{t}"), SAMPLE_SIZE);
            json!({
                "threads": t,
                "reserve_release_ns": l,
                "atomic_baseline_ns": a,
                "ratio": l.zip(a).map(|(l, a)| l / a),
            })
        })
        .collect();
    write_results(
        "ledger",
        &json!({
            "bench": "ledger",
            "what": "reserve + release of one ticket on the engine's ledger vs fetch_add + fetch_sub on one AtomicUsize",
            "rows": rows,
        }),
    )
    .expect("write the bench results");
}
