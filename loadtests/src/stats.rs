//! Percentiles and the per-scenario aggregate of a run.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::workload::Run;

/// Nearest-rank percentile of `sorted` (ascending): the smallest sample such that at least
/// `p`% of the samples are at or below it, i.e. `sorted[ceil(p/100 * n) - 1]` (`p = 0` gives
/// the minimum). `None` for no samples. Never interpolates: with 10 samples p95 is the worst,
/// which is what a user at the tail saw.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50/p95/mean over a set of samples (seconds, say).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    pub count: usize,
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub mean: Option<f64>,
}

impl Summary {
    pub fn of(samples: &[f64]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mean = (!sorted.is_empty()).then(|| sorted.iter().sum::<f64>() / sorted.len() as f64);
        Self {
            count: sorted.len(),
            p50: percentile(&sorted, 50.0),
            p95: percentile(&sorted, 95.0),
            mean,
        }
    }
}

/// Scored answers: how many passed of how many checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Score {
    pub passed: usize,
    pub checked: usize,
}

/// `n / wall`, 0 for no time.
pub fn per_second(n: f64, wall: Duration) -> f64 {
    let s = wall.as_secs_f64();
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

/// Everything reported for one scenario on one target. Latencies in seconds, over the
/// successful requests (a 503 in 1 ms is not a fast answer).
#[derive(Debug, Clone, Default)]
pub struct ScenarioStats {
    /// Requests sent (and finished, one way or another).
    pub total: usize,
    pub succeeded: usize,
    /// Outcome label (`ok`, `http_503:overloaded`, `timeout`, ...) → count.
    pub outcomes: BTreeMap<String, usize>,
    /// Requests sent more than once (refused, then retried: `--retries`).
    pub retried: usize,
    /// One example message per failing outcome label.
    pub failure_examples: BTreeMap<String, String>,
    /// First arrival to last byte.
    pub wall: Duration,
    /// Completion tokens of the successful requests.
    pub completion_tokens: u64,
    /// Successful requests whose token count came from a `usage` chunk (the rest counted
    /// content chunks).
    pub usage_reported: usize,
    /// Mean `usage.prompt_tokens` the server reported, over the requests that reported it.
    pub prompt_tokens_mean: Option<f64>,
    /// Send → first token.
    pub ttft: Summary,
    /// Arrival → first token (the client-side wait included).
    pub arrival_to_first: Summary,
    /// Send → last byte.
    pub e2e: Summary,
    /// Arrival → last byte.
    pub arrival_to_end: Summary,
    /// (E2E − TTFT) / (tokens − 1), requests with at least two tokens.
    pub tpot: Summary,
    /// The gateway's `x-sluice-queue-ms`, every request that carried it (shed ones too).
    pub queue: Summary,
    /// All scored requests, and by kind (`needle@10%`).
    pub score: Option<Score>,
    pub score_by_kind: BTreeMap<String, Score>,
}

impl ScenarioStats {
    pub fn of(run: &Run) -> Self {
        let mut st = Self {
            total: run.records.len(),
            wall: run.wall,
            ..Self::default()
        };
        let (mut ttft, mut first, mut e2e, mut end, mut tpot, mut queue, mut prompt) =
            (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
        for r in &run.records {
            let s = &r.sample;
            let label = s.outcome.label();
            *st.outcomes.entry(label.clone()).or_insert(0) += 1;
            st.retried += usize::from(s.retries > 0);
            if let Some(q) = s.queue_ms {
                queue.push(q / 1e3);
            }
            if let Some(passed) = r.passed {
                for score in [
                    st.score.get_or_insert_with(Score::default),
                    st.score_by_kind.entry(r.kind.clone()).or_default(),
                ] {
                    score.checked += 1;
                    score.passed += usize::from(passed);
                }
            }
            if !s.outcome.is_ok() {
                st.failure_examples
                    .entry(label)
                    .or_insert_with(|| s.outcome.message());
                continue;
            }
            st.succeeded += 1;
            let tokens = s.tokens();
            st.completion_tokens += tokens;
            st.usage_reported += usize::from(s.completion_tokens.is_some());
            if let Some(p) = s.prompt_tokens {
                prompt.push(p as f64);
            }
            e2e.push(s.e2e.as_secs_f64());
            end.push(r.arrival_to_end().as_secs_f64());
            if let (Some(t), Some(f)) = (s.ttft, r.arrival_to_first()) {
                ttft.push(t.as_secs_f64());
                first.push(f.as_secs_f64());
                if tokens > 1 {
                    tpot.push(s.e2e.saturating_sub(t).as_secs_f64() / (tokens - 1) as f64);
                }
            }
        }
        st.prompt_tokens_mean = Summary::of(&prompt).mean;
        st.ttft = Summary::of(&ttft);
        st.arrival_to_first = Summary::of(&first);
        st.e2e = Summary::of(&e2e);
        st.arrival_to_end = Summary::of(&end);
        st.tpot = Summary::of(&tpot);
        st.queue = Summary::of(&queue);
        st
    }

    /// Completion tokens of the successful requests ÷ the wall time.
    pub fn output_tok_per_s(&self) -> f64 {
        per_second(self.completion_tokens as f64, self.wall)
    }

    /// Finished requests (successful or not) ÷ the wall time.
    pub fn requests_per_s(&self) -> f64 {
        per_second(self.total as f64, self.wall)
    }

    /// Successful requests ÷ the wall time: what the server sustained.
    pub fn goodput_per_s(&self) -> f64 {
        per_second(self.succeeded as f64, self.wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Outcome, Sample};
    use crate::workload::Record;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 95.0), Some(10.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 91.0), Some(10.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[7.0], 50.0), Some(7.0));
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // 20 samples: p95 is the 19th, p50 the 10th.
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 95.0), Some(19.0));
        assert_eq!(percentile(&v, 50.0), Some(10.0));
        // Never interpolates: the result is always one of the samples.
        assert_eq!(percentile(&[1.0, 100.0], 50.0), Some(1.0));
    }

    #[test]
    fn summary_sorts_its_input() {
        let s = Summary::of(&[30.0, 10.0, 20.0, 40.0]);
        assert_eq!(s.count, 4);
        assert_eq!(s.p50, Some(20.0));
        assert_eq!(s.p95, Some(40.0));
        assert_eq!(s.mean, Some(25.0));
        assert_eq!(Summary::of(&[]), Summary::default());
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A record due at `arrival` ms, sent at `sent` ms.
    fn record(outcome: Outcome, arrival: u64, sent: u64, ttft: u64, e2e: u64) -> Record {
        let mut sample = Sample::failed(outcome, ms(e2e));
        sample.ttft = Some(ms(ttft));
        sample.completion_tokens = Some(11);
        sample.prompt_tokens = Some(256);
        sample.queue_ms = Some(1500.0);
        Record {
            sample,
            arrival: ms(arrival),
            sent: ms(sent),
            kind: "k".into(),
            passed: None,
        }
    }

    #[test]
    fn scenario_aggregates_successes_and_counts_failures() {
        let busy = Outcome::Http {
            status: 503,
            code: Some("overloaded".into()),
            message: "busy".into(),
        };
        let mut no_usage = record(Outcome::Ok, 1000, 3000, 200, 1200);
        no_usage.sample.completion_tokens = None;
        no_usage.sample.content_chunks = 6;
        no_usage.passed = Some(false);
        let mut scored = record(Outcome::Ok, 0, 0, 100, 1100);
        scored.passed = Some(true);
        let run = Run {
            records: vec![
                scored,
                no_usage,
                record(busy, 2000, 2000, 0, 5),
                record(
                    Outcome::StreamError {
                        code: "internal_error".into(),
                        message: "boom".into(),
                    },
                    0,
                    0,
                    50,
                    60,
                ),
            ],
            wall: Duration::from_secs(2),
            duration: None,
        };
        let s = ScenarioStats::of(&run);
        assert_eq!((s.total, s.succeeded), (4, 2));
        assert_eq!(s.completion_tokens, 17);
        assert_eq!(s.usage_reported, 1);
        assert_eq!(s.output_tok_per_s(), 8.5);
        assert_eq!((s.requests_per_s(), s.goodput_per_s()), (2.0, 1.0));
        assert_eq!(s.outcomes["ok"], 2);
        assert_eq!(s.outcomes["http_503:overloaded"], 1);
        assert_eq!(s.failure_examples["stream_error:internal_error"], "boom");
        assert_eq!(
            (s.ttft.count, s.ttft.p50, s.ttft.p95),
            (2, Some(0.1), Some(0.2))
        );
        assert_eq!(s.e2e.p95, Some(1.2));
        // The second request waited 2 s in the client before its 1.2 s.
        assert_eq!(s.arrival_to_end.p95, Some(3.2));
        assert_eq!(s.arrival_to_first.p95, Some(2.2));
        // 1 s over 10 gaps; 1 s over 5 gaps.
        assert_eq!(s.tpot.p50, Some(0.1));
        assert_eq!(s.tpot.p95, Some(0.2));
        assert_eq!((s.queue.count, s.queue.p50), (4, Some(1.5)));
        assert_eq!(s.prompt_tokens_mean, Some(256.0));
        assert_eq!(
            s.score,
            Some(Score {
                passed: 1,
                checked: 2
            })
        );
    }
}
