//! The process-wide pool of buffers that readers decode compressed blocks into.

use parking_lot::Mutex;

/// Buffers that compressed blocks are decoded into, reused: a reader takes one per compressed
/// block and hands out `Bytes` into it; the last `Bytes` dropped gives it back. Process-wide
/// (readers without an engine use it too), keeping at most [`DECODE_RETAIN`] buffers.
pub(crate) static DECODE_POOL: DecodePool = DecodePool {
    free: parking_lot::const_mutex(Vec::new()),
};

/// Buffers the decode pool keeps for reuse.
pub(crate) const DECODE_RETAIN: usize = 16;

/// See [`DECODE_POOL`].
#[derive(Debug)]
pub(crate) struct DecodePool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl DecodePool {
    /// A zero-filled buffer of `len` bytes (a reused one when there is one large enough).
    pub(crate) fn take(&'static self, len: usize) -> Decoded {
        let mut v = {
            let mut f = self.free.lock();
            match f.iter().position(|b| b.capacity() >= len) {
                Some(i) => f.swap_remove(i),
                None => f.pop().unwrap_or_default(),
            }
        };
        v.clear();
        v.resize(len, 0);
        Decoded { v, pool: self }
    }

    /// Buffers kept now.
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().len()
    }
}

/// A decode buffer; back to its pool on drop. Wrap it in `Bytes::from_owner`.
#[derive(Debug)]
pub(crate) struct Decoded {
    v: Vec<u8>,
    pool: &'static DecodePool,
}

impl Decoded {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
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
        let v = std::mem::take(&mut self.v);
        let mut f = self.pool.free.lock();
        if f.len() < DECODE_RETAIN {
            f.push(v);
        }
    }
}
