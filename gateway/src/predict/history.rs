//! Predicted against actual time to first token: the recent pairs (for the status page's
//! chart) and the median relative error over them (a gauge).

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Pairs kept: five minutes at a few requests per second.
pub const POINTS_MAX: usize = 600;
/// Pairs older than this are dropped.
pub const MAX_AGE: Duration = Duration::from_secs(300);

/// One admitted request's prediction (on arrival) and what it got (arrival → first byte).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    pub at: Instant,
    pub predicted: Duration,
    pub actual: Duration,
}

impl Pair {
    /// (predicted − actual) / actual.
    pub fn relative_error(&self) -> f64 {
        let actual = self.actual.as_secs_f64().max(1e-3);
        (self.predicted.as_secs_f64() - actual) / actual
    }
}

/// The middle value of `xs` (the upper of the two middle ones for an even count; `None` for
/// none): what the error gauge, the replay of the fit and its tests report.
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}

/// The recent pairs.
#[derive(Clone, Debug, Default)]
pub struct History {
    pairs: VecDeque<Pair>,
}

/// A pair as the status page plots it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Point {
    /// Seconds before now.
    pub ago: f64,
    pub predicted: f64,
    pub actual: f64,
}

impl History {
    pub fn record(&mut self, pair: Pair) {
        if self.pairs.len() == POINTS_MAX {
            self.pairs.pop_front();
        }
        self.pairs.push_back(pair);
    }

    fn recent(&self, now: Instant) -> impl DoubleEndedIterator<Item = &Pair> {
        self.pairs
            .iter()
            .filter(move |p| now.saturating_duration_since(p.at) <= MAX_AGE)
    }

    /// The median relative error over the recent pairs (`None` without any).
    pub fn median_error(&self, now: Instant) -> Option<f64> {
        median(self.recent(now).map(Pair::relative_error).collect())
    }

    /// How much later than predicted the last `n` recent first tokens came, per square root
    /// of the time predicted: the `q` quantile of (actual − predicted) / √max(predicted, 1 s),
    /// in √s (`None` without any). Lateness is taken to grow as the square root of the horizon
    /// (independent errors in the work ahead add up so), so a 1 s prediction 0.5 s late and a
    /// 25 s one 2.5 s late read the same; the floor keeps a quiet upstream's 50 ms first
    /// tokens, twice their 25 ms prediction, from reading as a large error.
    pub fn shortfall(&self, now: Instant, n: usize, q: f64) -> Option<f64> {
        let mut late: Vec<f64> = self
            .recent(now)
            .rev()
            .take(n)
            .map(|p| {
                let predicted = p.predicted.as_secs_f64();
                (p.actual.as_secs_f64() - predicted) / predicted.max(1.0).sqrt()
            })
            .collect();
        if late.is_empty() {
            return None;
        }
        late.sort_by(f64::total_cmp);
        let i = ((late.len() as f64 * q).ceil() as usize).clamp(1, late.len()) - 1;
        Some(late[i])
    }

    /// The recent pairs, oldest first.
    pub fn points(&self, now: Instant) -> Vec<Point> {
        self.recent(now)
            .map(|p| Point {
                ago: now.saturating_duration_since(p.at).as_secs_f64(),
                predicted: p.predicted.as_secs_f64(),
                actual: p.actual.as_secs_f64(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn median_error_over_the_recent_pairs() {
        let mut h = History::default();
        let now = Instant::now();
        assert_eq!(h.median_error(now), None);
        for (p, a) in [(1.0, 1.0), (1.2, 1.0), (0.5, 1.0), (3.0, 2.0), (2.0, 2.0)] {
            h.record(Pair {
                at: now,
                predicted: Duration::from_secs_f64(p),
                actual: Duration::from_secs_f64(a),
            });
        }
        // Errors 0, +0.2, -0.5, +0.5, 0: median 0.
        assert_eq!(h.median_error(now), Some(0.0));
        assert_eq!(h.points(now).len(), 5);
        tokio::time::advance(MAX_AGE + Duration::from_secs(1)).await;
        assert_eq!(h.median_error(Instant::now()), None);
        assert!(h.points(Instant::now()).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn shortfall_reads_lateness_per_root_second_of_the_horizon() {
        let mut h = History::default();
        let now = Instant::now();
        assert_eq!(h.shortfall(now, 32, 0.8), None);
        // 1 s predictions 0.5 s late and 25 s ones 2.5 s late: 0.5 per root second alike; a
        // 25 ms prediction 25 ms late is 0.025 (the 1 s floor).
        for (p, a) in [
            (1.0, 1.5),
            (25.0, 27.5),
            (1.0, 1.5),
            (25.0, 27.5),
            (0.025, 0.05),
        ] {
            h.record(Pair {
                at: now,
                predicted: Duration::from_secs_f64(p),
                actual: Duration::from_secs_f64(a),
            });
        }
        let s = h.shortfall(now, 32, 0.8).expect("pairs");
        assert!((s - 0.5).abs() < 1e-9, "{s}");
        assert!((h.shortfall(now, 1, 0.8).expect("pairs") - 0.025).abs() < 1e-9);
    }
}
