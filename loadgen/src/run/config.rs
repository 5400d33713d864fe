//! The engine a run opens: its configuration from the workload flags, and the engine-wide
//! fault plan of `--fault-rate`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use spillring::{
    BackendKind, EngineConfig, FaultAction, FaultPlan, FaultPoint, Trigger, WriteMode,
};

use crate::args::{Backend, FaultPointArg, Mode, Workload};

/// The fault points the engine-wide plan arms (the pause points are armed per task).
pub const FAULT_POINTS: [FaultPoint; 4] = [
    FaultPoint::WriterCreate,
    FaultPoint::IoWrite,
    FaultPoint::IoUnlink,
    FaultPoint::CleanupUnlink,
];

/// The errno of the I/O errors loadgen injects: one that real storage never returns for a
/// create, a write or an unlink (it belongs to robust mutexes), so that an I/O error is known to
/// be an injected fault only when it carries this errno. Any other I/O error (a bare `NotFound`
/// after a cancel above all) is the engine's or the storage's, and a violation.
pub const INJECTED_ERRNO: i32 = libc::ENOTRECOVERABLE;

/// The engine-wide fault plan of `--fault-rate p`: creates fail with [`INJECTED_ERRNO`] or
/// ENOSPC; writes fail with [`INJECTED_ERRNO`] or ENOSPC, or are done and then reported failed
/// (ambiguous); unlinks on the normal path and on the cleanup worker's fail, or are done and
/// reported failed (ambiguous). (ENOSPC is what makes the engine skip a root for a while.)
pub fn fault_plan(seed: u64, p: f64, only: &[FaultPointArg]) -> Arc<FaultPlan> {
    let plan = FaultPlan::new(crate::data::mix(seed ^ 0xFA17));
    let on = |x: FaultPointArg| only.is_empty() || only.contains(&x);
    // Rules of one point see the same random draw: later rules use cumulative thresholds.
    if on(FaultPointArg::WriterCreate) {
        plan.arm(
            FaultPoint::WriterCreate,
            FaultAction::Fail(INJECTED_ERRNO),
            Trigger::Probability(p / 2.0),
        );
        plan.arm(
            FaultPoint::WriterCreate,
            FaultAction::Fail(libc::ENOSPC),
            Trigger::Probability(p),
        );
    }
    if on(FaultPointArg::IoWrite) {
        plan.arm(
            FaultPoint::IoWrite,
            FaultAction::Fail(INJECTED_ERRNO),
            Trigger::Probability(p / 3.0),
        );
        plan.arm(
            FaultPoint::IoWrite,
            FaultAction::Fail(libc::ENOSPC),
            Trigger::Probability(p * 2.0 / 3.0),
        );
        plan.arm(
            FaultPoint::IoWrite,
            FaultAction::FailAfter(INJECTED_ERRNO),
            Trigger::Probability(p),
        );
    }
    for (arg, point) in [
        (FaultPointArg::IoUnlink, FaultPoint::IoUnlink),
        (FaultPointArg::CleanupUnlink, FaultPoint::CleanupUnlink),
    ] {
        if on(arg) {
            plan.arm(
                point,
                FaultAction::Fail(INJECTED_ERRNO),
                Trigger::Probability(p / 2.0),
            );
            plan.arm(
                point,
                FaultAction::FailAfter(INJECTED_ERRNO),
                Trigger::Probability(p),
            );
        }
    }
    plan
}

/// The engine configuration of a workload on `root` (its roots, see
/// [`Workload::spill_roots`]).
pub fn engine_config(w: &Workload, root: &Path) -> EngineConfig {
    let roots = w.spill_roots(root);
    let mut cfg = EngineConfig::new(&roots[0]);
    for r in &roots[1..] {
        cfg = cfg.add_root(r);
    }
    let mut cfg = cfg
        .mode(match w.mode {
            Mode::Buffered => WriteMode::Buffered,
            Mode::Direct => WriteMode::Direct,
        })
        .backend(match w.backend {
            Backend::Auto => BackendKind::Auto,
            Backend::Uring => BackendKind::Uring,
            Backend::Psync => BackendKind::Psync,
        })
        .segment_size(w.segment_size)
        .ticket_capacity(w.ticket_capacity)
        .io_buffer_size(w.io_buffer_size.min(w.segment_size))
        .cleanup_retry_delay(Duration::from_millis(w.cleanup_retry_ms.max(1)))
        .root_skip(Duration::from_millis(w.root_skip_ms))
        .preallocate(w.preallocate);
    if let Some(q) = w.max_spill_bytes {
        cfg = cfg.max_spill_bytes(q);
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{Verdict, is_injected, verdict};
    use spillring::{Engine, SpillError};

    /// Every error loadgen's own fault plan causes is one its verdict tells from a cancel:
    /// the injected errno, or a full device.
    #[test]
    fn injected_faults_are_recognised() {
        for (point, backend) in [
            (FaultPointArg::WriterCreate, BackendKind::Auto),
            (FaultPointArg::IoWrite, BackendKind::Auto),
            (FaultPointArg::IoWrite, BackendKind::Psync),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let plan = fault_plan(7, 1.0, &[point]);
            let engine = Engine::open(
                EngineConfig::new(dir.path())
                    .backend(backend)
                    .segment_size(64 << 10)
                    .io_buffer_size(16 << 10)
                    .fault_plan(plan),
            )
            .unwrap();
            let (mut injected, mut full) = (0, 0);
            for i in 0..40 {
                let task = engine.task(&format!("t{i}")).unwrap();
                let mut w = task.writer().unwrap();
                let mut r = Ok(());
                for _ in 0..4 {
                    r = w.write(bytes::Bytes::from(vec![7u8; 20 << 10]));
                    if r.is_err() {
                        break;
                    }
                }
                let e = match r {
                    Err(e) => e,
                    Ok(()) => w.finish().map(drop).unwrap_err(),
                };
                match &e {
                    SpillError::StorageFull { .. } => full += 1,
                    e if is_injected(e) => injected += 1,
                    e => panic!("{point:?} on {backend:?}: not an injected fault: {e}"),
                }
                assert_eq!(verdict(&e, true, true), Verdict::Fault, "{e}");
                assert_eq!(verdict(&e, false, true), Verdict::Fault, "{e}");
                task.close();
            }
            assert!(
                injected > 0 && full > 0,
                "{point:?}: {injected} injected, {full} full"
            );
            drop(engine);
        }
    }
}
