//! Percentiles and the per-level aggregate of a batch of request samples.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::client::Sample;

/// Nearest-rank percentile of `sorted` (ascending): the smallest sample such that at least
/// `p`% of the samples are at or below it, i.e. `sorted[ceil(p/100 * n) - 1]` (`p = 0` gives
/// the minimum). `None` for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50/p95/mean over a set of samples (milliseconds, say).
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Everything reported for one (shape, concurrency) level.
#[derive(Debug, Clone)]
pub struct LevelStats {
    /// The shape as given on the command line (`256:128`).
    pub shape: String,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub concurrency: usize,
    /// Requests sent (and finished, one way or another).
    pub total: usize,
    pub succeeded: usize,
    /// Outcome label (`ok`, `http_503:engine_unavailable`, `stream_error:internal_error`,
    /// `timeout`, ...) → count.
    pub outcomes: BTreeMap<String, usize>,
    /// One example message per failing outcome label.
    pub failure_examples: BTreeMap<String, String>,
    /// From the first request sent to the last one finished.
    pub wall: Duration,
    /// Completion tokens of the successful requests.
    pub completion_tokens: u64,
    /// Successful requests whose token count came from a `usage` chunk (the rest counted
    /// content chunks).
    pub usage_reported: usize,
    /// Mean `usage.prompt_tokens` the server reported, over the requests that reported it.
    pub prompt_tokens_mean: Option<f64>,
    /// Send → first content chunk, successful requests, ms.
    pub ttft_ms: Summary,
    /// Send → end of stream, successful requests, ms.
    pub e2e_ms: Summary,
    /// (E2E − TTFT) / (tokens − 1), successful requests with at least two tokens, ms.
    pub tpot_ms: Summary,
    /// The `x-sluice-queue-ms` response header, every request that carried it, ms.
    pub queue_ms: Summary,
}

impl LevelStats {
    pub fn from_samples(
        shape: &crate::prompts::Shape,
        concurrency: usize,
        samples: &[Sample],
        wall: Duration,
    ) -> Self {
        let mut outcomes = BTreeMap::new();
        let mut failure_examples = BTreeMap::new();
        let (mut ttft, mut e2e, mut tpot, mut queue, mut prompt) =
            (vec![], vec![], vec![], vec![], vec![]);
        let (mut succeeded, mut completion_tokens, mut usage_reported) = (0, 0, 0);
        for s in samples {
            let label = s.outcome.label();
            *outcomes.entry(label.clone()).or_insert(0) += 1;
            if let Some(q) = s.queue_ms {
                queue.push(q);
            }
            if !s.outcome.is_ok() {
                failure_examples
                    .entry(label)
                    .or_insert_with(|| s.outcome.message());
                continue;
            }
            succeeded += 1;
            let tokens = s.tokens();
            completion_tokens += tokens;
            usage_reported += usize::from(s.completion_tokens.is_some());
            if let Some(p) = s.prompt_tokens {
                prompt.push(p as f64);
            }
            e2e.push(ms(s.e2e));
            if let Some(t) = s.ttft {
                ttft.push(ms(t));
                if tokens > 1 {
                    tpot.push(ms(s.e2e.saturating_sub(t)) / (tokens - 1) as f64);
                }
            }
        }
        Self {
            shape: shape.label.clone(),
            input_tokens: shape.input,
            output_tokens: shape.output,
            concurrency,
            total: samples.len(),
            succeeded,
            outcomes,
            failure_examples,
            wall,
            completion_tokens,
            usage_reported,
            prompt_tokens_mean: Summary::of(&prompt).mean,
            ttft_ms: Summary::of(&ttft),
            e2e_ms: Summary::of(&e2e),
            tpot_ms: Summary::of(&tpot),
            queue_ms: Summary::of(&queue),
        }
    }

    /// Completion tokens of the successful requests ÷ the level's wall time.
    pub fn output_tok_per_s(&self) -> f64 {
        per_second(self.completion_tokens as f64, self.wall)
    }

    /// Finished requests (successful or not) ÷ the level's wall time.
    pub fn requests_per_s(&self) -> f64 {
        per_second(self.total as f64, self.wall)
    }
}

fn per_second(n: f64, wall: Duration) -> f64 {
    let s = wall.as_secs_f64();
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Outcome;
    use crate::prompts::Shape;

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

    fn sample(
        outcome: Outcome,
        ttft_ms: u64,
        e2e_ms: u64,
        usage: Option<u64>,
        chunks: u64,
    ) -> Sample {
        Sample {
            outcome,
            ttft: Some(Duration::from_millis(ttft_ms)),
            e2e: Duration::from_millis(e2e_ms),
            completion_tokens: usage,
            prompt_tokens: usage.map(|_| 256),
            content_chunks: chunks,
            queue_ms: Some(1.5),
        }
    }

    #[test]
    fn level_aggregates_successes_and_counts_failures() {
        let shape: Shape = "256:128".parse().unwrap();
        let samples = vec![
            sample(Outcome::Ok, 100, 1100, Some(11), 11),
            sample(Outcome::Ok, 200, 1200, None, 6),
            sample(
                Outcome::Http {
                    status: 503,
                    code: Some("engine_unavailable".into()),
                    message: "busy".into(),
                },
                0,
                5,
                None,
                0,
            ),
            sample(
                Outcome::StreamError {
                    code: "internal_error".into(),
                    message: "boom".into(),
                },
                50,
                60,
                None,
                2,
            ),
        ];
        let l = LevelStats::from_samples(&shape, 2, &samples, Duration::from_secs(2));
        assert_eq!((l.total, l.succeeded), (4, 2));
        assert_eq!(l.completion_tokens, 17);
        assert_eq!(l.usage_reported, 1);
        assert_eq!(l.output_tok_per_s(), 8.5);
        assert_eq!(l.requests_per_s(), 2.0);
        assert_eq!(l.outcomes["ok"], 2);
        assert_eq!(l.outcomes["http_503:engine_unavailable"], 1);
        assert_eq!(l.outcomes["stream_error:internal_error"], 1);
        assert_eq!(l.failure_examples["stream_error:internal_error"], "boom");
        assert_eq!(l.ttft_ms.count, 2);
        assert_eq!(l.ttft_ms.p50, Some(100.0));
        assert_eq!(l.e2e_ms.p95, Some(1200.0));
        // 1000 ms over 10 gaps; 1000 ms over 5 gaps.
        assert_eq!(l.tpot_ms.p50, Some(100.0));
        assert_eq!(l.tpot_ms.p95, Some(200.0));
        assert_eq!(l.queue_ms.count, 4);
        assert_eq!(l.prompt_tokens_mean, Some(256.0));
    }
}
