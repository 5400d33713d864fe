//! Page-aligned payloads that the engine and the baselines (including `O_DIRECT` ones) can use
//! without copying.

use std::alloc::Layout;

use bytes::Bytes;

/// A 4096-byte aligned heap buffer (for `O_DIRECT` baselines and payloads).
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read the bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    const ALIGN: usize = 4096;

    /// `len` bytes (a non-zero multiple of 4096 or any size > 0), filled by `fill(i)`.
    pub fn new(len: usize, mut fill: impl FnMut(usize) -> u8) -> Self {
        assert!(len > 0, "empty AlignedBuf");
        let layout = Layout::from_size_align(len, Self::ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: the allocation is `len` bytes long and nothing else refers to it yet.
        let s = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
        for (i, b) in s.iter_mut().enumerate() {
            *b = fill(i);
        }
        AlignedBuf { ptr, len }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, Self::ALIGN).expect("valid layout");
        // SAFETY: allocated in `new` with this very layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// `count` distinct page-aligned payloads of `len` bytes (distinct so CRCs and page contents
/// differ), as `Bytes` that both the engine and the baselines can use without copying.
pub fn payloads(len: usize, count: usize) -> Vec<Bytes> {
    (0..count)
        .map(|k| {
            let buf = AlignedBuf::new(len, |i| {
                (i as u8).wrapping_mul(31) ^ (k as u8).wrapping_mul(97)
            });
            Bytes::from_owner(buf)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_payloads_are_aligned_and_distinct() {
        let p = payloads(8192, 3);
        assert!(
            p.iter()
                .all(|b| b.len() == 8192 && (b.as_ptr() as usize).is_multiple_of(4096))
        );
        assert_ne!(p[0], p[1]);
    }
}
