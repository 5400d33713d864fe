//! Hooks for benches and tests outside the crate. Not a stable API.

use std::sync::Arc;

use crate::error::Result;
use crate::ledger::{Ledger, Ticket};

/// A stand-alone ticket ledger, to measure reserve/release.
#[derive(Debug, Clone)]
pub struct LedgerProbe(Arc<Ledger>);

/// A reserved ticket; dropping it releases it.
#[derive(Debug)]
pub struct TicketProbe(#[allow(dead_code)] Ticket);

impl LedgerProbe {
    /// A ledger of `capacity` tickets and an optional byte quota.
    pub fn new(capacity: usize, max_bytes: Option<u64>) -> Self {
        LedgerProbe(Ledger::new(capacity, max_bytes))
    }

    /// Reserves one ticket holding `bytes` of quota.
    pub fn reserve(&self, bytes: u64) -> Result<TicketProbe> {
        self.0.reserve(bytes).map(TicketProbe)
    }

    /// Tickets held now.
    pub fn used(&self) -> usize {
        self.0.used()
    }
}

/// Size in bytes of one name-only cleanup record.
pub const CLEANUP_RECORD_BYTES: usize = std::mem::size_of::<crate::cleanup::Record>();
