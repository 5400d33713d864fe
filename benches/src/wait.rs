//! Waiting for the engine's deletes and other conditions a bench depends on.

use std::time::{Duration, Instant};

use spillring::Engine;

/// Waits until every delete the engine was asked to do is confirmed (`pending_deletes() == 0`),
/// yielding between checks: fine-grained enough to time a cycle, unlike `Engine::settle`.
/// Panics after `timeout` (the bench would otherwise measure nothing meaningful).
pub fn wait_deletes(engine: &Engine, timeout: Duration) {
    let start = Instant::now();
    let mut spins = 0u32;
    while engine.pending_deletes() != 0 {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        if spins.is_multiple_of(4096) && start.elapsed() > timeout {
            panic!(
                "deletes still pending after {timeout:?}: {}",
                engine.pending_deletes()
            );
        }
    }
}

/// Polls `cond` every 200 µs until it holds; panics after `timeout` naming `what`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}
