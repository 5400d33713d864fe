//! The Prometheus text of a [`Metrics`] snapshot.

use super::Metrics;
use super::latency::{LATENCY_BUCKETS, latency_bucket_bound};
use std::fmt::Write as _;

impl Metrics {
    /// Renders the snapshot in the Prometheus text exposition format, names prefixed
    /// `spillring_`.
    pub fn to_prometheus(&self) -> String {
        let mut out = String::with_capacity(16384);
        let _ = writeln!(
            out,
            "# HELP spillring_info Which backend and write mode run.\n# TYPE spillring_info gauge\nspillring_info{{backend=\"{}\",write_mode=\"{}\"}} 1",
            self.backend, self.write_mode
        );
        self.write_rows(&mut out);
        let free = self.ticket_capacity - self.tickets_used.min(self.ticket_capacity);
        row(
            &mut out,
            "tickets_free",
            "gauge",
            "Tickets that can still be reserved.",
            free as f64,
        );
        write_operator_rows(self, &mut out);
        out
    }
}

/// Appends one row (its HELP, TYPE and sample) of the metric `spillring_{name}`.
pub(super) fn row(out: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    let _ = writeln!(
        out,
        "# HELP spillring_{name} {help}\n# TYPE spillring_{name} {kind}\nspillring_{name} {v}"
    );
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Appends the histograms and the per-root rows to a Prometheus text.
fn write_operator_rows(m: &Metrics, out: &mut String) {
    for (name, help, h) in m.latency.named() {
        let _ = writeln!(
            out,
            "# HELP spillring_{name} {help}\n# TYPE spillring_{name} histogram"
        );
        for (i, c) in h.cumulative.iter().enumerate() {
            if i < LATENCY_BUCKETS {
                let le = latency_bucket_bound(i);
                let _ = writeln!(out, "spillring_{name}_bucket{{le=\"{le}\"}} {c}");
            } else {
                let _ = writeln!(out, "spillring_{name}_bucket{{le=\"+Inf\"}} {c}");
            }
        }
        let _ = writeln!(
            out,
            "spillring_{name}_sum {}\nspillring_{name}_count {}",
            h.sum_seconds, h.count
        );
    }
    let _ = writeln!(
        out,
        "# HELP spillring_errors_total Errors writers and readers returned, by kind.\n# TYPE spillring_errors_total counter"
    );
    for (kind, n) in &m.errors {
        let _ = writeln!(out, "spillring_errors_total{{kind=\"{kind}\"}} {n}");
    }
    let per_root = [
        (
            "root_bytes",
            "Disk bytes of the files the engine owns under a root.",
            true,
        ),
        ("root_files", "Files the engine owns under a root.", false),
    ];
    for (name, help, bytes) in per_root {
        let _ = writeln!(
            out,
            "# HELP spillring_{name} {help}\n# TYPE spillring_{name} gauge"
        );
        for r in &m.roots {
            let root = label_value(&r.path.to_string_lossy());
            let v = if bytes { r.bytes } else { r.files };
            let _ = writeln!(out, "spillring_{name}{{root=\"{root}\"}} {v}");
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value("/a\"b\\c\nd"), "/a\\\"b\\\\c\\nd");
    }
}
