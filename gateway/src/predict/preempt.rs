//! What shorter prompts that arrive later take from a long prompt's prefill, where the upstream
//! prefills the least left first (`upstream.prefill_order = "shortest"`, the bundled engine's).
//!
//! Under that order every shorter prompt granted while a long one prefills goes ahead of the
//! long one's rest. The simulation ([`super::simulate`]) sees the requests present; the ones
//! still to come it cannot, yet they are what made admitted 8K prompts miss their deadline by
//! a second or two beside steady short traffic (Zen 3, docs/capacity.md, item 5). As for the
//! lowest class of a preemptive priority queue, the long prefill gets only the share of the
//! upstream that the shorter arrivals leave: its `w` seconds of work take `w / (1 − ρ)`, where
//! `ρ` is the prefill seconds per second that prompts shorter than it bring. `ρ` is taken from
//! the last minute's grants ([`super::RecentGrants`]), each at its predicted prefill time and
//! the weight of its age there.

/// The share of the upstream the shorter arrivals may take, at most: beyond it a prediction
/// says "ten times its own time" (and misses any deadline it had room for) rather than forever.
pub const SHARE_MAX: f64 = 0.9;

/// The load that recent arrivals put on the upstream's prefill, by prompt length.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Preemption {
    /// `(prompt, load of every prompt up to and including this one)`, by prompt; the load is
    /// prefill seconds per second.
    cumulative: Vec<(usize, f64)>,
}

impl Preemption {
    /// No preemption: the upstream prefills in arrival order, or nothing arrived.
    pub const NONE: Preemption = Preemption {
        cumulative: Vec::new(),
    };

    /// From `grants`, each a prompt and its predicted prefill seconds, seen over `window`
    /// seconds.
    pub fn new(grants: impl IntoIterator<Item = (usize, f64)>, window: f64) -> Self {
        let mut grants: Vec<(usize, f64)> = grants
            .into_iter()
            .filter(|(_, s)| s.is_finite() && *s > 0.0)
            .collect();
        if window <= 0.0 || !window.is_finite() {
            return Self::NONE;
        }
        grants.sort_by_key(|(p, _)| *p);
        let mut sum = 0.0;
        let cumulative = grants
            .into_iter()
            .map(|(p, s)| {
                sum += s / window;
                (p, sum)
            })
            .collect();
        Self { cumulative }
    }

    /// The share of the upstream (0–[`SHARE_MAX`]) that prompts shorter than `prompt` take.
    pub fn share_below(&self, prompt: usize) -> f64 {
        let i = self.cumulative.partition_point(|(p, _)| *p < prompt);
        let share = i.checked_sub(1).map_or(0.0, |j| self.cumulative[j].1);
        share.min(SHARE_MAX)
    }

    /// How many times its own prefill time a prompt of `prompt` tokens takes beside them.
    pub fn stretch(&self, prompt: usize) -> f64 {
        1.0 / (1.0 - self.share_below(prompt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_gets_what_the_shorter_arrivals_leave() {
        // A minute of 0.9 req/s of 256-token prompts (0.13 s each) and three 4K ones (4.3 s).
        let mut grants = vec![(256, 0.13); 54];
        grants.extend([(4096, 4.3); 3]);
        let p = Preemption::new(grants, 60.0);
        // An 8K prompt yields to both: ρ = (54 × 0.13 + 3 × 4.3) / 60 = 0.332.
        let rho = (54.0 * 0.13 + 3.0 * 4.3) / 60.0;
        assert!((p.share_below(8192) - rho).abs() < 1e-9);
        assert!((p.stretch(8192) - 1.0 / (1.0 - rho)).abs() < 1e-9);
        // A 4K prompt to the short ones only; a 256-token one to none (equals do not preempt).
        assert!((p.share_below(4096) - 54.0 * 0.13 / 60.0).abs() < 1e-9);
        assert_eq!(p.stretch(256), 1.0);
        assert_eq!(p.stretch(100), 1.0);
    }

    #[test]
    fn nothing_recent_or_a_flood_stays_bounded() {
        assert_eq!(Preemption::NONE.stretch(8192), 1.0);
        assert_eq!(Preemption::new([], 60.0).stretch(8192), 1.0);
        // Garbage in (no window, no time, not a number) preempts nothing.
        assert_eq!(Preemption::new([(256, 1.0)], 0.0).stretch(8192), 1.0);
        assert_eq!(
            Preemption::new([(256, f64::NAN), (256, -1.0)], 60.0).stretch(8192),
            1.0
        );
        // More shorter work than the upstream can do: ten times, not forever.
        let flood = Preemption::new(vec![(256, 1.0); 120], 60.0);
        assert_eq!(flood.share_below(8192), SHARE_MAX);
        assert!((flood.stretch(8192) - 10.0).abs() < 1e-9);
    }
}
