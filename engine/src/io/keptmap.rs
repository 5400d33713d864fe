//! Segment maps kept across uses of a pooled file (buffered mode): a reader that mapped a
//! segment leaves the map with the file, and the reader of the file's next use (after the
//! pool's next writer sealed it) reads through the same map. No `mmap`, no page faults (the
//! page tables still point at the file's page-cache pages, which the next writer's `pwrite`s
//! fill in place) and no `munmap` with its TLB shootdown per cycle.
//!
//! A kept map is only ever dereferenced through the records of a reader of a sealed segment;
//! while a writer writes the file again no record of it lives (a segment goes back to the pool
//! only once every record of its last reader is gone), so no `&[u8]` into the map exists while
//! its bytes change. See `sys/mem.rs`.
//!
//! Bounded: at most [`KeptMaps::MAX_MAPS`] maps and `max_bytes` mapped bytes (the engine's
//! read memory bound, `EngineConfig::max_read_memory`, less what its free read buffers may
//! hold) are kept engine-wide; a reader past the bound maps as before and unmaps when its records go.
//! A kept map is unmapped on the reaper when the last holder (the file's entry, a record)
//! lets go of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memmap2::Mmap;

use super::{Reaped, Reaper};

/// The engine-wide bound on kept maps.
#[derive(Debug)]
pub(crate) struct KeptMaps {
    maps: AtomicUsize,
    bytes: AtomicU64,
    max_bytes: u64,
}

impl KeptMaps {
    /// Maps kept at most.
    pub(crate) const MAX_MAPS: usize = 64;

    /// A bound of `max_bytes` mapped bytes. Kept maps count in the process's RSS (the pages
    /// a reader touched stay mapped), so this is part of the engine's memory bound (issue 25,
    /// item 5: with a fixed 1 GiB here, 128 states of 2 MiB read back held 166 MiB after they
    /// were dropped under a 64 MiB `max_buffer_memory`).
    pub(crate) fn new(max_bytes: u64) -> Self {
        KeptMaps {
            maps: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            max_bytes,
        }
    }

    /// Kept maps now, and their bytes.
    pub(crate) fn held(&self) -> (usize, u64) {
        (
            self.maps.load(Ordering::Acquire),
            self.bytes.load(Ordering::Acquire),
        )
    }

    /// Makes `map` a kept map if the bound has room; gives it back otherwise.
    pub(crate) fn keep(
        self: &Arc<Self>,
        map: Mmap,
        reaper: &Reaper,
    ) -> std::result::Result<SharedMap, Mmap> {
        let len = map.len() as u64;
        if self
            .maps
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < Self::MAX_MAPS).then_some(n + 1)
            })
            .is_err()
        {
            return Err(map);
        }
        if self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b + len <= self.max_bytes).then_some(b + len)
            })
            .is_err()
        {
            self.maps.fetch_sub(1, Ordering::AcqRel);
            return Err(map);
        }
        Ok(SharedMap(Arc::new(Inner {
            map: Some(map),
            reaper: reaper.clone(),
            bound: self.clone(),
        })))
    }
}

/// A kept map: held by its file's entry and by the records read through it.
#[derive(Debug, Clone)]
pub(crate) struct SharedMap(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    map: Option<Mmap>,
    reaper: Reaper,
    bound: Arc<KeptMaps>,
}

impl SharedMap {
    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.map.as_deref().unwrap_or(&[])
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes().len()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(m) = self.map.take() {
            let len = m.len() as u64;
            self.reaper.reap(Reaped::Map(m));
            self.bound.bytes.fetch_sub(len, Ordering::AcqRel);
            self.bound.maps.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn map_of(len: usize) -> Mmap {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        crate::sys::mem::map_segment(f.as_fd(), len).unwrap()
    }

    /// The bound refuses a map past its count, and a dropped kept map gives its room back.
    #[test]
    fn kept_maps_keep_their_bound_and_give_room_back() {
        let bound = Arc::new(KeptMaps::new(1 << 30));
        let reaper = Reaper::inline();
        let mut kept = Vec::new();
        for _ in 0..KeptMaps::MAX_MAPS {
            kept.push(bound.keep(map_of(4096), &reaper).unwrap());
        }
        assert_eq!(
            bound.held(),
            (KeptMaps::MAX_MAPS, 4096 * KeptMaps::MAX_MAPS as u64)
        );
        assert!(bound.keep(map_of(4096), &reaper).is_err(), "past the count");
        let clone = kept[0].clone();
        drop(kept.remove(0));
        assert_eq!(
            bound.held().0,
            KeptMaps::MAX_MAPS,
            "a record still holds it"
        );
        assert_eq!(clone.bytes()[4095], 7);
        drop(clone);
        assert_eq!(bound.held().0, KeptMaps::MAX_MAPS - 1);
        let m = bound.keep(map_of(4096), &reaper).unwrap();
        assert_eq!(m.len(), 4096);
        drop(m);
        drop(kept);
        assert_eq!(bound.held(), (0, 0));
    }

    /// The byte bound refuses a map that would pass it, and takes none of the count then.
    #[test]
    fn the_byte_bound_refuses_without_taking_a_count() {
        let bound = Arc::new(KeptMaps::new(3 * 4096));
        let reaper = Reaper::inline();
        let two = bound.keep(map_of(2 * 4096), &reaper).unwrap();
        assert!(
            bound.keep(map_of(2 * 4096), &reaper).is_err(),
            "past the bytes"
        );
        assert_eq!(bound.held(), (1, 2 * 4096));
        let one = bound.keep(map_of(4096), &reaper).unwrap();
        assert_eq!(bound.held(), (2, 3 * 4096), "exactly at the bound fits");
        drop((one, two));
        assert!(
            Arc::new(KeptMaps::new(0))
                .keep(map_of(4096), &reaper)
                .is_err()
        );
    }
}
