//! What an engine error means where it happened: [`verdict`], and the op's judges built on it.

use spillring::SpillError;

use super::ops::Op;
use crate::stats::Counters;

/// Whether an error is acceptable where it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The expected abort of a cancelled op.
    Aborted,
    /// A fault explains it: one loadgen injected (its errno), or a full device.
    Fault,
    /// An admission refusal (ledger full, quota exceeded): no file was created.
    Refused,
    /// A violation, and why.
    Bad(String),
}

/// True if `e` is an I/O error with the errno loadgen's fault plan injects: a fault of ours,
/// not something the engine or the storage did.
pub fn is_injected(e: &SpillError) -> bool {
    matches!(e, SpillError::Io { .. })
        && e.os_error().and_then(std::io::Error::raw_os_error) == Some(crate::run::INJECTED_ERRNO)
}

/// Judges an engine error. `cancelled`: the op's scope was cancelled (or the cancel races the
/// call); `faults`: loadgen's fault plan is armed.
///
/// An I/O error is acceptable only when it carries the errno loadgen injects (so only with
/// faults on): a fault-caused error is distinguishable from a cancel, and any other I/O error
/// (a bare `NotFound` of a file an abort deleted, above all) is a violation even with faults
/// on. A full device (`StorageFull`, which loadgen also injects) and an admission refusal are
/// the environment's doing and acceptable either way; `Aborted` only after a cancel.
pub fn verdict(e: &SpillError, cancelled: bool, faults: bool) -> Verdict {
    match e {
        SpillError::Aborted if cancelled => Verdict::Aborted,
        // A reader's state gone with its scope's normal close (the scope ends either way).
        SpillError::ScopeClosed { .. } if cancelled => Verdict::Aborted,
        SpillError::Aborted => {
            Verdict::Bad(format!("Aborted although the task was not cancelled: {e}"))
        }
        SpillError::StorageFull { .. } => Verdict::Fault,
        // After a cancel: a refusal from a retry loop that gave up before the cancel landed.
        SpillError::LedgerFull { .. }
        | SpillError::QuotaExceeded { .. }
        | SpillError::WriterCannotFit { .. } => Verdict::Refused,
        SpillError::Io { .. } if faults && is_injected(e) => Verdict::Fault,
        _ if cancelled => Verdict::Bad(format!(
            "after a cancel: {e} (expected Aborted, or an injected fault with errno {}: an \
             executor must be able to tell a cancel from a fault)",
            crate::run::INJECTED_ERRNO
        )),
        SpillError::Io { .. } if faults => Verdict::Bad(format!(
            "I/O error that no injected fault explains (loadgen injects errno {}): {e}",
            crate::run::INJECTED_ERRNO
        )),
        _ => Verdict::Bad(format!("unexpected error: {e}")),
    }
}

impl Op<'_> {
    /// Judges an error seen where no cancel was issued (see [`verdict`]); reports a violation.
    pub(super) fn judge(&self, stage: &str, e: &SpillError) -> Verdict {
        let v = verdict(e, false, self.ctx.faults);
        match &v {
            Verdict::Fault => Counters::add(&self.ctx.stats.c.ops_failed_by_fault, 1),
            Verdict::Bad(why) => self.bad("api", stage, why.clone()),
            Verdict::Aborted | Verdict::Refused => {}
        }
        v
    }

    /// Judges an error seen after (or racing) a cancel (see [`verdict`]); reports a violation.
    pub(super) fn judge_cancelled(&self, stage: &str, e: &SpillError) -> Verdict {
        let v = verdict(e, true, self.ctx.faults);
        if let Verdict::Bad(why) = &v {
            self.bad("api", stage, why.clone());
        }
        v
    }

    /// Judges the error of a reader or a read of a live state (nobody cancelled it): a
    /// violation unless an injected fault explains it.
    pub(super) fn judge_live_read(&self, stage: &str, at: usize, e: &SpillError) -> Verdict {
        let v = match verdict(e, false, self.ctx.faults) {
            Verdict::Fault => Verdict::Fault,
            Verdict::Bad(why) => Verdict::Bad(why),
            // Neither a refusal nor an abort is an answer a read of a live state may give.
            Verdict::Aborted | Verdict::Refused => Verdict::Bad(format!("unexpected error: {e}")),
        };
        match &v {
            Verdict::Fault => Counters::add(&self.ctx.stats.c.ops_failed_by_fault, 1),
            Verdict::Bad(why) => self.bad(
                "api",
                stage,
                format!("at record {at} of a live state: {why}"),
            ),
            Verdict::Aborted | Verdict::Refused => {}
        }
        v
    }

    /// A call that must fail with `Aborted` now that the cancel returned. (`write`, `finish`
    /// and `read` errors were tallied by their wrappers; the others are tallied here.)
    pub(super) fn expect_aborted<T>(&self, stage: &str, r: Result<T, SpillError>) {
        match r {
            Ok(_) => self.bad(
                "api",
                stage,
                "succeeded after the task was cancelled".into(),
            ),
            Err(e) => {
                if !matches!(stage, "write" | "finish" | "read") {
                    self.ctx.stats.error(stage, &e);
                }
                // A reader's state gone with a normal close of its scope says so
                // (`ScopeClosed`); after a cancel it is `Aborted`.
                let expected = match &e {
                    SpillError::Aborted => true,
                    SpillError::ScopeClosed { .. } => !self.task.is_cancelled(),
                    _ => false,
                };
                if !expected {
                    self.bad(
                        "api",
                        stage,
                        format!("after a cancel: {e} instead of Aborted"),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::INJECTED_ERRNO;

    fn io(e: std::io::Error) -> SpillError {
        SpillError::Io {
            op: "open",
            path: "/r/spillring-0/op1/spill-segment-000001.bin".into(),
            source: e,
        }
    }

    fn errno(n: i32) -> SpillError {
        io(std::io::Error::from_raw_os_error(n))
    }

    fn is_bad(v: &Verdict) -> bool {
        matches!(v, Verdict::Bad(_))
    }

    /// Invariant 6: a reader whose files an abort deleted reports Aborted, never a bare
    /// NotFound, and faults being on must not excuse one.
    #[test]
    fn after_a_cancel_only_the_injected_errno_is_a_fault() {
        for faults in [true, false] {
            for e in [
                io(std::io::ErrorKind::NotFound.into()),
                errno(libc::ENOENT),
                errno(libc::EIO),
                errno(libc::EBADF),
                errno(libc::ECANCELED),
                SpillError::Closed { what: "writer" },
                SpillError::WriterFailed,
            ] {
                let v = verdict(&e, true, faults);
                assert!(is_bad(&v), "{e} after a cancel (faults {faults}): {v:?}");
            }
        }
        let v = verdict(&io(std::io::ErrorKind::NotFound.into()), true, true);
        let Verdict::Bad(why) = v else { unreachable!() };
        assert!(why.contains("after a cancel"), "{why}");
        assert_eq!(verdict(&errno(INJECTED_ERRNO), true, true), Verdict::Fault);
        // Without a plan nothing is injected: not even that errno is excused.
        assert!(is_bad(&verdict(&errno(INJECTED_ERRNO), true, false)));
        assert_eq!(verdict(&SpillError::Aborted, true, true), Verdict::Aborted);
        assert_eq!(verdict(&SpillError::Aborted, true, false), Verdict::Aborted);
        let full = SpillError::StorageFull {
            op: "write",
            path: "/r/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(verdict(&full, true, true), Verdict::Fault);
        assert_eq!(
            verdict(&SpillError::LedgerFull { capacity: 4 }, true, true),
            Verdict::Refused
        );
    }

    #[test]
    fn without_a_cancel_only_the_injected_errno_is_a_fault() {
        assert_eq!(verdict(&errno(INJECTED_ERRNO), false, true), Verdict::Fault);
        for faults in [true, false] {
            for e in [
                errno(libc::EIO),
                errno(libc::ENOENT),
                SpillError::Aborted,
                SpillError::WriterFailed,
            ] {
                let v = verdict(&e, false, faults);
                assert!(is_bad(&v), "{e} without a cancel (faults {faults}): {v:?}");
            }
        }
        assert!(is_bad(&verdict(&errno(INJECTED_ERRNO), false, false)));
        assert_eq!(
            verdict(
                &SpillError::QuotaExceeded {
                    limit: 1,
                    in_use: 1,
                    requested: 1
                },
                false,
                false
            ),
            Verdict::Refused
        );
        assert!(is_injected(&errno(INJECTED_ERRNO)));
        assert!(!is_injected(&errno(libc::EIO)));
        assert!(!is_injected(&SpillError::Aborted));
    }
}
