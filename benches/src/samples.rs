//! Criterion for this machine kind, and the samples it takes, kept so a bench can write its
//! figures as JSON.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::mode::quick;

/// Median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The samples criterion measured, kept so the bench can write its figures as JSON. Criterion
/// calls a routine for its warm-up first and then once per sample, so the last `sample_size`
/// calls of an id are exactly its measurement.
#[derive(Debug, Default)]
pub struct Samples {
    by_id: Mutex<BTreeMap<String, Vec<(u64, Duration)>>>,
}

impl Samples {
    /// Records one routine call: `iters` iterations took `d`.
    pub fn record(&self, id: &str, iters: u64, d: Duration) {
        let mut m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id.to_owned()).or_default().push((iters, d));
    }

    /// Median nanoseconds per iteration over the last `last` calls of `id`.
    pub fn median_ns(&self, id: &str, last: usize) -> Option<f64> {
        let m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let v = m.get(id)?;
        let from = v.len().saturating_sub(last);
        let mut per: Vec<f64> = v[from..]
            .iter()
            .filter(|(i, _)| *i > 0)
            .map(|(i, d)| d.as_nanos() as f64 / *i as f64)
            .collect();
        (!per.is_empty()).then(|| median(&mut per))
    }

    /// Ids recorded so far.
    pub fn ids(&self) -> Vec<String> {
        let m = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        m.keys().cloned().collect()
    }
}

/// A criterion configured for this machine kind (2 noisy cores): short warm-ups and
/// measurements, fewer in quick mode, CLI arguments (filters, `--bench`, `--noplot`) honoured.
///
/// Criterion's HTML report (`<target>/criterion/report/index.html`, plots drawn by its plotters
/// backend unless gnuplot is installed) is on: criterion draws it after a benchmark's samples
/// are taken and analysed, so it costs wall time between benchmarks, not measured time.
pub fn criterion(sample_size: usize, measure: Duration) -> criterion::Criterion {
    let (warm, measure) = if quick() {
        (
            Duration::from_millis(200),
            measure.mul_f64(0.2).max(Duration::from_millis(100)),
        )
    } else {
        (Duration::from_secs(1), measure)
    };
    criterion::Criterion::default()
        .sample_size(sample_size)
        .warm_up_time(warm)
        .measurement_time(measure)
        .configure_from_args()
}

/// Median, min and max of `v`, with the number of values, as the reports' JSON spells them.
pub fn spread(v: &[f64]) -> serde_json::Value {
    serde_json::json!({
        "n": v.len(),
        "median": median(&mut v.to_vec()),
        "min": v.iter().copied().fold(f64::INFINITY, f64::min),
        "max": v.iter().copied().fold(0.0, f64::max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }

    #[test]
    fn samples_keep_the_last_calls_only() {
        let s = Samples::default();
        // Warm-up calls first, then the measurement: only the last two count here.
        s.record("x", 1, Duration::from_nanos(1_000));
        s.record("x", 10, Duration::from_nanos(100));
        s.record("x", 10, Duration::from_nanos(300));
        assert_eq!(s.median_ns("x", 2), Some(20.0));
        assert_eq!(s.median_ns("y", 2), None);
        assert_eq!(s.ids(), vec!["x".to_owned()]);
    }
}
