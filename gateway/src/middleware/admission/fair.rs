//! Fairness between a class's tenants, by tokens: a virtual token counter per tenant (VTC,
//! Sheng et al., OSDI '24). A tenant's counter grows by the prompt tokens of each request it is
//! granted and by `fair_output_weight` per output token it is served; a class's waiters are
//! granted the least-served tenant's first. A tenant that comes back after being idle starts at
//! the lowest counter among the tenants waiting or running, or, when none is (the class is
//! idle), at the highest counter of the class: where the class left off when it went idle, since
//! only a tenant waiting or running is ever charged. Idling banks no credit either way: before
//! 2026-12-04, a tenant arriving in an idle class kept its old counter, so one that had been away
//! while another was served alone was preferred to it for as long as it kept a request queued.
//!
//! Slots are held for a whole response, so ordering alone cannot help a tenant that arrives
//! when another holds them all: while another tenant of the class was seen in the last
//! [`PRESENT_FOR`], no tenant holds more than `active_max` less one slot per other tenant (at least one)
//! or more than half the prefill budget (work-conserving otherwise: a tenant alone may use everything).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::Class;

/// How long a tenant counts as present in its class after it was last seen there.
pub const PRESENT_FOR: Duration = Duration::from_secs(30);

/// The counters, per class and tenant, and when each was last seen.
#[derive(Debug, Default)]
pub(super) struct Fairness {
    counters: HashMap<(Class, String), f64>,
    seen: HashMap<(Class, String), Instant>,
}

impl Fairness {
    /// `tenant` arrived in `class` now.
    pub fn seen(&mut self, class: Class, tenant: &str) {
        self.seen.insert((class, tenant.to_owned()), Instant::now());
    }

    /// How many tenants other than `tenant` were seen in `class` within [`PRESENT_FOR`]:
    /// `tenant` leaves each of them a slot, and them all half the prefill budget.
    pub fn others_present(&self, class: Class, tenant: &str) -> usize {
        let now = Instant::now();
        self.seen
            .iter()
            .filter(|((c, t), at)| {
                *c == class && t != tenant && now.saturating_duration_since(**at) <= PRESENT_FOR
            })
            .count()
    }

    /// Whether `tenant` was seen in `class` within [`PRESENT_FOR`].
    pub fn present(&self, class: Class, tenant: &str) -> bool {
        self.seen
            .get(&(class, tenant.to_owned()))
            .is_some_and(|at| Instant::now().saturating_duration_since(*at) <= PRESENT_FOR)
    }

    /// The counter of `tenant` in `class` (0 for one never seen).
    pub fn counter(&self, class: Class, tenant: &str) -> f64 {
        self.counters
            .get(&(class, tenant.to_owned()))
            .copied()
            .unwrap_or(0.0)
    }

    /// `tenant` starts being backlogged in `class` while `active` tenants (waiting or running
    /// there) are: it is lifted to their lowest counter; with none, to [`Self::idle_floor`].
    pub fn lift<'a>(&mut self, class: Class, tenant: &str, active: impl Iterator<Item = &'a str>) {
        let floor = active
            .map(|t| self.counter(class, t))
            .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.min(c))))
            .unwrap_or_else(|| self.idle_floor(class));
        let c = self
            .counters
            .entry((class, tenant.to_owned()))
            .or_insert(0.0);
        *c = c.max(floor);
    }

    /// Where `class` left off when it last went idle: the highest counter in it. Counters grow
    /// only while their tenant waits or runs, so none has moved since. (VTC takes the counter of
    /// the last tenant to leave; the highest needs no record of who that was, and is never
    /// below it.)
    fn idle_floor(&self, class: Class) -> f64 {
        self.counters
            .iter()
            .filter(|((c, _), _)| *c == class)
            .map(|(_, v)| *v)
            .fold(0.0, f64::max)
    }

    /// `tenant` was served `tokens` (prompt tokens, or weighted output tokens).
    pub fn charge(&mut self, class: Class, tenant: &str, tokens: f64) {
        *self
            .counters
            .entry((class, tenant.to_owned()))
            .or_insert(0.0) += tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returning_tenant_is_lifted_to_the_active_floor() {
        let mut f = Fairness::default();
        f.charge(Class::Interactive, "a", 5000.0);
        f.charge(Class::Interactive, "b", 3000.0);
        f.lift(Class::Interactive, "c", ["a", "b"].into_iter());
        assert_eq!(f.counter(Class::Interactive, "c"), 3000.0);
        // Lifting never lowers, and classes are apart.
        f.lift(Class::Interactive, "a", ["b"].into_iter());
        assert_eq!(f.counter(Class::Interactive, "a"), 5000.0);
        assert_eq!(f.counter(Class::Batch, "a"), 0.0);
        f.lift(Class::Batch, "z", std::iter::empty());
        assert_eq!(f.counter(Class::Batch, "z"), 0.0);
    }

    #[test]
    fn a_tenant_arriving_in_an_idle_class_starts_where_it_left_off() {
        let mut f = Fairness::default();
        f.charge(Class::Interactive, "a", 200_000.0);
        f.charge(Class::Interactive, "b", 150_000.0);
        f.charge(Class::Batch, "z", 9e9);
        // Nobody waits or runs: "c" (never seen) and "b" start at the class's highest counter.
        f.lift(Class::Interactive, "c", std::iter::empty());
        assert_eq!(f.counter(Class::Interactive, "c"), 200_000.0);
        f.lift(Class::Interactive, "b", std::iter::empty());
        assert_eq!(f.counter(Class::Interactive, "b"), 200_000.0);
        // Never lowered.
        f.charge(Class::Interactive, "c", 1.0);
        f.lift(Class::Interactive, "c", std::iter::empty());
        assert_eq!(f.counter(Class::Interactive, "c"), 200_001.0);
    }
}
