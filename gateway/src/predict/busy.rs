//! How long some prefill was running: the time a decode observation must leave out.
//!
//! The bundled engine (like vLLM's v1 scheduler) puts the running decodes and a prefill chunk
//! in the same step, so while a prompt prefills, every decode step takes as long as the
//! chunk. The simulation ([`super::simulate`]) counts that time once, as the prefill's; a
//! stream that decoded beside a prefill would count it again in its mean step and make every
//! full upstream look slower than it is. So the decode fit sees only the time, and the tokens,
//! outside any prefill; the time and the tokens beside one give the gap there
//! ([`super::CostModel::decode_beside_prefill`]), at which the simulation lets decodes go on
//! through a prefill.

use std::time::Duration;

use tokio::time::Instant;

/// A stopwatch that runs while any prefill is in flight.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefillClock {
    since: Option<Instant>,
    total: Duration,
}

impl PrefillClock {
    /// Whether a prefill is in flight from `now` on.
    pub fn set(&mut self, busy: bool, now: Instant) {
        match (busy, self.since) {
            (true, None) => self.since = Some(now),
            (false, Some(since)) => {
                self.total += now.saturating_duration_since(since);
                self.since = None;
            }
            _ => {}
        }
    }

    /// Whether a prefill is in flight.
    pub fn busy(&self) -> bool {
        self.since.is_some()
    }

    /// Prefill time so far; the difference of two readings is the prefill time between them.
    pub fn reading(&self, now: Instant) -> Duration {
        self.total
            + self
                .since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_only_the_time_some_prefill_runs() {
        let mut c = PrefillClock::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        c.set(false, at(0));
        c.set(true, at(1));
        c.set(true, at(2));
        assert!(c.busy());
        assert_eq!(c.reading(at(3)), Duration::from_secs(2));
        c.set(false, at(4));
        c.set(false, at(5));
        assert!(!c.busy());
        assert_eq!(c.reading(at(9)), Duration::from_secs(3));
        c.set(true, at(10));
        assert_eq!(c.reading(at(12)) - c.reading(at(9)), Duration::from_secs(2));
    }
}
