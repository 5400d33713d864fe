//! What a staging buffer leaves to the thread that writes it (write-behind of the producer's
//! work on a large record): copies of the record's parts into the buffer, and the checksum of
//! the record's block with the header it completes. The writer counts these bytes as placed;
//! nothing reads them before the buffer's writer applies them ([`Fills::apply`]), and a buffer
//! dropped unwritten lets go of the records it referenced.

use bytes::Bytes;

use crate::format::block::{BLOCK_HEADER_LEN, BlockSeal};

/// Deferred copies one buffer holds at most (the rest are copied at once): a buffer of large
/// records holds the tail of one and the head of the next.
pub(super) const FILLS: usize = 2;

/// A buffer's deferred work.
#[derive(Default)]
pub(crate) struct Fills {
    copies: [Option<DeferredCopy>; FILLS],
    /// At most one block header to finish: a buffer holds the header of one large record
    /// (one that does not fit a buffer) in the common case; a second is sealed at once.
    seal: Option<SealLater>,
}

/// A deferred copy of `src[src_at..src_at + len]` to the buffer's offset `at`.
struct DeferredCopy {
    src: Bytes,
    src_at: usize,
    /// Offset and length in the buffer (a buffer is smaller than 4 GiB: `io_buffer_size`).
    at: u32,
    len: u32,
}

/// A block header to finish: `seal` (its fields and the frame already in it) takes the
/// checksum of all of `src`, and the header goes to the buffer's offset `at`.
struct SealLater {
    src: Bytes,
    at: u32,
    seal: BlockSeal,
}

impl Fills {
    /// Takes a copy of `src[src_at..src_at + len]` to offset `at` for later; `false` when
    /// the slots are full or the offset is past `u32` (copy it now).
    pub(super) fn copy_later(&mut self, src: &Bytes, src_at: usize, at: usize, len: usize) -> bool {
        match self.copies.iter_mut().find(|f| f.is_none()) {
            Some(slot) if at + len <= u32::MAX as usize => {
                *slot = Some(DeferredCopy {
                    src: src.clone(),
                    src_at,
                    at: at as u32,
                    len: len as u32,
                });
                true
            }
            _ => false,
        }
    }

    /// Takes the finishing of a block header at `at` for later; `Err(seal)` when one is
    /// taken already or the offset is past `u32`.
    pub(super) fn seal_later(
        &mut self,
        src: &Bytes,
        at: usize,
        seal: BlockSeal,
    ) -> Result<(), BlockSeal> {
        if self.seal.is_some() || at > u32::MAX as usize {
            return Err(seal);
        }
        self.seal = Some(SealLater {
            src: src.clone(),
            at: at as u32,
            seal,
        });
        Ok(())
    }

    /// Nothing is deferred: [`Fills::apply`] would do nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.copies.iter().all(Option::is_none) && self.seal.is_none()
    }

    /// Makes the copies and writes the finished header into `space` (the whole buffer).
    pub(super) fn apply(&mut self, space: &mut [u8]) {
        for slot in &mut self.copies {
            if let Some(f) = slot.take() {
                let (at, len) = (f.at as usize, f.len as usize);
                space[at..at + len].copy_from_slice(&f.src[f.src_at..f.src_at + len]);
            }
        }
        if let Some(SealLater { src, at, seal }) = self.seal.take() {
            let at = at as usize;
            space[at..at + BLOCK_HEADER_LEN].copy_from_slice(&seal.finish_over(&src));
        }
    }

    /// Deferred copies held.
    #[cfg(test)]
    pub(super) fn copies(&self) -> usize {
        self.copies.iter().filter(|f| f.is_some()).count()
    }

    /// A block header waits to be finished.
    #[cfg(test)]
    pub(super) fn has_seal(&self) -> bool {
        self.seal.is_some()
    }
}
