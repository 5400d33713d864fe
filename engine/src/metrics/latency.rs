//! Latency histograms: fixed buckets of relaxed atomics on the engine's paths, and their
//! snapshots ([`LatencyHistogram`], [`LatencyMetrics`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Finite buckets of every latency histogram: upper bounds of 2^i microseconds, i = 0..=23
/// (1 µs to about 8.4 s), then `+Inf`.
pub const LATENCY_BUCKETS: usize = 24;

/// The upper bound of finite bucket `i` (`i < LATENCY_BUCKETS`) in seconds: 2^i µs.
pub fn latency_bucket_bound(i: usize) -> f64 {
    (1u64 << i.min(63)) as f64 * 1e-6
}

/// A latency histogram of fixed buckets: one relaxed atomic add per bucket and one for the
/// sum, no lock, no allocation.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Per bucket (not cumulative): `LATENCY_BUCKETS` finite ones, then the overflow.
    counts: [AtomicU64; LATENCY_BUCKETS + 1],
    sum_ns: AtomicU64,
}

/// The bucket a latency of `ns` nanoseconds falls in: the first `i` with `ns <= 2^i µs`, or
/// `LATENCY_BUCKETS` (the overflow) past the last.
#[inline]
fn bucket_of(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    if us <= 1 {
        return 0;
    }
    // ceil(log2(us)) for us >= 2.
    let i = (64 - (us - 1).leading_zeros()) as usize;
    i.min(LATENCY_BUCKETS)
}

impl Histogram {
    /// Counts one latency.
    #[inline]
    pub(crate) fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts the time since `start`.
    #[inline]
    pub(crate) fn record_since(&self, start: Instant) {
        self.record(start.elapsed());
    }

    /// The histogram now: cumulative counts (each bucket read once, so `count` is their sum).
    pub(crate) fn snapshot(&self) -> LatencyHistogram {
        let mut cumulative = [0u64; LATENCY_BUCKETS + 1];
        let mut acc = 0u64;
        for (c, out) in self.counts.iter().zip(cumulative.iter_mut()) {
            acc += c.load(Ordering::Relaxed);
            *out = acc;
        }
        LatencyHistogram {
            cumulative,
            count: acc,
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

/// A snapshot of one latency histogram, with Prometheus's cumulative buckets.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LatencyHistogram {
    /// `cumulative[i]`: observations of at most [`latency_bucket_bound`]`(i)` seconds for
    /// `i < LATENCY_BUCKETS`; the last entry counts every observation (`le="+Inf"`).
    pub cumulative: [u64; LATENCY_BUCKETS + 1],
    /// Observations.
    pub count: u64,
    /// Sum of the observed latencies, in seconds.
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    /// An upper bound of the `q` quantile (`0.0..=1.0`): the bound of the first bucket that
    /// holds it, `f64::INFINITY` in the overflow, `None` with no observation.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let i = self.cumulative.iter().position(|&c| c >= rank)?;
        Some(if i < LATENCY_BUCKETS {
            latency_bucket_bound(i)
        } else {
            f64::INFINITY
        })
    }
}

/// Makes, from one table of the spill's stages (docs, field, Prometheus name and help), the
/// engine's histograms ([`Latencies`]), their snapshot ([`LatencyMetrics`]) and its rows
/// ([`LatencyMetrics::named`]).
macro_rules! latencies {
    ($($(#[$doc:meta])* $f:ident: $name:literal $help:literal;)*) => {
        /// The engine's latency histograms, one per stage.
        #[derive(Debug, Default)]
        pub(crate) struct Latencies {
            $(pub $f: Histogram,)*
        }

        impl Latencies {
            pub(crate) fn snapshot(&self) -> LatencyMetrics {
                LatencyMetrics {
                    $($f: self.$f.snapshot(),)*
                }
            }
        }

        /// Latency histograms of a spill's stages.
        #[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
        #[non_exhaustive]
        pub struct LatencyMetrics {
            $($(#[$doc])* pub $f: LatencyHistogram,)*
        }

        impl LatencyMetrics {
            /// The histograms with their Prometheus names and help texts.
            pub fn named(&self) -> [(&'static str, &'static str, &LatencyHistogram); [$($name),*].len()] {
                [$(($name, $help, &self.$f)),*]
            }
        }
    };
}

latencies! {
    /// The caller's time in each `SpillWriter::write`, `write_slice` and `write_async`, and
    /// for a [`RecordSlot`](crate::RecordSlot) in its `record` call plus its `commit` (not the
    /// time the caller spends filling it): a copy into the staging buffer, a submission of a
    /// full buffer, a wait for in-flight budget, a rotation. A slot dropped uncommitted counts
    /// nothing.
    write: "write_latency_seconds" "Caller's time in SpillWriter::write.";
    /// Each segment rotation: ticket, create or pooled reuse, allocation and the abort check
    /// (on the caller's thread, or the offload pool for an async writer).
    rotate: "rotate_latency_seconds" "Segment rotations (open_segment).";
    /// Each `SpillWriter::finish` / `finish_async` that got as far as its seal: draining the
    /// writes in flight, sealing, trimming, the hand-off.
    finish: "finish_latency_seconds" "SpillWriter::finish.";
    /// Each segment a reader opened: `open`, one `pread` or a map, the header check (the
    /// `next_record` calls that do no I/O are not counted: they cost a CRC check of memory).
    read: "read_open_latency_seconds" "Reader segment opens (open, pread or map, header check).";
    /// Each unlink of a segment, from its batch's submission to an I/O thread (or to the
    /// cleanup worker's retry) to its completion, failed or not.
    delete: "delete_latency_seconds" "Segment unlinks, submission to completion.";
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_latency_lands_in_the_first_bucket_that_holds_it() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1_000), 0); // 1 µs: le 1 µs
        assert_eq!(bucket_of(1_001), 1); // just over: le 2 µs
        assert_eq!(bucket_of(2_000), 1);
        assert_eq!(bucket_of(2_001), 2);
        assert_eq!(bucket_of(1_000_000), 10); // 1 ms: le 1.024 ms
        assert_eq!(bucket_of(8_388_608_000), 23); // the last finite bound, 8.39 s
        assert_eq!(bucket_of(8_388_608_001), LATENCY_BUCKETS); // overflow
        assert_eq!(bucket_of(u64::MAX), LATENCY_BUCKETS);
        for i in 0..LATENCY_BUCKETS {
            let bound_ns = (latency_bucket_bound(i) * 1e9).round() as u64;
            assert_eq!(
                bucket_of(bound_ns),
                i,
                "bound {i} belongs to its own bucket"
            );
            assert_eq!(
                bucket_of(bound_ns + 1),
                i + 1,
                "past bound {i} is the next one"
            );
        }
    }

    #[test]
    fn a_histogram_counts_sums_and_cumulates() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().count, 0);
        assert_eq!(h.snapshot().quantile_bound(0.5), None);
        h.record(Duration::from_nanos(500)); // bucket 0
        h.record(Duration::from_micros(3)); // bucket 2 (le 4 µs)
        h.record(Duration::from_micros(3));
        h.record(Duration::from_secs(20)); // overflow
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[1], 1);
        assert_eq!(s.cumulative[2], 3);
        assert_eq!(s.cumulative[LATENCY_BUCKETS - 1], 3);
        assert_eq!(s.cumulative[LATENCY_BUCKETS], 4);
        assert!((s.sum_seconds - (20.0 + 6e-6 + 5e-7)).abs() < 1e-9);
        assert_eq!(s.quantile_bound(0.25), Some(1e-6));
        assert_eq!(s.quantile_bound(0.5), Some(4e-6));
        assert_eq!(s.quantile_bound(1.0), Some(f64::INFINITY));
    }

    #[test]
    fn concurrent_records_lose_nothing() {
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        h.record(Duration::from_nanos(i * 997 + t));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = h.snapshot();
        assert_eq!(s.count, 40_000);
        assert_eq!(s.cumulative[LATENCY_BUCKETS], 40_000);
        assert!(s.cumulative.windows(2).all(|w| w[0] <= w[1]));
    }
}
