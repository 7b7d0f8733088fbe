//! Fairness between a class's tenants, by tokens: a virtual token counter per tenant (VTC,
//! Sheng et al., OSDI '24). A tenant's counter grows by the prompt tokens of each request it is
//! granted and by `fair_output_weight` per output token it is served; a class's waiters are
//! granted the least-served tenant's first. A tenant that comes back after being idle starts at
//! the lowest counter among the tenants waiting or running, so idling banks no credit.
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
    /// there) are: it is lifted to their lowest counter.
    pub fn lift<'a>(&mut self, class: Class, tenant: &str, active: impl Iterator<Item = &'a str>) {
        let floor = active
            .map(|t| self.counter(class, t))
            .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.min(c))));
        if let Some(floor) = floor {
            let c = self
                .counters
                .entry((class, tenant.to_owned()))
                .or_insert(0.0);
            *c = c.max(floor);
        }
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
}
