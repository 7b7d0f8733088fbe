//! What each tenant asked and was served: requests by outcome, prompt tokens sent upstream and
//! completion tokens received, per tenant of the policy. Only authenticated requests count, so
//! the label's values are the policy's tenant names (the operator's, not a client's); an open
//! gateway has none. A tenant a reload removed keeps its counters until the process restarts,
//! as counters should.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

use sluice_engine::prom::{escape, header as help};

use super::outcome::Outcome;

/// One tenant's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests that ended, by outcome (in [`Outcome::ALL`]'s order).
    pub requests: [u64; Outcome::ALL.len()],
    /// Prompt tokens of the requests sent upstream.
    pub prompt_tokens: u64,
    /// Completion tokens of the responses, from their usage.
    pub completion_tokens: u64,
}

/// The counters of every tenant seen.
#[derive(Debug, Default)]
pub struct TenantUsage(Mutex<BTreeMap<String, Usage>>);

impl TenantUsage {
    /// A request of `tenant` ended with `outcome`; `prompt_sent` are its prompt tokens if it
    /// was sent upstream, `completion` its completion tokens if the response said.
    pub fn ended(
        &self,
        tenant: &str,
        outcome: Outcome,
        prompt_sent: Option<usize>,
        completion: Option<u64>,
    ) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Found without allocating (a policy has a few tenants).
        let usage = match map.get_mut(tenant) {
            Some(u) => u,
            None => map.entry(tenant.to_owned()).or_default(),
        };
        let i = Outcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .expect("every outcome is in ALL");
        usage.requests[i] += 1;
        usage.prompt_tokens += prompt_sent.unwrap_or(0) as u64;
        usage.completion_tokens += completion.unwrap_or(0);
    }

    /// `tenant`'s counters so far.
    pub fn of(&self, tenant: &str) -> Option<Usage> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(tenant).copied()
    }

    /// `sluice_tenant_requests_total{tenant,outcome}` (every outcome of a tenant seen, zeros
    /// included, so that rates start from its first request), and the two token counters.
    pub fn render(&self, out: &mut String) {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        help(
            out,
            "sluice_tenant_requests_total",
            "Requests of each tenant of the policy that ended, by outcome (authenticated requests only).",
            "counter",
        );
        for (tenant, usage) in map.iter() {
            let tenant = escape(tenant);
            for (outcome, n) in Outcome::ALL.iter().zip(usage.requests) {
                let outcome = outcome.as_str();
                let _ = writeln!(
                    out,
                    "sluice_tenant_requests_total{{tenant=\"{tenant}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        let tokens = [
            (
                "sluice_tenant_prompt_tokens_total",
                "Prompt tokens of each tenant's requests sent upstream (counted on arrival).",
                (|u: &Usage| u.prompt_tokens) as fn(&Usage) -> u64,
            ),
            (
                "sluice_tenant_completion_tokens_total",
                "Completion tokens of each tenant's responses, from their usage.",
                |u: &Usage| u.completion_tokens,
            ),
        ];
        for (name, text, value) in tokens {
            help(out, name, text, "counter");
            for (tenant, usage) in map.iter() {
                let tenant = escape(tenant);
                let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {}", value(usage));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Outcome, TenantUsage};

    #[test]
    fn each_tenant_counts_its_outcomes_and_the_tokens_it_was_served() {
        let t = TenantUsage::default();
        t.ended("alice", Outcome::Ok, Some(812), Some(64));
        t.ended("alice", Outcome::Shed, None, None);
        t.ended("bob \"the\" builder", Outcome::Timeout, None, None);
        t.ended("alice", Outcome::Ok, Some(100), Some(6));
        let alice = t.of("alice").expect("seen");
        assert_eq!(alice.requests, [2, 0, 1, 0, 0, 0]);
        assert_eq!((alice.prompt_tokens, alice.completion_tokens), (912, 70));
        let mut text = String::new();
        t.render(&mut text);
        for line in [
            "# TYPE sluice_tenant_requests_total counter\n",
            "sluice_tenant_requests_total{tenant=\"alice\",outcome=\"ok\"} 2\n",
            "sluice_tenant_requests_total{tenant=\"alice\",outcome=\"cancelled\"} 0\n",
            "sluice_tenant_requests_total{tenant=\"bob \\\"the\\\" builder\",outcome=\"timeout\"} 1\n",
            "sluice_tenant_prompt_tokens_total{tenant=\"alice\"} 912\n",
            "sluice_tenant_completion_tokens_total{tenant=\"alice\"} 70\n",
            "sluice_tenant_completion_tokens_total{tenant=\"bob \\\"the\\\" builder\"} 0\n",
        ] {
            assert!(text.contains(line), "{text} lacks {line}");
        }
    }
}
