//! Choosing the next token from logits: greedy, temperature, top-k, top-p, seeded.

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

/// Picks tokens for one sequence.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Self {
            params,
            rng: Rng::new(seed),
        }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || p.top_k == 1 {
            return argmax(logits);
        }
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l / p.temperature))
            .collect();
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, |a, b| b.1.total_cmp(&a.1));
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        let max = cand[0].1;
        let mut probs: Vec<f32> = cand.iter().map(|c| (c.1 - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let keep = probs.iter().position(|&x| {
                cum += x;
                cum >= p.top_p
            });
            let keep = keep.map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut r = self.rng.next_f32() * total;
        for (i, &pr) in probs.iter().enumerate() {
            if r < pr {
                return cand[i].0;
            }
            r -= pr;
        }
        cand[probs.len() - 1].0
    }
}

/// The index of the largest logit; the lowest index wins a tie (SIMD, on the CPU kernels).
pub use crate::backend::cpu::kernels::argmax;

/// `log softmax(logits)[i]`.
pub fn log_prob(logits: &[f32], i: usize) -> f32 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = logits
        .iter()
        .map(|l| ((l - max) as f64).exp())
        .sum::<f64>()
        .ln() as f32
        + max;
    logits[i] - lse
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

    #[test]
    fn log_prob_normalizes() {
        let l = [1.0f32, 2.0, 3.0];
        let total: f32 = (0..3).map(|i| log_prob(&l, i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
