//! Codec baselines (issue 11): the crates the engine's block codecs are built on, run alone
//! over the same blocks, on the calling thread, with no I/O.
//!
//! - [`lz4_compress`]: `lz4_flex::block::compress_into_with_table` over each block into one reused output
//!   buffer (what the engine's `Lz4` codec does per block, without the engine around it);
//! - [`Sealer::seal`]: AES-256-GCM (ring) sealing each block in place with a fresh nonce,
//!   the tag kept apart (what `encryption(true)` does per block).
//!
//! Both return a [`CodecRun`]: bytes in and out, wall and calling-thread CPU time. A bench turns
//! those into GB/s and CPU seconds per GiB next to the engine's figures from the same run.

use std::time::{Duration, Instant};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

use crate::GIB_F;
use crate::measure::thread_cpu;

/// What one pass of a codec baseline over a set of blocks measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecRun {
    /// Bytes given to the codec.
    pub bytes_in: u64,
    /// Bytes it produced (compressed size; for the cipher, ciphertext plus tags).
    pub bytes_out: u64,
    /// Wall time of the pass.
    pub wall: Duration,
    /// CPU time of the calling thread over the pass.
    pub cpu: Duration,
}

impl CodecRun {
    /// Input bytes per wall second, in GB/s.
    pub fn gb_s(&self) -> f64 {
        self.bytes_in as f64 / self.wall.as_secs_f64() / 1e9
    }

    /// Input bytes per CPU second, in GB/s.
    pub fn gb_per_cpu_s(&self) -> f64 {
        self.bytes_in as f64 / self.cpu.as_secs_f64() / 1e9
    }

    /// CPU seconds per GiB of input.
    pub fn cpu_s_per_gib(&self) -> f64 {
        self.cpu.as_secs_f64() / (self.bytes_in as f64 / GIB_F)
    }

    /// Output bytes / input bytes.
    pub fn ratio(&self) -> f64 {
        self.bytes_out as f64 / self.bytes_in as f64
    }
}

/// Compresses every block with lz4_flex's block format into `out` (grown to the worst case
/// once, then reused) with one hash table kept across blocks (`compress_into_with_table`, as
/// the engine does), `passes` times over the set.
pub fn lz4_compress(blocks: &[Vec<u8>], out: &mut Vec<u8>, passes: usize) -> CodecRun {
    let worst = blocks
        .iter()
        .map(|b| lz4_flex::block::get_maximum_output_size(b.len()))
        .max()
        .unwrap_or(0);
    if out.len() < worst {
        out.resize(worst, 0);
    }
    let mut table = lz4_flex::block::CompressTable::large();
    let (t0, c0) = (Instant::now(), thread_cpu());
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for _ in 0..passes {
        for b in blocks {
            let n = lz4_flex::block::compress_into_with_table(b, out, &mut table)
                .expect("the output buffer has the worst-case size");
            std::hint::black_box(&out[..n]);
            bytes_in += b.len() as u64;
            bytes_out += n as u64;
        }
    }
    CodecRun {
        bytes_in,
        bytes_out,
        wall: t0.elapsed(),
        cpu: thread_cpu() - c0,
    }
}

/// AES-256-GCM with a random key, sealing blocks in place with a counter nonce.
pub struct Sealer {
    key: LessSafeKey,
    counter: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer with a key from the system's random source.
    pub fn new() -> Self {
        let mut key = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
            .expect("the system random source");
        let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte key"));
        Sealer { key, counter: 0 }
    }

    fn nonce(&mut self) -> Nonce {
        self.counter += 1;
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&self.counter.to_le_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Seals every block in place (each pass encrypts the previous pass's ciphertext, which
    /// costs the same), `passes` times over the set.
    pub fn seal(&mut self, blocks: &mut [Vec<u8>], passes: usize) -> CodecRun {
        let (t0, c0) = (Instant::now(), thread_cpu());
        let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
        for _ in 0..passes {
            for b in blocks.iter_mut() {
                let nonce = self.nonce();
                let tag = self
                    .key
                    .seal_in_place_separate_tag(nonce, Aad::empty(), b)
                    .expect("AES-GCM seals a block of under 64 GiB");
                std::hint::black_box(tag.as_ref());
                bytes_in += b.len() as u64;
                bytes_out += (b.len() + tag.as_ref().len()) as u64;
            }
        }
        CodecRun {
            bytes_in,
            bytes_out,
            wall: t0.elapsed(),
            cpu: thread_cpu() - c0,
        }
    }

    /// Opens `block` sealed with the `counter`th nonce (tests: the sealing is real).
    #[cfg(test)]
    fn open(&self, counter: u64, block: &mut [u8], tag: &[u8]) -> bool {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&counter.to_le_bytes());
        let mut v = block.to_vec();
        v.extend_from_slice(tag);
        match self
            .key
            .open_in_place(Nonce::assume_unique_for_key(n), Aad::empty(), &mut v)
        {
            Ok(plain) => {
                block.copy_from_slice(plain);
                true
            }
            Err(_) => false,
        }
    }
}

impl Default for Sealer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineitem::{lineitem_records, random_records};

    #[test]
    fn lz4_shrinks_lineitem_rows_and_not_random_bytes() {
        let rows = lineitem_records(5, 4 << 20).blocks(1 << 20);
        let mut out = Vec::new();
        let r = lz4_compress(&rows, &mut out, 2);
        assert_eq!(
            r.bytes_in,
            2 * rows.iter().map(|b| b.len() as u64).sum::<u64>()
        );
        assert!(r.ratio() < 0.6, "lineitem text shrinks: {}", r.ratio());
        assert!(r.gb_s() > 0.0 && r.cpu_s_per_gib() >= 0.0);
        let rnd = random_records(5, 2 << 20, 4096).blocks(1 << 20);
        let r = lz4_compress(&rnd, &mut out, 1);
        assert!(r.ratio() > 0.99, "random bytes do not: {}", r.ratio());
        // What was compressed decompresses to the block.
        let n = lz4_flex::block::compress_into(&rows[0], &mut out).expect("compress");
        let mut back = vec![0u8; rows[0].len()];
        let m = lz4_flex::decompress_into(&out[..n], &mut back).expect("decompress");
        assert_eq!(m, rows[0].len());
        assert_eq!(back, rows[0]);
    }

    #[test]
    fn sealing_encrypts_in_place_and_opens_again() {
        let plain = lineitem_records(6, 1 << 20).blocks(256 << 10);
        let mut blocks = plain.clone();
        let mut s = Sealer::new();
        let r = s.seal(&mut blocks[..1], 1);
        assert_eq!(r.bytes_out, r.bytes_in + 16, "one 16-byte tag per block");
        assert_ne!(blocks[0], plain[0], "sealed in place");
        // Seal a fresh copy with a known nonce and open it with the tag.
        let mut b = plain[1].clone();
        let nonce = s.nonce();
        let tag = s
            .key
            .seal_in_place_separate_tag(nonce, Aad::empty(), &mut b)
            .expect("seal");
        let counter = s.counter;
        let mut bad = b.clone();
        bad[7] ^= 1;
        assert!(
            !s.open(counter, &mut bad, tag.as_ref()),
            "a flipped byte fails the tag"
        );
        assert!(s.open(counter, &mut b, tag.as_ref()));
        assert_eq!(b, plain[1]);
    }
}
