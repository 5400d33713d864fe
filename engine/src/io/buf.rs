//! Page-aligned staging buffers and their pool (whose first buffers the rings register).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::MmapMut;
use parking_lot::Mutex;

/// A page-aligned staging buffer. Dropping it returns it to its pool.
pub(crate) struct IoBuf {
    map: Option<MmapMut>,
    /// Bytes filled.
    pub len: usize,
    /// Index among the buffers registered with the rings, if it has one.
    pub slot: Option<u16>,
    pool: Arc<BufferPool>,
}

impl IoBuf {
    pub(crate) fn capacity(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.map.as_ref().map_or(std::ptr::null(), |m| m.as_ptr())
    }

    /// The whole buffer, for filling.
    pub(crate) fn space(&mut self) -> &mut [u8] {
        match self.map.as_mut() {
            Some(m) => &mut m[..],
            None => &mut [],
        }
    }

    /// The first `n` bytes (filled or not).
    pub(crate) fn filled_to(&self, n: usize) -> &[u8] {
        match self.map.as_ref() {
            Some(m) => &m[..n.min(m.len())],
            None => &[],
        }
    }

    /// The filled part.
    pub(crate) fn filled(&self) -> &[u8] {
        match self.map.as_ref() {
            Some(m) => &m[..self.len],
            None => &[],
        }
    }

    /// Appends `data`; the caller checked it fits.
    #[inline]
    pub(crate) fn push(&mut self, data: &[u8]) {
        let at = self.len;
        self.space()[at..at + data.len()].copy_from_slice(data);
        self.len += data.len();
    }

    pub(crate) fn remaining(&self) -> usize {
        self.capacity() - self.len
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            self.pool.put(map, self.slot);
        }
    }
}

/// A pool of page-aligned staging buffers of one size. The first `max_slots` buffers it ever
/// makes get a registration slot and are kept for the engine's life (the rings register them
/// as fixed buffers); others are kept up to `retain` and unmapped beyond that.
#[derive(Debug)]
pub(crate) struct BufferPool {
    size: usize,
    max_slots: usize,
    retain: usize,
    slotted: Mutex<Vec<(MmapMut, u16)>>,
    plain: Mutex<Vec<MmapMut>>,
    next_slot: AtomicUsize,
}

impl BufferPool {
    pub(crate) fn new(size: usize, max_slots: usize, retain: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            size,
            max_slots,
            retain,
            slotted: Mutex::new(Vec::new()),
            plain: Mutex::new(Vec::new()),
            next_slot: AtomicUsize::new(0),
        })
    }

    /// Bytes in one buffer.
    pub(crate) fn buffer_capacity(&self) -> usize {
        self.size
    }

    pub(crate) fn max_slots(&self) -> usize {
        self.max_slots
    }

    /// A buffer, empty. Maps a new one when none is free.
    pub(crate) fn get(self: &Arc<Self>) -> io::Result<IoBuf> {
        if let Some((map, slot)) = self.slotted.lock().pop() {
            return Ok(self.wrap(map, Some(slot)));
        }
        if let Some(map) = self.plain.lock().pop() {
            return Ok(self.wrap(map, None));
        }
        let map = MmapMut::map_anon(self.size)?;
        let slot = if self.next_slot.load(Ordering::Relaxed) < self.max_slots {
            let s = self.next_slot.fetch_add(1, Ordering::Relaxed);
            (s < self.max_slots).then_some(s as u16)
        } else {
            None
        };
        Ok(self.wrap(map, slot))
    }

    fn wrap(self: &Arc<Self>, map: MmapMut, slot: Option<u16>) -> IoBuf {
        IoBuf {
            map: Some(map),
            len: 0,
            slot,
            pool: self.clone(),
        }
    }

    fn put(&self, map: MmapMut, slot: Option<u16>) {
        match slot {
            Some(s) => self.slotted.lock().push((map, s)),
            None => {
                let mut plain = self.plain.lock();
                if plain.len() < self.retain {
                    plain.push(map);
                }
            }
        }
    }
}
