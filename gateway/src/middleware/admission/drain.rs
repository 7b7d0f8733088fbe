//! How fast slots free up: the basis of `Retry-After` when the queue is full.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Completions kept; the rate is taken over them.
const WINDOW: usize = 64;
/// Completions older than this say nothing about now.
const MAX_AGE: Duration = Duration::from_secs(120);

/// The recent completion times.
#[derive(Debug, Default)]
pub(super) struct DrainRate {
    done: VecDeque<Instant>,
}

impl DrainRate {
    pub fn record(&mut self, at: Instant) {
        if self.done.len() == WINDOW {
            self.done.pop_front();
        }
        self.done.push_back(at);
    }

    /// Completions per second over the recent window, if there is one.
    fn rate(&self, now: Instant) -> Option<f64> {
        let first = *self
            .done
            .iter()
            .find(|t| now.duration_since(**t) <= MAX_AGE)?;
        let n = self.done.iter().filter(|t| **t >= first).count();
        let span = now.duration_since(first).as_secs_f64();
        (n >= 2 && span > 0.0).then(|| n as f64 / span)
    }

    /// How long until `n` more slots free up at the recent rate.
    pub fn time_for(&self, n: usize, now: Instant) -> Option<Duration> {
        let rate = self.rate(now)?;
        Some(Duration::from_secs_f64(n as f64 / rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_follows_recent_completions() {
        let mut d = DrainRate::default();
        let start = Instant::now();
        assert_eq!(d.time_for(1, start), None);
        for i in 0..10 {
            d.record(start + Duration::from_millis(500 * i));
        }
        // 10 completions over 5 s (measured to now): 2 per second.
        let now = start + Duration::from_secs(5);
        let t = d.time_for(4, now).expect("a rate");
        assert!((t.as_secs_f64() - 2.0).abs() < 1e-9, "{t:?}");
        // Long after, the old completions no longer count.
        assert_eq!(d.time_for(1, now + MAX_AGE * 2), None);
    }
}
