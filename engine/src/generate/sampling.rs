//! Choosing the next token from logits: logit bias, repetition penalties, top-k, top-p, min-p,
//! temperature, seeded; and the log-probabilities OpenAI's `logprobs` reports.
//!
//! The order is llama.cpp's sampler chain: the logits are biased and penalized, the candidates
//! cut by top-k, top-p and min-p on the untempered distribution, and the survivors sampled at
//! `temperature`. Temperature 0 is greedy over the biased, penalized logits.

use std::collections::{HashMap, HashSet};

/// How to pick tokens. `temperature == 0` is greedy; `top_k == 0` and `top_p >= 1` disable
/// those filters.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    /// Seed for reproducible sampling; `None` seeds from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }
}

/// What changes the logits before the choice, besides temperature and the top filters. The
/// default changes nothing.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Shaping {
    /// Drops candidates whose probability is below `min_p` times the most likely one's.
    pub min_p: f32,
    /// OpenAI's: subtracted once per earlier occurrence in the output.
    pub frequency_penalty: f32,
    /// OpenAI's: subtracted once if the token occurred in the output.
    pub presence_penalty: f32,
    /// vLLM's (CTRL's): a logit of a token seen in the prompt or the output is divided by it
    /// when positive, multiplied when negative; 1 disables.
    pub repetition_penalty: f32,
    /// Added to the logits of these tokens (OpenAI's `logit_bias`, -100..=100).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Shaping {
    fn default() -> Self {
        Self {
            min_p: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

impl Shaping {
    fn penalizes(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 || self.repetitive()
    }

    /// Whether the prompt matters (only the repetition penalty looks at it).
    pub fn repetitive(&self) -> bool {
        self.repetition_penalty != 1.0
    }

    fn is_identity(&self) -> bool {
        self.min_p <= 0.0 && !self.penalizes() && self.logit_bias.is_empty()
    }
}

/// The chosen token's log-probability and the most likely alternatives', under the model's own
/// distribution (before bias, penalties, filters and temperature, as vLLM reports them).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// A small, fast, seedable PRNG (SplitMix64); sampling needs reproducibility, not cryptography.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Picks tokens for one sequence, remembering what it picked (for the penalties).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    shaping: Shaping,
    rng: Rng,
    /// How often each token occurred in the output so far.
    counts: HashMap<u32, u32>,
    /// Tokens of the prompt (for the repetition penalty).
    prompt: HashSet<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Self::with_shaping(params, Shaping::default())
    }

    pub fn with_shaping(params: SamplingParams, shaping: Shaping) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Self {
            params,
            shaping,
            rng: Rng::new(seed),
            counts: HashMap::new(),
            prompt: HashSet::new(),
        }
    }

    /// The prompt the repetition penalty looks at (given once, with the first sample).
    pub fn set_prompt(&mut self, prompt: &[u32]) {
        self.prompt = prompt.iter().copied().collect();
    }

    /// Picks the next token and records it as output.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let id = self.pick(logits);
        *self.counts.entry(id).or_insert(0) += 1;
        id
    }

    fn pick(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if self.shaping.is_identity() && (p.temperature <= 0.0 || p.top_k == 1) {
            return argmax(logits);
        }
        let mut shaped;
        let logits = if self.shaping.is_identity() {
            logits
        } else {
            shaped = logits.to_vec();
            self.shape(&mut shaped);
            &shaped[..]
        };
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l))
            .collect();
        if cand.is_empty() {
            return argmax(logits);
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, |a, b| b.1.total_cmp(&a.1));
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        let max = cand[0].1;
        // Untempered probabilities for top-p and min-p.
        let mut probs: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            keep = probs
                .iter()
                .position(|&x| {
                    cum += x;
                    cum >= p.top_p
                })
                .map_or(keep, |i| i + 1);
        }
        if self.shaping.min_p > 0.0 {
            let floor = self.shaping.min_p * probs[0];
            keep = keep.min(probs.iter().take_while(|&&x| x >= floor).count().max(1));
        }
        cand.truncate(keep);
        // The survivors at temperature.
        let weights: Vec<f32> = cand
            .iter()
            .map(|c| ((c.1 - max) / p.temperature).exp())
            .collect();
        let total: f32 = weights.iter().sum();
        let mut r = self.rng.next_f32() * total;
        for (c, &w) in cand.iter().zip(&weights) {
            if r < w {
                return c.0;
            }
            r -= w;
        }
        cand[cand.len() - 1].0
    }

    /// Logit bias, then the penalties (OpenAI's frequency and presence, vLLM's repetition).
    fn shape(&self, logits: &mut [f32]) {
        let s = &self.shaping;
        for &(id, bias) in &s.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if s.repetitive() {
            let seen = self.prompt.iter().chain(self.counts.keys());
            for &id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / s.repetition_penalty
                    } else {
                        *l * s.repetition_penalty
                    };
                }
            }
        }
        for (&id, &n) in &self.counts {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= s.frequency_penalty * n as f32 + s.presence_penalty;
            }
        }
    }
}

/// The index of the largest logit; the lowest index wins a tie (SIMD, on the CPU kernels).
pub use crate::backend::cpu::kernels::argmax;

/// `log softmax(logits)[i]`.
pub fn log_prob(logits: &[f32], i: usize) -> f32 {
    logits[i] - log_sum_exp(logits)
}

fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    logits
        .iter()
        .map(|l| ((l - max) as f64).exp())
        .sum::<f64>()
        .ln() as f32
        + max
}

/// `id`'s log-probability under `logits` and the `top` most likely tokens' (ties: lower id).
pub fn token_logprob(logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let lse = log_sum_exp(logits);
    let mut best: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let top = top.min(best.len());
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if top > 0 && top < best.len() {
        best.select_nth_unstable_by(top - 1, order);
    }
    best.truncate(top);
    best.sort_unstable_by(order);
    TokenLogprob {
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |l| l - lse),
        top: best.into_iter().map(|(i, l)| (i, l - lse)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_with_lowest_index_on_ties() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 5,
            top_p: 1.0,
            seed: Some(42),
        };
        let run = || {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run(), "same seed, same tokens");
        // The five largest logits are the five indices with i % 7 == 6 among the first ones.
        assert!(
            a.iter().all(|t| t % 7 == 6),
            "top-k kept only the highest logits: {a:?}"
        );
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(
            distinct.len() > 1,
            "sampling at temperature 1 is not greedy"
        );
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        // One token holds ~0.98 of the mass; top_p 0.5 must always pick it.
        let mut logits = vec![0.0; 10];
        logits[3] = 8.0;
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: Some(1),
        });
        assert!((0..200).all(|_| s.sample(&logits) == 3));
    }

    fn greedy(shaping: Shaping) -> Sampler {
        Sampler::with_shaping(SamplingParams::default(), shaping)
    }

    #[test]
    fn logit_bias_moves_the_choice_and_minus_100_bans() {
        let logits = [0.0, 5.0, 4.0];
        let mut s = greedy(Shaping {
            logit_bias: vec![(1, -100.0)],
            ..Shaping::default()
        });
        assert_eq!(s.sample(&logits), 2);
        let mut s = greedy(Shaping {
            logit_bias: vec![(0, 6.0)],
            ..Shaping::default()
        });
        assert_eq!(s.sample(&logits), 0);
    }

    #[test]
    fn frequency_and_presence_penalties_count_the_output() {
        // Token 0 leads by 1.5: a presence penalty of 2 stops a second pick, a frequency
        // penalty of 0.5 only after three.
        let logits = [2.5, 1.0];
        let mut s = greedy(Shaping {
            presence_penalty: 2.0,
            ..Shaping::default()
        });
        assert_eq!([s.sample(&logits), s.sample(&logits)], [0, 1]);
        let mut s = greedy(Shaping {
            frequency_penalty: 0.5,
            ..Shaping::default()
        });
        let picks: Vec<u32> = (0..5).map(|_| s.sample(&logits)).collect();
        assert_eq!(picks, [0, 0, 0, 0, 1]);
    }

    #[test]
    fn repetition_penalty_covers_the_prompt() {
        let logits = [3.0, 2.0, -1.0];
        let mut s = greedy(Shaping {
            repetition_penalty: 2.0,
            ..Shaping::default()
        });
        s.set_prompt(&[0]);
        // 3 / 2 = 1.5 < 2: the prompt's token loses.
        assert_eq!(s.sample(&logits), 1);
        // Now both were seen: 1.5 vs 1.0.
        assert_eq!(s.sample(&logits), 0);
    }

    #[test]
    fn min_p_drops_the_unlikely_tail() {
        // p(0) ~ 0.9; min_p 0.5 leaves only token 0 even at a high temperature.
        let mut logits = vec![0.0f32; 8];
        logits[0] = 5.0;
        let mut s = Sampler::with_shaping(
            SamplingParams {
                temperature: 2.0,
                seed: Some(3),
                ..SamplingParams::default()
            },
            Shaping {
                min_p: 0.5,
                ..Shaping::default()
            },
        );
        assert!((0..200).all(|_| s.sample(&logits) == 0));
    }

    #[test]
    fn token_logprob_reports_the_model_distribution() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let lp = token_logprob(&logits, 2, 3);
        assert!((lp.logprob - log_prob(&logits, 2)).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2], "most likely first, ties by id");
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
    }

    #[test]
    fn log_prob_normalizes() {
        let l = [1.0f32, 2.0, 3.0];
        let total: f32 = (0..3).map(|i| log_prob(&l, i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
