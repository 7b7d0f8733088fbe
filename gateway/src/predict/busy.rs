//! Stopwatches over the upstream's work as the gateway sees it: how long some prefill was
//! running (the time a decode observation must leave out), and how long some request was
//! decoding (the share of a prefill spent beside decodes, which slows it).
//!
//! The bundled engine (like vLLM's v1 scheduler) puts the running decodes and a prefill chunk
//! in the same step, so while a prompt prefills, every decode step takes as long as the
//! chunk. The simulation ([`super::simulate`]) counts that time once, as the prefill's; a
//! stream that decoded beside a prefill would count it again in its mean step and make every
//! full upstream look slower than it is. So the decode fit sees only the time, and the tokens,
//! outside any prefill; the time and the tokens beside one give the gap there
//! ([`super::CostModel::decode_beside_prefill`]), at which the simulation lets decodes go on
//! through a prefill.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::preempt::Preemption;

/// How far back [`BusyClock::recent_share`] looks: its weights halve every
/// `RECENT × ln 2` (about 21 s). Long enough to hold several short requests' decodes (a few
/// seconds each), short enough to follow a change of load within a minute.
const RECENT: Duration = Duration::from_secs(30);

/// A stopwatch that runs while the upstream is busy with something (some prefill in flight,
/// some request decoding), and the share of recent time it ran.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BusyClock {
    since: Option<Instant>,
    total: Duration,
    /// The share of recent time busy ([`RECENT`]), as of `share_at`.
    share: f64,
    share_at: Option<Instant>,
}

impl BusyClock {
    /// Whether it is busy from `now` on.
    pub fn set(&mut self, busy: bool, now: Instant) {
        self.share = self.recent_share(now);
        self.share_at = Some(now);
        match (busy, self.since) {
            (true, None) => self.since = Some(now),
            (false, Some(since)) => {
                self.total += now.saturating_duration_since(since);
                self.since = None;
            }
            _ => {}
        }
    }

    /// Whether it is busy.
    pub fn busy(&self) -> bool {
        self.since.is_some()
    }

    /// The share of recent time (0–1) it was busy, each instant weighted by
    /// `exp(−age / RECENT)`; 0 before it was ever set (nothing seen: nothing assumed).
    pub fn recent_share(&self, now: Instant) -> f64 {
        let Some(at) = self.share_at else {
            return 0.0;
        };
        let age = now.saturating_duration_since(at).as_secs_f64();
        let keep = (-age / RECENT.as_secs_f64()).exp();
        let now_busy = if self.busy() { 1.0 } else { 0.0 };
        self.share * keep + now_busy * (1.0 - keep)
    }

    /// Busy time so far; the difference of two readings is the busy time between them.
    pub fn reading(&self, now: Instant) -> Duration {
        self.total
            + self
                .since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }
}

/// How far back [`RecentGrants`] counts.
const GRANTS_WINDOW: Duration = Duration::from_secs(60);

/// What a grant `age` old counts for in the last minute's arrival rate: `exp(−age / RECENT)`,
/// as the recent share fades, scaled so that a steady stream counts as many as it brought in
/// the minute (a grant just now counts 2.3, one a minute old 0.3). Counted flat over the minute
/// (until 2026-12-07), the tail of a burst that had ended 50 s before still read as a sixth of
/// its rate: on model 167 a lone 8K prompt, 50 s after two minutes of short traffic, was
/// predicted to run beside decodes for 74% of its prefill on an idle upstream, and refused; now
/// it is admitted (told 7.1 s, first token at 6.0 s).
pub(crate) fn weight(age: Duration) -> f64 {
    let (tau, window) = (RECENT.as_secs_f64(), GRANTS_WINDOW.as_secs_f64());
    (-age.as_secs_f64() / tau).exp() * window / (tau * (1.0 - (-window / tau).exp()))
}

/// A request granted, as [`RecentGrants`] keeps it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grant {
    pub at: Instant,
    /// Admission's id for it.
    pub id: u64,
    pub prompt: usize,
    /// The output it is expected to decode.
    pub output: f64,
}

/// The requests granted over the last minute: how much decoding, and how much prefill of each
/// length, the arrivals bring.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecentGrants {
    list: VecDeque<Grant>,
}

impl RecentGrants {
    /// A request granted (at `grant.at`, the latest so far).
    pub fn push(&mut self, grant: Grant) {
        let now = grant.at;
        while self
            .list
            .front()
            .is_some_and(|g| now.saturating_duration_since(g.at) > GRANTS_WINDOW)
        {
            self.list.pop_front();
        }
        self.list.push_back(grant);
    }

    /// The grants of the last minute as of `now`, each with its [`weight`].
    fn within(&self, now: Instant) -> impl Iterator<Item = (&Grant, f64)> {
        self.list.iter().filter_map(move |g| {
            let age = now.saturating_duration_since(g.at);
            (age <= GRANTS_WINDOW).then(|| (g, weight(age)))
        })
    }

    /// The mean number of requests decoding at once (`λ·D`) if requests keep arriving at the
    /// last minute's rate `λ` (recent grants weighing more) and each decodes its expected output
    /// `gap` seconds a token (`D`).
    pub fn decoding_at_once(&self, now: Instant, gap: f64) -> f64 {
        let outputs: f64 = self.within(now).map(|(g, w)| w * g.output).sum();
        outputs * gap / GRANTS_WINDOW.as_secs_f64()
    }

    /// The prefill load of the last minute's grants by prompt length, for a prediction of
    /// what later arrivals take from a long prefill ([`Preemption`]): each grant at
    /// `prefill(prompt)` seconds, leaving out those for which `present` holds (requests still
    /// in prefill, which the prediction plays out as they are).
    pub fn preemption(
        &self,
        now: Instant,
        present: impl Fn(u64) -> bool,
        prefill: impl Fn(usize) -> f64,
    ) -> Preemption {
        let load = self
            .within(now)
            .filter(|(g, _)| !present(g.id))
            .map(|(g, w)| (g.prompt, w * prefill(g.prompt)));
        Preemption::new(load, GRANTS_WINDOW.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn counts_only_the_time_some_prefill_runs() {
        let mut c = BusyClock::default();
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

    /// A grant expected to decode 64 tokens.
    fn grant(at: Instant, id: u64, prompt: usize) -> Grant {
        Grant {
            at,
            id,
            prompt,
            output: 64.0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn recent_grants_say_how_many_would_decode_at_once() {
        let mut g = RecentGrants::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(g.decoding_at_once(at(0), 0.1), 0.0);
        // 0.2 req/s for five minutes, 64 tokens each at 0.15 s: 0.2 × 9.6 s ≈ 1.9 at once.
        for i in 0..60 {
            g.push(grant(at(5 * i), i, 256));
        }
        // Over the phases of the stream (the latest grant 0-4 s old), on average.
        let load = (295..300)
            .map(|s| g.decoding_at_once(at(s), 0.15))
            .sum::<f64>()
            / 5.0;
        assert!((load - 1.92).abs() < 0.05, "{load}");
        // Only the last minute is kept.
        assert!(g.list.len() <= 13, "{}", g.list.len());
        // 50 s after the stream stopped, under a tenth of it (its last three grants, flat, made
        // a quarter); a minute and more with none: none.
        let after = g.decoding_at_once(at(345), 0.15);
        assert!(after < 0.1 * load, "{after}");
        assert_eq!(g.decoding_at_once(at(400), 0.15), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn recent_grants_say_what_prefill_load_comes_below_a_prompt() {
        let mut g = RecentGrants::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // A minute of one 256-token prompt every 2 s, and one 4K prompt, still in prefill.
        for i in 0..30 {
            g.push(grant(at(2 * i), i, 256));
        }
        g.push(grant(at(59), 99, 4096));
        let cost = |p: usize| p as f64 / 2000.0;
        // Each grant's prefill seconds at its weight, over the minute.
        let load = |now: u64, grants: &[(u64, f64)]| {
            grants
                .iter()
                .filter(|(t, _)| now - t <= 60)
                .map(|(t, s)| s * weight(Duration::from_secs(now - t)))
                .sum::<f64>()
                / 60.0
        };
        let short: Vec<(u64, f64)> = (0..30).map(|i| (2 * i, 0.128)).collect();
        let both: Vec<(u64, f64)> = short.iter().copied().chain([(59, 2.048)]).collect();
        // 30 prompts of 0.128 s in 60 s below an 8K prompt, about 0.064 of the upstream; the 4K
        // one is present, so left out.
        let p = g.preemption(at(59), |id| id == 99, cost);
        assert!((p.share_below(8192) - load(59, &short)).abs() < 1e-9);
        assert!((p.share_below(8192) - 30.0 * 0.128 / 60.0).abs() < 0.01);
        // Once past its prefill, it counts.
        let p = g.preemption(at(59), |_| false, cost);
        assert!((p.share_below(8192) - load(59, &both)).abs() < 1e-9);
        // What is more than a minute old does not.
        let p = g.preemption(at(100), |_| false, cost);
        assert!((p.share_below(8192) - load(100, &both)).abs() < 1e-9);
        assert!(load(100, &both) < load(59, &both));
    }

    #[tokio::test(start_paused = true)]
    async fn the_recent_share_follows_how_much_of_the_last_half_minute_was_busy() {
        let mut c = BusyClock::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(c.recent_share(at(0)), 0.0);
        c.set(false, at(0));
        assert_eq!(c.recent_share(at(100)), 0.0);
        // Busy from then on: after one time constant the share is 1 − 1/e.
        c.set(true, at(100));
        let one = c.recent_share(at(130));
        assert!((one - (1.0 - (-1.0f64).exp())).abs() < 1e-9, "{one}");
        // Busy 4 s in every 5 for ten minutes: about 0.8, whatever the phase.
        for i in 0..120 {
            c.set(true, at(200 + 5 * i));
            c.set(false, at(204 + 5 * i));
        }
        let share = c.recent_share(at(800));
        assert!((share - 0.8).abs() < 0.05, "{share}");
        // Idle for a minute: it fades.
        assert!(c.recent_share(at(860)) < 0.15);
        // Reading it changes nothing.
        assert_eq!(c.recent_share(at(860)), c.recent_share(at(860)));
    }
}
