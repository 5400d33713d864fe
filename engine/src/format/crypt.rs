//! Ephemeral encryption of format-v3 blocks: AES-256-GCM (`ring`) under a key made at
//! `Engine::open` and held only in memory.
//!
//! An encrypted block sets bit 0 of its header's flags byte (5), carries its nonce counter in
//! header bytes 32..40, and holds the 16-byte GCM tag in its check field (bytes 48..64) in
//! place of the CRC-32C. The stored bytes (compressed first, when a codec shrank them) are the
//! ciphertext. The additional authenticated data is the block's binding (segment u32 LE,
//! generation u32 LE, file offset u64 LE) followed by header bytes 0..48, so a block moved to
//! another place, segment or use of a recycled file, or a header with any field changed
//! (lengths, codec, counter), fails authentication.
//!
//! **Nonce uniqueness.** The 96-bit nonce is 4 zero bytes followed by a per-engine counter
//! (u64 LE) taken once per sealed block with an atomic `fetch_add`. A key exists for one engine
//! only (32 fresh random bytes at open), so a nonce repeats under a key only if the counter
//! does: it is never reset while the key lives and 2^64 blocks are never reached. The
//! counter is used instead of (segment, generation, offset): segment numbers are per task
//! directory, so two tasks of one engine can hold the same segment number and generation,
//! and that triple is not unique within one engine.
//!
//! **Key lifetime.** The raw key bytes exist only in a `zeroize::Zeroizing` buffer while the
//! `ring` key is built from them and are wiped at once; what is kept is `ring`'s
//! `LessSafeKey` (its expanded AES key schedule, which `ring` does not wipe on drop) and a
//! random key id. Nothing of the key is ever written; the key id goes in each segment header
//! (bytes 32..40) so that a segment of another engine is refused by name.

use std::sync::atomic::{AtomicU64, Ordering};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
use zeroize::Zeroizing;

use super::block::{BINDING_LEN, BLOCK_HEADER_LEN, Binding, binding_bytes};

/// Bytes of an AES-256 key.
pub const KEY_LEN: usize = 32;
/// Bytes of a GCM tag (the block header's check field).
pub const TAG_LEN: usize = 16;

/// An engine's block key: AES-256-GCM, the key id written in its segment headers, and the
/// nonce counter.
pub struct BlockKey {
    key: LessSafeKey,
    id: u64,
    counter: AtomicU64,
}

impl std::fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockKey")
            .field("id", &format_args!("{:016x}", self.id))
            .finish_non_exhaustive()
    }
}

impl BlockKey {
    /// A key from `raw` (wiped when this returns) with key id `id` (never 0: 0 means "not
    /// encrypted" in a segment header).
    pub fn new(raw: Zeroizing<[u8; KEY_LEN]>, id: u64) -> Result<Self, &'static str> {
        if id == 0 {
            return Err("key id 0 is reserved");
        }
        let unbound = UnboundKey::new(&AES_256_GCM, &raw[..]).map_err(|_| "AES-256-GCM key")?;
        drop(raw);
        Ok(BlockKey {
            key: LessSafeKey::new(unbound),
            id,
            counter: AtomicU64::new(0),
        })
    }

    /// The key id written in segment headers.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A fresh nonce counter (see the module docs).
    pub fn next_counter(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// Encrypts `data` in place; returns the tag. `fields` are header bytes 0..48 (flags and
    /// counter set).
    ///
    /// `ring` refuses only inputs past AES-GCM's limit (2^36 - 32 bytes); a block is at most a
    /// record (u32 length) plus its frame, far below it. Were it ever refused, `data` is
    /// zeroed and the tag left zero: the block then fails authentication when read (typed
    /// `Corrupt`), and no plaintext reaches the file.
    pub fn seal(
        &self,
        bind: Binding,
        offset: u64,
        fields: &[u8; 48],
        counter: u64,
        data: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let aad = aad_bytes(bind, offset, fields);
        let mut t = [0u8; TAG_LEN];
        match self
            .key
            .seal_in_place_separate_tag(nonce(counter), Aad::from(&aad[..]), data)
        {
            Ok(tag) => t.copy_from_slice(tag.as_ref()),
            Err(_) => data.fill(0),
        }
        t
    }

    /// Decrypts an encrypted block's stored bytes in place, checking them and `header` (the
    /// block's 64 header bytes) against the tag in it.
    pub fn open(
        &self,
        bind: Binding,
        offset: u64,
        header: &[u8],
        data: &mut [u8],
    ) -> Result<(), &'static str> {
        if header.len() < BLOCK_HEADER_LEN {
            return Err("truncated block header");
        }
        let mut fields = [0u8; 48];
        fields.copy_from_slice(&header[..48]);
        let counter = block_counter(header);
        let aad = aad_bytes(bind, offset, &fields);
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&header[48..64]);
        self.key
            .open_in_place_separate_tag(
                nonce(counter),
                Aad::from(&aad[..]),
                Tag::from(t),
                data,
                0..,
            )
            .map_err(
                |_| "encrypted block fails authentication (damaged, moved, or of another key)",
            )?;
        Ok(())
    }
}

/// The nonce counter of an encrypted block's header (bytes 32..40).
pub fn block_counter(h: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[32..40]);
    u64::from_le_bytes(b)
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..12].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aad_bytes(bind: Binding, offset: u64, fields: &[u8; 48]) -> [u8; BINDING_LEN + 48] {
    let mut a = [0u8; BINDING_LEN + 48];
    a[..BINDING_LEN].copy_from_slice(&binding_bytes(bind, offset));
    a[BINDING_LEN..].copy_from_slice(fields);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::block::{self, Codec};
    use crate::format::cursor::tests::walk_from;

    const B: Binding = Binding {
        segment: 3,
        generation: 7,
        engine: 0xE1,
    };

    fn key(byte: u8, id: u64) -> BlockKey {
        BlockKey::new(Zeroizing::new([byte; KEY_LEN]), id).unwrap()
    }

    /// A segment buffer with one encrypted block of `plain` at offset 64.
    fn sealed(k: &BlockKey, plain: &[u8]) -> Vec<u8> {
        let mut stored = plain.to_vec();
        let h = block::seal_in_place(
            Some(k),
            B,
            64,
            Codec::Raw,
            plain.len() as u64,
            1,
            0,
            false,
            &mut stored,
        );
        let mut v = vec![0u8; 64];
        v.extend_from_slice(&h);
        v.extend_from_slice(&stored);
        v
    }

    fn open_at(
        k: &BlockKey,
        buf: &[u8],
        bind: Binding,
        off: usize,
    ) -> Result<Vec<u8>, &'static str> {
        let h = block::parse_block_header(buf.get(off..).ok_or("no block")?)?;
        if !h.encrypted {
            // The engine's reader refuses a plaintext block when it holds a key.
            return Err("plaintext block");
        }
        let start = off + BLOCK_HEADER_LEN;
        let mut data = buf
            .get(start..start + h.stored as usize)
            .ok_or("segment truncated inside a block")?
            .to_vec();
        k.open(
            bind,
            off as u64,
            &buf[off..off + BLOCK_HEADER_LEN],
            &mut data,
        )?;
        Ok(data)
    }

    #[test]
    fn seal_open_round_trip_and_nonces_never_repeat() {
        let k = key(1, 9);
        let plain = b"\x05\0\0\0\0\0\0\0hello".to_vec();
        let a = sealed(&k, &plain);
        let b = sealed(&k, &plain);
        assert_eq!(open_at(&k, &a, B, 64).unwrap(), plain);
        assert!(!a[128..].windows(5).any(|w| w == b"hello"));
        // The same plaintext at the same place sealed twice: another nonce, another ciphertext.
        assert_ne!(block_counter(&a[64..]), block_counter(&b[64..]));
        assert_ne!(a[128..], b[128..]);
        // A reader without the key refuses an encrypted block by name.
        assert_eq!(
            walk_from(&a, 64, a.len(), B, None).unwrap_err().detail,
            "encrypted block: only the engine holding its key can check and read it"
        );
    }

    #[test]
    fn any_flipped_byte_another_place_or_another_key_fails() {
        let k = key(1, 9);
        let plain = vec![0x42u8; 300];
        let buf = sealed(&k, &plain);
        for i in 64..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x01;
            assert!(open_at(&k, &bad, B, 64).is_err(), "byte {i}");
        }
        for other in [
            Binding {
                segment: 4,
                generation: 7,
                engine: 0xE1,
            },
            Binding {
                segment: 3,
                generation: 8,
                engine: 0xE1,
            },
            Binding {
                segment: 3,
                generation: 7,
                engine: 0xE2,
            },
        ] {
            assert!(open_at(&k, &buf, other, 64).is_err());
        }
        let mut moved = vec![0u8; 64];
        moved.extend_from_slice(&buf);
        assert!(open_at(&k, &moved, B, 128).is_err());
        assert_eq!(
            open_at(&key(2, 9), &buf, B, 64).unwrap_err(),
            "encrypted block fails authentication (damaged, moved, or of another key)"
        );
        assert!(BlockKey::new(Zeroizing::new([0; KEY_LEN]), 0).is_err());
    }
}
