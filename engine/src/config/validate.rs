//! Validation: the derived defaults applied (`resolved`) and every field's bounds checked
//! (`validate`, `check`).

use std::time::Duration;

use crate::error::{Result, SpillError};

use super::{
    Compression, DEFAULT_IO_BUFFER_SIZE, DEFAULT_SEGMENT_SIZE, DIRECT_ALIGN, EngineConfig,
    MAX_BUFFER_MEMORY, MAX_OPEN_FILES, MAX_SEGMENT_SIZE, MAX_TICKET_CAPACITY, MIN_SEGMENT_SIZE,
};

impl EngineConfig {
    /// The configuration with every derived default applied: a field the caller did not set
    /// follows the fields it depends on, so any valid value of one field works with the
    /// defaults of the rest (`segment_size` follows a smaller `max_spill_bytes`;
    /// `io_buffer_size` follows a smaller `segment_size`).
    pub(crate) fn resolved(&self) -> EngineConfig {
        let mut c = self.clone();
        if !c.explicit.segment_size
            && let Some(q) = c.max_spill_bytes
        {
            let floor = q - q % DIRECT_ALIGN as u64;
            c.segment_size = DEFAULT_SEGMENT_SIZE.min(floor).max(MIN_SEGMENT_SIZE);
        }
        if !c.explicit.max_read_memory {
            c.max_read_memory = c.max_buffer_memory;
        }
        if !c.explicit.io_buffer_size {
            c.io_buffer_size = usize::try_from(c.segment_size)
                .unwrap_or(usize::MAX)
                .min(DEFAULT_IO_BUFFER_SIZE);
        }
        c
    }

    /// Checks every field against its bounds (after applying the derived defaults).
    pub fn validate(&self) -> Result<()> {
        self.resolved().check()
    }

    /// Checks the bounds of a resolved configuration.
    pub(crate) fn check(&self) -> Result<()> {
        fn bad(msg: String) -> Result<()> {
            Err(SpillError::InvalidConfig(msg))
        }
        if self.roots.is_empty() || self.roots.len() > 64 {
            return bad(format!("roots: need 1..=64, got {}", self.roots.len()));
        }
        for (i, r) in self.roots.iter().enumerate() {
            if r.as_os_str().is_empty() {
                return bad("roots: an empty path".into());
            }
            if self.roots[..i].contains(r) {
                return bad(format!("roots: {} given twice", r.display()));
            }
        }
        if !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&self.segment_size)
            || !self.segment_size.is_multiple_of(DIRECT_ALIGN as u64)
        {
            return bad(format!(
                "segment_size: need {MIN_SEGMENT_SIZE}..={MAX_SEGMENT_SIZE} and a multiple of 4096, got {}",
                self.segment_size
            ));
        }
        if !(1..=MAX_TICKET_CAPACITY).contains(&self.ticket_capacity) {
            return bad(format!(
                "ticket_capacity: need 1..={MAX_TICKET_CAPACITY}, got {}",
                self.ticket_capacity
            ));
        }
        if let Some(q) = self.max_spill_bytes
            && q < self.segment_size
        {
            return bad(format!(
                "max_spill_bytes: need at least segment_size ({}), got {q}",
                self.segment_size
            ));
        }
        if !(1..=64).contains(&self.ring_threads) {
            return bad(format!(
                "ring_threads: need 1..=64, got {}",
                self.ring_threads
            ));
        }
        if !(8..=32_768).contains(&self.ring_entries) || !self.ring_entries.is_power_of_two() {
            return bad(format!(
                "ring_entries: need a power of two in 8..=32768, got {}",
                self.ring_entries
            ));
        }
        if !(4096..=64 << 20).contains(&self.io_buffer_size)
            || !self.io_buffer_size.is_multiple_of(DIRECT_ALIGN)
            || self.io_buffer_size as u64 > self.segment_size
        {
            return bad(format!(
                "io_buffer_size: need 4096..=64 MiB, a multiple of 4096 and at most segment_size, got {}",
                self.io_buffer_size
            ));
        }
        if !(1..=1024).contains(&self.queue_depth) {
            return bad(format!(
                "queue_depth: need 1..=1024, got {}",
                self.queue_depth
            ));
        }
        if !(self.io_buffer_size..=MAX_BUFFER_MEMORY).contains(&self.max_buffer_memory) {
            return bad(format!(
                "max_buffer_memory: need io_buffer_size ({})..=1 TiB, got {}",
                self.io_buffer_size, self.max_buffer_memory
            ));
        }
        if self.registered_buffers > 16_384 {
            return bad(format!(
                "registered_buffers: need 0..=16384, got {}",
                self.registered_buffers
            ));
        }
        if let Compression::Zstd { level } = self.compression
            && !(-7..=22).contains(&level)
        {
            return bad(format!("compression: zstd level need -7..=22, got {level}"));
        }
        if self.large_record_threshold == 0 || self.large_record_threshold > u32::MAX as usize {
            return bad(format!(
                "large_record_threshold: need 1..=u32::MAX, got {}",
                self.large_record_threshold
            ));
        }
        let hour = Duration::from_secs(3600);
        if self.cleanup_retry_delay < Duration::from_millis(1) || self.cleanup_retry_delay > hour {
            return bad(format!(
                "cleanup_retry_delay: need 1 ms..=1 h, got {:?}",
                self.cleanup_retry_delay
            ));
        }
        if !(Duration::from_millis(1)..=24 * hour).contains(&self.orphan_rescan) {
            return bad(format!(
                "orphan_rescan: need 1 ms..=24 h, got {:?}",
                self.orphan_rescan
            ));
        }
        if self.read_buffer_max > 64 << 20 {
            return bad(format!(
                "read_buffer_max: need 0..=67108864, got {}",
                self.read_buffer_max
            ));
        }
        if self.max_read_memory > MAX_BUFFER_MEMORY {
            return bad(format!(
                "max_read_memory: need 0..=1 TiB, got {}",
                self.max_read_memory
            ));
        }
        if !(1..=MAX_OPEN_FILES).contains(&self.max_open_files) {
            return bad(format!(
                "max_open_files: need 1..={MAX_OPEN_FILES}, got {}",
                self.max_open_files
            ));
        }
        if self.pool_max_segments > 65_536 {
            return bad(format!(
                "pool_max_segments: need 0..=65536, got {}",
                self.pool_max_segments
            ));
        }
        if !(1..=65_536).contains(&self.cleanup_batch) {
            return bad(format!(
                "cleanup_batch: need 1..=65536, got {}",
                self.cleanup_batch
            ));
        }
        if self.root_skip > hour {
            return bad(format!(
                "root_skip: need at most 1 h, got {:?}",
                self.root_skip
            ));
        }
        if self.shutdown_budget > hour {
            return bad(format!(
                "shutdown_budget: need at most 1 h, got {:?}",
                self.shutdown_budget
            ));
        }
        Ok(())
    }
}
