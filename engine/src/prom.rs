//! Prometheus text exposition (format 0.0.4): a lock-free duration histogram and the line
//! writers, shared by the engine's and the gateway's `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A lock-free histogram of durations.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative); the last one is `+Inf`.
    counts: Vec<AtomicU64>,
    /// The sum of the observations, as `f64` bits (seconds, or the plain values): a count of
    /// nanoseconds or of 10⁻⁹ tokens in a `u64` wrapped after 1.8 × 10¹⁰ tokens.
    sum_bits: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_bits: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, d: Duration) {
        self.observe_value(d.as_secs_f64());
    }

    /// Observes a plain value (a token count) instead of a duration.
    pub fn observe_value(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let _ = self
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
    }

    /// The sum of the observations.
    fn sum(&self) -> f64 {
        f64::from_bits(self.sum_bits.load(Ordering::Relaxed))
    }

    /// The counts so far, read bucket by bucket (not one atomic read: an observation racing
    /// with it may show in one field and not yet in another).
    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        HistogramSnapshot {
            bounds: self.bounds,
            count: counts.iter().sum(),
            counts,
            sum: self.sum(),
        }
    }

    /// Writes the histogram; `labels` (`a="b",c="d"`, or empty) go on every line.
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        header(out, name, help, "histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let mut cumulative = 0u64;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| format!("{b:?}"));
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum());
        let _ = writeln!(out, "{name}_count{braces} {cumulative}");
    }
}

/// A histogram's counts at one moment; two of them subtract into the observations between.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramSnapshot {
    /// The buckets' upper bounds (seconds); `counts` has one more entry, for `+Inf`.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative).
    pub counts: Vec<u64>,
    /// The sum of the observations, in seconds.
    pub sum: f64,
    /// The number of observations (the sum of `counts`).
    pub count: u64,
}

impl HistogramSnapshot {
    /// The observations made after `earlier` and up to `self` (both of the same histogram).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .enumerate()
            .map(|(i, c)| c.saturating_sub(earlier.counts.get(i).copied().unwrap_or(0)))
            .collect();
        HistogramSnapshot {
            bounds: self.bounds,
            count: counts.iter().sum(),
            counts,
            sum: (self.sum - earlier.sum).max(0.0),
        }
    }
}

pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

pub fn sample(out: &mut String, name: &str, labels: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{name}{{{labels}}} {value}");
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_counts_per_bucket_and_subtracts() {
        static BOUNDS: &[f64] = &[0.1, 1.0];
        let h = Histogram::new(BOUNDS);
        h.observe(Duration::from_millis(50));
        let first = h.snapshot();
        assert_eq!(first.counts, vec![1, 0, 0]);
        assert_eq!(first.count, 1);
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_millis(500));
        h.observe(Duration::from_secs(5));
        let second = h.snapshot();
        assert_eq!(second.counts, vec![1, 2, 1]);
        assert_eq!(second.count, 4);
        assert!((second.sum - 6.05).abs() < 1e-9, "{}", second.sum);
        let delta = second.since(&first);
        assert_eq!(delta.counts, vec![0, 2, 1]);
        assert_eq!(delta.count, 3);
        assert!((delta.sum - 6.0).abs() < 1e-9, "{}", delta.sum);
        assert_eq!(delta.bounds, BOUNDS);
    }

    #[test]
    fn a_sum_of_token_counts_does_not_wrap() {
        // 2 × 10¹⁰ tokens: as 10⁻⁹ units in a u64 the sum wrapped past 1.8 × 10¹⁰.
        static BOUNDS: &[f64] = &[8192.0];
        let h = Histogram::new(BOUNDS);
        h.observe_value(1e10);
        h.observe_value(1e10);
        assert_eq!(h.snapshot().sum, 2e10);
        let mut out = String::new();
        h.render(&mut out, "t", "tokens", "");
        assert!(out.contains("t_sum 20000000000\n"), "{out}");
    }
}
