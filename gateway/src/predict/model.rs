//! The upstream's cost model: two functions, fitted online.
//!
//! - **Prefill** of a prompt of `p` tokens while `c` tokens of other sequences' context are
//!   running, a share `φ` of it beside other requests' decodes:
//!   `base + a·k + b·k² + r·k·(c/10⁴) + (d·k + e·k²)·φ` seconds, `k = p/1000`. The linear term
//!   is the weights, the square the attention over the prompt itself, the fourth the decode
//!   rows of the running sequences that a chunked prefill carries in every step, the last two
//!   what a prompt's chunks cost more while others decode: an upstream that keeps its decodes
//!   flowing cuts a prompt into smaller chunks then (the bundled engine: 16 tokens), each step
//!   of which also runs the decodes (`d`, per chunk, so per token), and each chunk reads the
//!   whole context before it again (`e`, growing with the square of the prompt: on Zen 3,
//!   3.5 s at 4K and 13.7 s at 8K). Both are needed: with `e` alone, the extra time of short
//!   prompts beside decodes (0.27 s at 256 tokens on model 167, where 1,262 tokens took 1.06 s
//!   more and 9,905 tokens 10.8 s) went into the square, which after a few minutes of short
//!   traffic told a lone 8K prompt 87–106 s on an idle upstream (~8 s real). `φ` is measured over each
//!   prefill; how it is predicted is admission's (`State::decoding_share`).
//! - **Decode step** with `n` sequences running over `c` tokens of context:
//!   `base + s·n + q·(c/10⁴)` seconds per token of each sequence.
//!
//! Both start at the policy's `[admission.cost]` (written by `sluice-load calibrate`) and are
//! refitted from every stream the gateway watches: its upstream time to first token (prefill)
//! and its mean gap between tokens outside any prefill (decode).
//!
//! A third figure is learned from the streams alone: the gap between a stream's tokens while
//! another request prefills. An upstream that batches decode steps with prefill chunks (vLLM's
//! v1 scheduler, the bundled engine) keeps its running requests decoding through a long
//! prefill, a token per chunk; how fast depends on its chunk size, which the gateway is not
//! told. Until a stream has shown it, the simulation takes decodes to wait out each prefill.

use super::fit::OnlineFit;
use crate::policy::Cost;

/// Prefill features: `[1, k, k², k·c, k·φ, k²·φ]`.
pub const PREFILL_TERMS: [&str; 6] = [
    "base",
    "per_1k",
    "per_1k_squared",
    "per_1k_per_10k_running",
    "per_1k_beside_decodes",
    "per_1k_squared_beside_decodes",
];
/// Decode features: `[1, n, c]`.
pub const DECODE_TERMS: [&str; 3] = ["base", "per_seq", "per_10k_context"];

/// The two fits.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    prefill: OnlineFit<6>,
    decode: OnlineFit<3>,
    /// Seconds between a stream's tokens while some prefill runs (`None`: none seen yet).
    beside_prefill: Option<f64>,
    beside_prefill_observations: u64,
    refit: bool,
}

/// How far one stream moves the gap beside a prefill: about the last ten streams count, as in
/// the fits ([`super::fit`]).
const BESIDE_PREFILL_GAIN: f64 = 0.2;

/// Where a prefill runs: the other sequences' context, and the share of it beside decodes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Beside {
    /// Tokens of context of the sequences running.
    pub context: usize,
    /// The share of the prefill (0–1) during which some other request decodes.
    pub decoding: f64,
}

impl Beside {
    /// An idle upstream: nothing running, nothing decoding.
    pub const IDLE: Beside = Beside {
        context: 0,
        decoding: 0.0,
    };
}

fn prefill_x(prompt: usize, beside: Beside) -> [f64; 6] {
    let k = prompt as f64 / 1000.0;
    let c = beside.context as f64 / 10_000.0;
    let phi = beside.decoding.clamp(0.0, 1.0);
    [1.0, k, k * k, k * c, k * phi, k * k * phi]
}

/// How far an observed prefill of `seconds` may be off (one standard deviation), where the
/// upstream spent `others` seconds on other requests first, as predicted. Timing noise grows
/// with the time measured, 20% of it, at least 2 ms (a loopback upstream's jitter): a floor near
/// the short prompts' own prefill (20 ms on the bundled engine) would weigh a 20 ms and a 50 ms
/// prefill alike, and the fit would average them instead of following the short ones. The
/// observation is the upstream's time less the others' predicted, so their error is in it too:
/// 20% of their time beside it. Until 2026-12-07 it was 20% of the time observed alone, and a
/// prompt behind others that ran faster than predicted, observed at nothing, weighed as a 2 ms
/// measurement: after the seed's mix and two minutes of short traffic (model 167, three of
/// five prefills behind others), the per-token cost had fallen from 0.50 to 0.23 s a 1K and a
/// lone 8K prompt (~7.5 s) was predicted 4.5–5.0 s alone; replaying the same observations with
/// the others' time counted, 5.7–6.3 s.
fn prefill_noise(seconds: f64, others: f64) -> f64 {
    (0.2 * seconds.max(0.0).hypot(others.max(0.0))).max(0.002)
}

fn decode_x(running: usize, context: usize) -> [f64; 3] {
    [1.0, running as f64, context as f64 / 10_000.0]
}

impl CostModel {
    /// The model seeded from the policy (milliseconds there, seconds here).
    pub fn new(seed: &Cost) -> Self {
        let ms = |v: f64| v / 1000.0;
        let prefill = [
            ms(seed.prefill_base_ms),
            ms(seed.prefill_ms_per_1k),
            ms(seed.prefill_ms_per_1k_squared),
            ms(seed.prefill_ms_per_1k_per_10k_running),
            ms(seed.prefill_ms_per_1k_beside_decodes),
            ms(seed.prefill_ms_per_1k_squared_beside_decodes),
        ];
        let decode = [
            ms(seed.decode_base_ms),
            ms(seed.decode_ms_per_seq),
            ms(seed.decode_ms_per_10k_context),
        ];
        // Each coefficient may be off by its own size, or by a floor for a zero seed; the
        // per-token term by half its size: short prompts (k ≈ 0.03) only see `base + 0.03 a`,
        // and a wider prior on `a` let twenty of them drag it to a third of its value (the
        // first 2K prompt then predicted 78% short, in the recorded replay). Beside decodes,
        // the per-token term's floor (0.5 s a 1K) is wide enough to take what short prompts
        // show there (~1 s a 1K on model 167) and the square's narrow enough (0.25 s a 1K²,
        // whose share of a 256-token prompt's correction is then under 2%) that it learns from
        // long prompts only.
        let spread = |v: f64, floor: f64| v.max(floor);
        Self {
            prefill: OnlineFit::new(
                prefill,
                [
                    spread(prefill[0], 0.05),
                    spread(0.5 * prefill[1], 0.25),
                    spread(prefill[2], 0.1),
                    spread(prefill[3], 0.1),
                    spread(prefill[4], 0.5),
                    spread(prefill[5], 0.25),
                ],
            ),
            decode: OnlineFit::new(
                decode,
                [
                    spread(decode[0], 0.01),
                    spread(decode[1], 0.005),
                    spread(decode[2], 0.01),
                ],
            ),
            beside_prefill: None,
            beside_prefill_observations: 0,
            refit: seed.refit,
        }
    }

    /// Seconds to prefill `prompt` tokens `beside` the other requests.
    pub fn prefill(&self, prompt: usize, beside: Beside) -> f64 {
        self.prefill.predict(&prefill_x(prompt, beside)).max(0.0)
    }

    /// Seconds per decode step with `running` sequences over `context` tokens.
    pub fn decode_step(&self, running: usize, context: usize) -> f64 {
        self.decode.predict(&decode_x(running, context)).max(1e-4)
    }

    /// A prefill `beside` the other requests took `seconds`, less what the upstream spent on
    /// others before its first token as predicted (`others` seconds: their error is in
    /// `seconds` too).
    pub fn observe_prefill(&mut self, prompt: usize, beside: Beside, seconds: f64, others: f64) {
        if self.refit {
            let noise = prefill_noise(seconds, others);
            self.prefill
                .observe(&prefill_x(prompt, beside), seconds, noise);
        }
    }

    /// Decode steps took `seconds` each on average.
    pub fn observe_decode(&mut self, running: usize, context: usize, seconds: f64) {
        if self.refit {
            let noise = (0.2 * seconds).max(0.0005);
            self.decode
                .observe(&decode_x(running, context), seconds, noise);
        }
    }

    /// Seconds between a decoding request's tokens while another prefills, once seen.
    pub fn decode_beside_prefill(&self) -> Option<f64> {
        self.beside_prefill
    }

    /// A stream's tokens came `seconds` apart on average while some prefill ran.
    pub fn observe_decode_beside_prefill(&mut self, seconds: f64) {
        if self.refit && seconds.is_finite() && seconds > 0.0 {
            let old = self.beside_prefill.unwrap_or(seconds);
            self.beside_prefill = Some(old + BESIDE_PREFILL_GAIN * (seconds - old));
            self.beside_prefill_observations += 1;
        }
    }

    /// The coefficients in seconds, named as in [`PREFILL_TERMS`] and [`DECODE_TERMS`].
    pub fn parameters(&self) -> Parameters {
        Parameters {
            prefill: self.prefill.coefficients(),
            decode: self.decode.coefficients(),
            decode_beside_prefill: self.beside_prefill,
            prefill_observations: self.prefill.observations(),
            decode_observations: self.decode.observations(),
            decode_beside_prefill_observations: self.beside_prefill_observations,
        }
    }
}

/// The model's coefficients (seconds) and how many observations shaped them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Parameters {
    pub prefill: [f64; 6],
    pub decode: [f64; 3],
    /// Seconds between a decoding request's tokens while another prefills (`None`: unseen).
    pub decode_beside_prefill: Option<f64>,
    pub prefill_observations: u64,
    pub decode_observations: u64,
    pub decode_beside_prefill_observations: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_from_the_policy_then_refitted() {
        let seed = Cost::default();
        let mut m = CostModel::new(&seed);
        let cold = m.prefill(256, Beside::IDLE);
        let expect = (seed.prefill_base_ms
            + 0.256 * seed.prefill_ms_per_1k
            + 0.256 * 0.256 * seed.prefill_ms_per_1k_squared)
            / 1000.0;
        assert!((cold - expect).abs() < 1e-9, "{cold} vs {expect}");
        // An upstream whose prefill is 3 s per 1K tokens, plus 0.1 s.
        for i in 0..300 {
            let p = [256, 1024, 4096, 8192][i % 4];
            m.observe_prefill(p, Beside::IDLE, 0.1 + 3.0 * p as f64 / 1000.0, 0.0);
            m.observe_decode(1 + i % 4, 1000, 0.02 + 0.01 * (1 + i % 4) as f64);
        }
        let at_4k = m.prefill(4096, Beside::IDLE);
        assert!((at_4k - 12.388).abs() < 0.6, "{at_4k}");
        let step = m.decode_step(4, 1000);
        assert!((step - 0.06).abs() < 0.005, "{step}");
        assert_eq!(m.parameters().prefill_observations, 300);
        // With refit off the seed stays.
        let mut frozen = CostModel::new(&Cost {
            refit: false,
            ..Cost::default()
        });
        frozen.observe_prefill(4096, Beside::IDLE, 100.0, 0.0);
        assert_eq!(frozen.prefill(256, Beside::IDLE), cold);
        frozen.observe_decode_beside_prefill(0.1);
        assert_eq!(frozen.decode_beside_prefill(), None);
    }

    #[test]
    fn a_prefill_beside_decodes_learns_its_own_cost() {
        // Prompts take 0.8 s per 1K alone and 0.2 s per 1K² more beside decodes (the bundled
        // engine's 16-token chunks on Zen 3); short ones hardly show the latter.
        let mut m = CostModel::new(&Cost::default());
        let truth = |p: usize, share: f64| {
            let k = p as f64 / 1000.0;
            0.02 + 0.8 * k + 0.2 * k * k * share
        };
        for i in 0..200 {
            let p = [256, 256, 256, 4096, 8192][i % 5];
            let share = [0.0, 1.0, 0.5, 0.0, 0.7][(i / 5) % 5];
            let beside = Beside {
                context: 0,
                decoding: share,
            };
            m.observe_prefill(p, beside, truth(p, share), 0.0);
        }
        for share in [0.0, 0.5, 1.0] {
            let beside = Beside {
                context: 0,
                decoding: share,
            };
            let (got, want) = (m.prefill(8192, beside), truth(8192, share));
            assert!((got - want).abs() < 0.05 * want, "{share}: {got} vs {want}");
        }
        let e = m.parameters().prefill[5];
        assert!((e - 0.2).abs() < 0.03, "{e}");
        // A share past 1 (or below 0) is clamped, not extrapolated.
        let over = Beside {
            context: 0,
            decoding: 3.0,
        };
        let full = Beside {
            context: 0,
            decoding: 1.0,
        };
        assert_eq!(m.prefill(8192, over), m.prefill(8192, full));
    }

    /// A few minutes of short traffic, some of it beside decodes, must leave a long prompt's
    /// prediction where the long prompts put it: the short ones cannot tell the terms apart.
    /// Recorded on model 167 (bundled engine, 2 cores): 256-token prompts took 0.13 s alone and
    /// 0.40 s beside three decoding streams. Before the per-token term beside decodes, this
    /// put all of that into the square and predicted an 8K prompt beside decodes 274 s,
    /// against the 16 s the short ones extrapolate to (the live gateway's square reached 1.24 s
    /// a 1K² and told a lone 8K prompt 87-106 s on an idle upstream, ~8 s real).
    #[test]
    fn short_traffic_leaves_a_long_prompt_s_prediction_alone() {
        let mut m = CostModel::new(&Cost::default());
        let alone_8k = m.prefill(8192, Beside::IDLE);
        let busy = Beside {
            context: 1200,
            decoding: 1.0,
        };
        for i in 0..400 {
            if i % 3 == 0 {
                m.observe_prefill(256, Beside::IDLE, 0.13, 0.0);
            } else {
                m.observe_prefill(256, busy, 0.40, 0.0);
            }
        }
        let after = m.prefill(8192, Beside::IDLE);
        assert!(
            (after - alone_8k).abs() < 0.25 * alone_8k,
            "alone: {after} s against {alone_8k} s before"
        );
        // Beside decodes: no more than half again the per-token extrapolation of what the
        // short prompts showed there (1.05 s a 1K more).
        let beside = m.prefill(8192, busy);
        let linear = alone_8k + 8.192 * (0.40 - 0.13) / 0.256;
        assert!(
            beside < 1.5 * linear,
            "beside: {beside} s, linear {linear} s"
        );
        // The short prompts themselves are predicted as they ran.
        assert!((m.prefill(256, busy) - 0.40).abs() < 0.05);
        assert!((m.prefill(256, Beside::IDLE) - 0.13).abs() < 0.05);
    }

    /// A prompt that waited behind others' prefills is observed as the upstream's time less
    /// theirs as predicted; when they ran faster, nothing is left of it. Such an observation
    /// tells how wrong the others' prediction was, not this prompt's time: weighed as a 2 ms
    /// measurement (before 2026-12-07), one halved a learned 4K prediction.
    #[test]
    fn a_prefill_cut_to_nothing_by_the_others_time_weighs_as_little_as_it_tells() {
        let truth = |p: usize| {
            let k = p as f64 / 1000.0;
            0.02 + 0.5 * k + 0.05 * k * k
        };
        let learned = || {
            let mut m = CostModel::new(&Cost::default());
            for i in 0..40 {
                let p = [256, 256, 256, 4096][i % 4];
                m.observe_prefill(p, Beside::IDLE, truth(p), 0.0);
            }
            m
        };
        let mut m = learned();
        let before = m.prefill(4096, Beside::IDLE);
        assert!(
            (before - truth(4096)).abs() < 0.05 * truth(4096),
            "{before}"
        );
        // Behind 6 s of others' predicted prefill, observed at nothing: within 15% (it fell to
        // half, 1.44 s of 2.91 s, at the old weight).
        m.observe_prefill(4096, Beside::IDLE, 0.0, 6.0);
        let after = m.prefill(4096, Beside::IDLE);
        assert!(after > 0.85 * before, "{after} s, {before} s before");
        // With nothing ahead of it, the same observation is its own time, and taken so.
        let mut alone = learned();
        alone.observe_prefill(4096, Beside::IDLE, 0.0, 0.0);
        assert!(alone.prefill(4096, Beside::IDLE) < 0.6 * before);
        // A seed too high still learns at once from a prefill it overestimates (0.16 s
        // predicted, 0.05 s observed; weighing it by the larger of the two, tried first, left a
        // recorded replay's first predictions 84-91% high).
        let mut cold = CostModel::new(&Cost::default());
        cold.observe_prefill(256, Beside::IDLE, 0.05, 0.0);
        assert!(
            cold.prefill(256, Beside::IDLE) < 0.07,
            "{}",
            cold.prefill(256, Beside::IDLE)
        );
    }

    #[test]
    fn the_gap_beside_a_prefill_is_unknown_until_seen_then_follows_the_streams() {
        let mut m = CostModel::new(&Cost::default());
        assert_eq!(m.decode_beside_prefill(), None);
        m.observe_decode_beside_prefill(1.0);
        assert_eq!(m.decode_beside_prefill(), Some(1.0));
        // The engine's chunks got smaller: within ten streams the gap follows.
        for _ in 0..10 {
            m.observe_decode_beside_prefill(0.1);
        }
        let gap = m.decode_beside_prefill().expect("seen");
        assert!(gap > 0.1 && gap < 0.2, "{gap}");
        // Nothing that is no gap moves it.
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            m.observe_decode_beside_prefill(bad);
        }
        assert_eq!(m.decode_beside_prefill(), Some(gap));
        assert_eq!(m.parameters().decode_beside_prefill_observations, 11);
    }
}
