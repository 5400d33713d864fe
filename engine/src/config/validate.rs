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
        fn bad(field: &'static str, need: impl Into<String>, got: impl ToString) -> Result<()> {
            Err(SpillError::InvalidConfig {
                field,
                need: need.into(),
                got: got.to_string(),
            })
        }
        /// `v` in `lo..=hi`, else the error that says so.
        fn within<T: PartialOrd + Copy + std::fmt::Display>(
            f: &'static str,
            lo: T,
            hi: T,
            v: T,
        ) -> Result<()> {
            if (lo..=hi).contains(&v) {
                return Ok(());
            }
            bad(f, format!("{lo}..={hi}"), v)
        }
        within("roots", 1, 64, self.roots.len())?;
        for (i, r) in self.roots.iter().enumerate() {
            if r.as_os_str().is_empty() {
                return bad("roots", "non-empty paths", "an empty path");
            }
            if self.roots[..i].contains(r) {
                return bad(
                    "roots",
                    "distinct paths",
                    format!("{} given twice", r.display()),
                );
            }
        }
        if !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&self.segment_size)
            || !self.segment_size.is_multiple_of(DIRECT_ALIGN as u64)
        {
            return bad(
                "segment_size",
                format!("{MIN_SEGMENT_SIZE}..={MAX_SEGMENT_SIZE} and a multiple of 4096"),
                self.segment_size,
            );
        }
        within(
            "ticket_capacity",
            1,
            MAX_TICKET_CAPACITY,
            self.ticket_capacity,
        )?;
        if let Some(q) = self.max_spill_bytes
            && q < self.segment_size
        {
            return bad(
                "max_spill_bytes",
                format!("at least segment_size ({})", self.segment_size),
                q,
            );
        }
        within("ring_threads", 1, 64, self.ring_threads)?;
        if !(8..=32_768).contains(&self.ring_entries) || !self.ring_entries.is_power_of_two() {
            return bad(
                "ring_entries",
                "a power of two in 8..=32768",
                self.ring_entries,
            );
        }
        if !(4096..=64 << 20).contains(&self.io_buffer_size)
            || !self.io_buffer_size.is_multiple_of(DIRECT_ALIGN)
            || self.io_buffer_size as u64 > self.segment_size
        {
            return bad(
                "io_buffer_size",
                "4096..=64 MiB, a multiple of 4096 and at most segment_size",
                self.io_buffer_size,
            );
        }
        within("queue_depth", 1, 1024, self.queue_depth)?;
        if !(self.io_buffer_size..=MAX_BUFFER_MEMORY).contains(&self.max_buffer_memory) {
            return bad(
                "max_buffer_memory",
                format!("io_buffer_size ({})..=1 TiB", self.io_buffer_size),
                self.max_buffer_memory,
            );
        }
        within("registered_buffers", 0, 16_384, self.registered_buffers)?;
        if let Compression::Zstd { level } = self.compression
            && !(-7..=22).contains(&level)
        {
            return bad("compression", "a zstd level in -7..=22", level);
        }
        if self.large_record_threshold == 0 || self.large_record_threshold > u32::MAX as usize {
            return bad(
                "large_record_threshold",
                "1..=u32::MAX",
                self.large_record_threshold,
            );
        }
        let hour = Duration::from_secs(3600);
        if self.cleanup_retry_delay < Duration::from_millis(1) || self.cleanup_retry_delay > hour {
            return bad(
                "cleanup_retry_delay",
                "1 ms..=1 h",
                format!("{:?}", self.cleanup_retry_delay),
            );
        }
        if !(Duration::from_millis(1)..=24 * hour).contains(&self.orphan_rescan) {
            return bad(
                "orphan_rescan",
                "1 ms..=24 h",
                format!("{:?}", self.orphan_rescan),
            );
        }
        within("read_buffer_max", 0, 64 << 20, self.read_buffer_max)?;
        if self.max_read_memory > MAX_BUFFER_MEMORY {
            return bad("max_read_memory", "0..=1 TiB", self.max_read_memory);
        }
        within("max_open_files", 1, MAX_OPEN_FILES, self.max_open_files)?;
        within("pool_max_segments", 0, 65_536, self.pool_max_segments)?;
        within("cleanup_batch", 1, 65_536, self.cleanup_batch)?;
        if self.root_skip > hour {
            return bad("root_skip", "at most 1 h", format!("{:?}", self.root_skip));
        }
        if self.shutdown_budget > hour {
            return bad(
                "shutdown_budget",
                "at most 1 h",
                format!("{:?}", self.shutdown_budget),
            );
        }
        Ok(())
    }
}
