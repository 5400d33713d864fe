//! The process-wide pool of buffers that readers decode compressed blocks into.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::format::cursor::DecodeBufs;

/// Buffers that compressed blocks are decoded into, reused: a reader takes one per compressed
/// block and hands out `Bytes` into it; the last `Bytes` dropped gives it back. Process-wide
/// (readers without an engine use it too). Bounded in bytes, not only in count (issue 25,
/// item 2: one encrypted 256 MiB record read once kept 256 MiB for the life of the process):
/// it keeps at most [`DECODE_RETAIN`] buffers of at most [`DECODE_RETAIN_BYTES`] in all, a
/// buffer larger than that is freed when its last record drops, and it keeps nothing while
/// no engine is open (the last engine dropped empties it).
pub(crate) static DECODE_POOL: DecodePool = DecodePool::new();

/// Buffers the decode pool keeps for reuse.
pub(crate) const DECODE_RETAIN: usize = 16;

/// Bytes (capacity) the decode pool keeps in all: the largest staging buffer, so one block
/// of any valid `io_buffer_size` (or 16 of the default 1 MiB) is decoded with no allocation.
pub(crate) const DECODE_RETAIN_BYTES: usize = 64 << 20;

/// See [`DECODE_POOL`].
#[derive(Debug)]
pub(crate) struct DecodePool {
    free: Mutex<Kept>,
    /// Engines open in the process: the pool keeps buffers only while one is.
    engines: AtomicUsize,
}

#[derive(Debug)]
struct Kept {
    bufs: Vec<Vec<u8>>,
    /// The kept buffers' capacity in all.
    bytes: usize,
}

impl DecodePool {
    const fn new() -> Self {
        DecodePool {
            free: parking_lot::const_mutex(Kept {
                bufs: Vec::new(),
                bytes: 0,
            }),
            engines: AtomicUsize::new(0),
        }
    }

    /// A zero-filled buffer of `len` bytes (a reused one when there is one large enough).
    pub(crate) fn take(&'static self, len: usize) -> Decoded {
        let mut v = {
            let mut f = self.free.lock();
            let i = f.bufs.iter().position(|b| b.capacity() >= len);
            let v = match i {
                Some(i) => f.bufs.swap_remove(i),
                None => f.bufs.pop().unwrap_or_default(),
            };
            f.bytes -= v.capacity();
            v
        };
        v.clear();
        v.resize(len, 0);
        Decoded { v, pool: self }
    }

    fn give_back(&self, v: Vec<u8>) {
        if self.engines.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut f = self.free.lock();
        if f.bufs.len() < DECODE_RETAIN && f.bytes + v.capacity() <= DECODE_RETAIN_BYTES {
            f.bytes += v.capacity();
            f.bufs.push(v);
        }
    }

    /// An engine opened: the pool may keep buffers.
    pub(crate) fn engine_opened(&self) {
        self.engines.fetch_add(1, Ordering::AcqRel);
    }

    /// An engine was dropped; the last one empties the pool.
    pub(crate) fn engine_closed(&self) {
        if self.engines.fetch_sub(1, Ordering::AcqRel) == 1 {
            let bufs = {
                let mut f = self.free.lock();
                f.bytes = 0;
                std::mem::take(&mut f.bufs)
            };
            drop(bufs);
        }
    }

    /// Buffers kept now.
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().bufs.len()
    }

    /// Bytes (capacity) kept now.
    pub(crate) fn kept_bytes(&self) -> usize {
        self.free.lock().bytes
    }
}

/// The segment codec decodes into the pool's buffers.
impl DecodeBufs for &'static DecodePool {
    type Buf = Decoded;
    fn take(&self, len: usize) -> Decoded {
        DecodePool::take(self, len)
    }
}

/// A decode buffer; back to its pool on drop. Wrap it in `Bytes::from_owner`.
#[derive(Debug)]
pub(crate) struct Decoded {
    v: Vec<u8>,
    pool: &'static DecodePool,
}

impl AsMut<[u8]> for Decoded {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v
    }
}

impl AsRef<[u8]> for Decoded {
    fn as_ref(&self) -> &[u8] {
        &self.v
    }
}

impl Drop for Decoded {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.v));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The pool keeps buffers up to its byte bound, never one larger than it, and reuses
    /// what it kept.
    #[test]
    fn the_pool_is_bounded_in_bytes_and_frees_large_buffers() {
        // A pool of the test's own (a static: no leak for LeakSanitizer to report).
        static P: DecodePool = DecodePool::new();
        let p = &P;
        p.engine_opened();
        drop(p.take(DECODE_RETAIN_BYTES + 1));
        assert_eq!(
            (p.kept(), p.kept_bytes()),
            (0, 0),
            "a buffer past the bound is freed"
        );
        let held: Vec<Decoded> = (0..3).map(|_| p.take(24 << 20)).collect();
        drop(held);
        assert_eq!(p.kept(), 2, "two of 24 MiB fit 64 MiB, the third does not");
        assert!(p.kept_bytes() <= DECODE_RETAIN_BYTES && p.kept_bytes() >= 48 << 20);
        let again = p.take(1 << 20);
        assert_eq!(p.kept(), 1, "a kept buffer is reused");
        assert!(again.as_ref().iter().all(|&b| b == 0) && again.as_ref().len() == 1 << 20);
        drop(again);
        let small: Vec<Decoded> = (0..DECODE_RETAIN + 4).map(|_| p.take(4096)).collect();
        drop(small);
        assert_eq!(p.kept(), DECODE_RETAIN, "and at most DECODE_RETAIN buffers");
    }

    /// The last engine closed empties the pool, and with no engine open nothing is kept.
    #[test]
    fn the_last_engine_empties_the_pool() {
        static P: DecodePool = DecodePool::new();
        let p = &P;
        p.engine_opened();
        p.engine_opened();
        drop(p.take(1 << 20));
        p.engine_closed();
        assert_eq!(p.kept(), 1, "one engine is still open");
        let held = p.take(1 << 20);
        p.engine_closed();
        assert_eq!((p.kept(), p.kept_bytes()), (0, 0));
        drop(held);
        assert_eq!(p.kept(), 0, "no engine open: a buffer given back is freed");
    }
}
