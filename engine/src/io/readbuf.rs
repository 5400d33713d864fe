//! Read buffers for small segments, kept for reuse: a reader reads a segment of up to
//! `read_buffer_max` bytes with one `pread` into a buffer from here, and the records it hands
//! out point into that buffer; when the last of them goes, the buffer comes back. The list
//! keeps at most [`ReadBufs::RETAIN`] buffers, each of at most `read_buffer_max` bytes, so it
//! holds at most `RETAIN * read_buffer_max` bytes (2 MiB at the default 256 KiB).

use std::sync::Arc;

use parking_lot::Mutex;

/// The free list of read buffers (see the module docs).
#[derive(Debug)]
pub(crate) struct ReadBufs {
    free: Mutex<Vec<Vec<u8>>>,
    max_len: usize,
}

/// A buffer from [`ReadBufs`], filled to `len`; goes back to the list on drop. The owner of
/// the `Bytes` a reader hands out (`Bytes::from_owner`).
#[derive(Debug)]
pub(crate) struct ReadBuf {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<ReadBufs>,
}

impl ReadBufs {
    /// Buffers kept at most.
    pub(crate) const RETAIN: usize = 8;

    /// A list for buffers of up to `max_len` bytes.
    pub(crate) fn new(max_len: usize) -> Arc<Self> {
        Arc::new(ReadBufs {
            free: Mutex::new(Vec::with_capacity(Self::RETAIN)),
            max_len,
        })
    }

    /// A buffer of at least `len` bytes (their contents are a past read's, or zeros), for the
    /// caller to fill: a kept one if there is one.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> ReadBuf {
        let mut buf = self.free.lock().pop().unwrap_or_default();
        if buf.len() < len {
            buf.resize(len, 0);
        }
        ReadBuf {
            buf,
            len,
            pool: self.clone(),
        }
    }

    /// Buffers kept now.
    #[cfg(all(test, not(loom)))]
    fn kept(&self) -> usize {
        self.free.lock().len()
    }
}

impl ReadBuf {
    /// The bytes to fill (the requested length).
    pub(crate) fn space(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// Keeps only the first `n` bytes (a short read).
    pub(crate) fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
    }
}

impl AsRef<[u8]> for ReadBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        if self.buf.len() > self.pool.max_len {
            return;
        }
        let mut free = self.pool.free.lock();
        if free.len() < ReadBufs::RETAIN {
            free.push(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_up_to_the_bound_and_only_small_ones() {
        let pool = ReadBufs::new(1024);
        let mut held: Vec<ReadBuf> = (0..ReadBufs::RETAIN + 3).map(|_| pool.take(512)).collect();
        held[0].space().fill(7);
        held[0].truncate(100);
        assert_eq!(held[0].as_ref(), &[7u8; 100][..]);
        drop(held);
        assert_eq!(pool.kept(), ReadBufs::RETAIN, "the list keeps its bound");
        let big = pool.take(4096);
        assert_eq!(big.as_ref().len(), 4096);
        assert_eq!(pool.kept(), ReadBufs::RETAIN - 1);
        drop(big);
        assert_eq!(
            pool.kept(),
            ReadBufs::RETAIN - 1,
            "a buffer past max_len is freed"
        );
        let b = pool.take(256);
        assert_eq!(b.as_ref().len(), 256, "a kept buffer serves a shorter read");
    }
}
