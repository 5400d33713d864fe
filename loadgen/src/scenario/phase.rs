//! What each worker is doing, for the stall report: a [`Phase`] per worker [`Slot`].

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// What a worker is doing, for the stall report.
#[derive(Debug, Default)]
pub struct Slot {
    pub op: AtomicU64,
    phase: AtomicU8,
}

impl Slot {
    pub fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }

    /// The phase last set (`None` for a value no phase has, which cannot happen).
    pub fn phase(&self) -> Option<Phase> {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }
}

/// A worker's phase, as the stall report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Idle,
    Writing,
    Finishing,
    Reading,
    Publishing,
    Cancelling,
    WaitingForControl,
    Closing,
    Done,
}

impl Phase {
    /// Every phase, in the order of their values.
    pub const ALL: [Phase; 9] = [
        Phase::Idle,
        Phase::Writing,
        Phase::Finishing,
        Phase::Reading,
        Phase::Publishing,
        Phase::Cancelling,
        Phase::WaitingForControl,
        Phase::Closing,
        Phase::Done,
    ];

    /// The name printed in the stall report.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Writing => "writing",
            Phase::Finishing => "finishing",
            Phase::Reading => "reading",
            Phase::Publishing => "publishing",
            Phase::Cancelling => "cancelling",
            Phase::WaitingForControl => "waiting for control",
            Phase::Closing => "closing",
            Phase::Done => "done",
        }
    }

    fn from_u8(v: u8) -> Option<Phase> {
        Phase::ALL.get(usize::from(v)).copied()
    }
}

/// A stall report line per worker.
pub fn describe_slots(slots: &[Slot]) -> Vec<String> {
    slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            format!(
                "worker {i}: op{} {}",
                s.op.load(Ordering::Relaxed),
                s.phase().map_or("?", Phase::as_str)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stall report names the phases as it always did.
    #[test]
    fn phases_keep_their_values_and_names() {
        let names = [
            "idle",
            "writing",
            "finishing",
            "reading",
            "publishing",
            "cancelling",
            "waiting for control",
            "closing",
            "done",
        ];
        for (i, p) in Phase::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i, "{p:?}");
            assert_eq!(p.as_str(), names[i]);
            assert_eq!(Phase::from_u8(i as u8), Some(p));
        }
        assert_eq!(Phase::from_u8(9), None);
        let slot = Slot::default();
        assert_eq!(slot.phase(), Some(Phase::Idle));
        slot.set_phase(Phase::WaitingForControl);
        assert_eq!(
            describe_slots(std::slice::from_ref(&slot)),
            ["worker 0: op0 waiting for control"]
        );
    }
}
