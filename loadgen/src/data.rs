//! Records and their checksums: a seeded PRNG, a pool of random bytes that records are cut
//! from (zero-copy `Bytes` slices), and an independent 64-bit checksum (xxh3, not the engine's
//! CRC) of every record written, to compare what is read back.

use bytes::Bytes;
use xxhash_rust::xxh3::xxh3_64;

/// splitmix64: small, fast, and good enough to drive a load generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Log-uniform in `lo..=hi` (`1 <= lo <= hi`).
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let lo = lo.max(1);
        if hi <= lo {
            return lo;
        }
        let (a, b) = ((lo as f64).ln(), ((hi + 1) as f64).ln());
        let v = (a + self.unit() * (b - a)).exp() as u64;
        v.clamp(lo, hi)
    }
}

/// The splitmix64 finaliser.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The seed of op `idx` of a run seeded with `seed`.
pub fn op_seed(seed: u64, idx: u64) -> u64 {
    mix(seed ^ mix(idx.wrapping_add(0x5EED)))
}

/// What a record must read back as: its length and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub len: u32,
    pub hash: u64,
}

impl Expect {
    pub fn of(b: &[u8]) -> Self {
        Expect {
            len: b.len() as u32,
            hash: xxh3_64(b),
        }
    }

    /// Why `b` is not this record, or `None` if it is.
    pub fn mismatch(&self, b: &[u8]) -> Option<String> {
        if b.len() != self.len as usize {
            return Some(format!("length {} instead of {}", b.len(), self.len));
        }
        let h = xxh3_64(b);
        (h != self.hash).then(|| format!("checksum {h:016x} instead of {:016x}", self.hash))
    }
}

/// Random bytes that records are sliced from.
#[derive(Debug, Clone)]
pub struct Pool {
    bytes: Bytes,
}

impl Pool {
    pub fn new(seed: u64, len: usize) -> Self {
        let mut rng = Rng::new(seed ^ 0x00B0_0B1E);
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        v.truncate(len);
        Pool { bytes: v.into() }
    }

    /// A record of `len` bytes (at most the pool's length) at a random offset.
    pub fn record(&self, rng: &mut Rng, len: usize) -> Bytes {
        let len = len.min(self.bytes.len());
        let off = rng.below((self.bytes.len() - len + 1) as u64) as usize;
        self.bytes.slice(off..off + len)
    }
}

/// A record length: mostly small (1 B..4 KiB), some medium (..128 KiB), a few large (up to
/// `max`, past the engine's large-record threshold and sometimes past a segment).
pub fn record_len(rng: &mut Rng, max: u64) -> usize {
    let r = rng.unit();
    let (lo, hi) = if r < 0.70 {
        (1, 4 << 10)
    } else if r < 0.95 {
        (4 << 10, 128 << 10)
    } else {
        (128 << 10, max)
    };
    let hi = hi.min(max).max(1);
    // A few empty records too: a zero-length record is a valid record.
    if rng.chance(0.002) {
        return 0;
    }
    rng.log_uniform(lo.min(hi), hi) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        for _ in 0..1000 {
            assert!(r.below(10) < 10);
            let v = r.log_uniform(3, 900);
            assert!((3..=900).contains(&v));
        }
    }

    #[test]
    fn expect_detects_changes() {
        let pool = Pool::new(1, 1 << 16);
        let mut rng = Rng::new(2);
        let rec = pool.record(&mut rng, 1000);
        let e = Expect::of(&rec);
        assert_eq!(e.mismatch(&rec), None);
        let mut bad = rec.to_vec();
        bad[500] ^= 1;
        assert!(e.mismatch(&bad).is_some());
        assert!(e.mismatch(&rec[..999]).is_some());
    }

    #[test]
    fn lengths_respect_max() {
        let mut rng = Rng::new(3);
        for _ in 0..10_000 {
            assert!(record_len(&mut rng, 5000) <= 5000);
        }
    }
}
