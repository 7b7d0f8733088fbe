//! The gateway's counters and histograms, and `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use sluice_engine::http::ConnectionLimit;
use sluice_engine::prom::{escape, header as help, Histogram};

use super::outcome::Outcome;
use super::tenants::TenantUsage;
use crate::bundled::RankStatus;
use crate::middleware::admission::{PredictionView, Snapshot};
use crate::policy::{Class, LoadedPolicy};

/// Queue-wait buckets (seconds): from instant admission to past the 60 s default wait limit.
const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0,
    300.0,
];
/// Duration buckets (seconds): vLLM's end-to-end buckets, from milliseconds to half an hour.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
];
/// Time-to-first-token buckets (seconds): vLLM's.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0,
];
/// Token-count buckets: short agent calls to the 12,288-token window.
const TOKEN_BUCKETS: &[f64] = &[
    16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 6144.0, 8192.0, 12288.0, 16384.0,
];

/// Relative prediction-error buckets: within 5% to five times off.
const ERROR_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0];

/// The labels of `sluice_requests_total`.
type OutcomeKey = (Outcome, String, Class);

/// Everything the gateway counts.
#[derive(Debug)]
pub struct Metrics {
    accepted: AtomicU64,
    outcomes: Mutex<BTreeMap<OutcomeKey, u64>>,
    reload_ok: AtomicU64,
    reload_error: AtomicU64,
    /// Arrival at admission → slot granted (or the wait ended otherwise).
    pub queue_wait: Histogram,
    /// Arrival → the response's first body byte (the first token of a stream).
    pub time_to_first_token: Histogram,
    /// Arrival → the response's last byte, as the client sees it.
    pub request_duration: Histogram,
    /// Sent upstream (slot granted) → the response's last byte: compute, not waiting.
    pub upstream_duration: Histogram,
    /// Prompt tokens per request, counted on arrival.
    pub input_tokens: Histogram,
    /// Completion tokens per request, from the response's usage.
    pub output_tokens: Histogram,
    /// |predicted − actual| / actual time to first token of each admitted stream.
    pub ttft_prediction_error: Histogram,
    /// Each tenant's requests and tokens (not in [`Metrics::render`]: shown only to a scrape
    /// that may read tenants' names, see `routes.rs`).
    pub tenants: TenantUsage,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            accepted: AtomicU64::new(0),
            outcomes: Mutex::default(),
            reload_ok: AtomicU64::new(0),
            reload_error: AtomicU64::new(0),
            queue_wait: Histogram::new(WAIT_BUCKETS),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            request_duration: Histogram::new(DURATION_BUCKETS),
            upstream_duration: Histogram::new(DURATION_BUCKETS),
            input_tokens: Histogram::new(TOKEN_BUCKETS),
            output_tokens: Histogram::new(TOKEN_BUCKETS),
            ttft_prediction_error: Histogram::new(ERROR_BUCKETS),
            tenants: TenantUsage::default(),
        }
    }
}

impl Metrics {
    /// A request entered the stack.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// A request ended with `outcome`; `code` is its error code (`"none"` for none).
    pub fn ended(&self, outcome: Outcome, code: &str, class: Class) {
        let mut map = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        // Found without building a key (the map holds a few dozen label sets).
        let seen = map
            .iter_mut()
            .find(|((o, c, k), _)| *o == outcome && c == code && *k == class);
        if let Some((_, n)) = seen {
            *n += 1;
            return;
        }
        map.insert((outcome, code.to_owned(), class), 1);
    }

    /// Requests accepted so far.
    pub fn accepted_total(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Requests that ended with `outcome` so far, whatever their code and class.
    pub fn outcome_total(&self, outcome: Outcome) -> u64 {
        let map = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        map.iter()
            .filter(|((o, _, _), _)| *o == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    /// A policy reload was applied (`ok`) or refused.
    pub fn policy_reload(&self, ok: bool) {
        let c = if ok {
            &self.reload_ok
        } else {
            &self.reload_error
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text of these metrics, the admission state and the engine's ranks.
    pub fn render(&self, admission: &Snapshot, ranks: &[RankStatus]) -> String {
        let mut out = String::new();
        counter(
            &mut out,
            "sluice_requests_accepted_total",
            "Requests that entered the gateway's stack.",
            self.accepted_total(),
        );
        help(
            &mut out,
            "sluice_requests_total",
            "Requests that ended, by outcome, error code and class (accepted = the sum at any quiet moment).",
            "counter",
        );
        {
            let map = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
            for ((o, code, class), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "sluice_requests_total{{outcome=\"{}\",code=\"{}\",class=\"{}\"}} {n}",
                    o.as_str(),
                    escape(code),
                    class.as_str()
                );
            }
        }
        help(
            &mut out,
            "sluice_policy_reloads_total",
            "Policy reloads, by result.",
            "counter",
        );
        let _ = writeln!(
            out,
            "sluice_policy_reloads_total{{result=\"ok\"}} {}",
            self.reload_ok.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "sluice_policy_reloads_total{{result=\"error\"}} {}",
            self.reload_error.load(Ordering::Relaxed)
        );
        let histograms = [
            (
                &self.queue_wait,
                "sluice_queue_wait_seconds",
                "Time from arrival at admission until a slot was granted or the wait ended.",
            ),
            (
                &self.time_to_first_token,
                "sluice_time_to_first_token_seconds",
                "Time from arrival to the response's first body byte.",
            ),
            (
                &self.request_duration,
                "sluice_request_duration_seconds",
                "Time from arrival to the response's last byte (waiting included).",
            ),
            (
                &self.upstream_duration,
                "sluice_upstream_duration_seconds",
                "Time from sending upstream to the response's last byte (computing only).",
            ),
            (
                &self.input_tokens,
                "sluice_input_tokens",
                "Prompt tokens per request, counted on arrival.",
            ),
            (
                &self.output_tokens,
                "sluice_output_tokens",
                "Completion tokens per request, from the response's usage.",
            ),
            (
                &self.ttft_prediction_error,
                "sluice_ttft_prediction_error_ratio",
                "|predicted - actual| / actual time to first token of each admitted stream.",
            ),
        ];
        for (h, name, text) in histograms {
            h.render(&mut out, name, text, "");
        }
        let gauges = [
            (
                "sluice_active_requests",
                "Requests holding an upstream slot.",
                admission.active,
            ),
            (
                "sluice_active_heavy_requests",
                "Heavy-input requests holding a slot.",
                admission.heavy_active,
            ),
            (
                "sluice_active_max",
                "The admission ceiling in force.",
                admission.active_max,
            ),
            (
                "sluice_queue_depth_max",
                "The queue bound in force.",
                admission.queue_depth,
            ),
            (
                "sluice_prefill_tokens_in_flight",
                "Prompt tokens admitted and not yet past their prefill.",
                admission.prefill_tokens,
            ),
            (
                "sluice_prefill_tokens_max",
                "The prefill-token budget in force.",
                admission.prefill_tokens_max,
            ),
            (
                "sluice_admission_holds",
                "Requests told to come back (deadline_unmeetable) whose room the prediction holds.",
                admission.holds,
            ),
        ];
        gauges_of(&mut out, &gauges);
        help(
            &mut out,
            "sluice_queue_depth",
            "Requests waiting for a slot, by class.",
            "gauge",
        );
        let _ = writeln!(
            out,
            "sluice_queue_depth{{class=\"interactive\"}} {}",
            admission.queued_interactive
        );
        let _ = writeln!(
            out,
            "sluice_queue_depth{{class=\"batch\"}} {}",
            admission.queued_batch
        );
        render_ranks(&mut out, ranks);
        out
    }
}

/// The cost model's coefficients (seconds) and the median prediction error.
pub fn render_prediction(out: &mut String, p: &PredictionView) {
    use crate::predict::{DECODE_TERMS, PREFILL_TERMS};
    help(
        out,
        "sluice_cost_model_seconds",
        "The upstream cost model's coefficients (docs/policy.md): prefill time and decode step time terms.",
        "gauge",
    );
    let terms = PREFILL_TERMS
        .iter()
        .zip(p.parameters.prefill)
        .map(|(t, v)| ("prefill", t, v))
        .chain(
            DECODE_TERMS
                .iter()
                .zip(p.parameters.decode)
                .map(|(t, v)| ("decode", t, v)),
        );
    // Unseen until a stream decodes beside a prefill: NaN, as the median error with none.
    let beside = p.parameters.decode_beside_prefill.unwrap_or(f64::NAN);
    let terms = terms.chain([("decode", &"per_token_beside_prefill", beside)]);
    for (model, term, v) in terms {
        let _ = writeln!(
            out,
            "sluice_cost_model_seconds{{model=\"{model}\",term=\"{term}\"}} {v}"
        );
    }
    help(
        out,
        "sluice_cost_model_observations_total",
        "Streams the cost model was refitted from.",
        "counter",
    );
    for (model, n) in [
        ("prefill", p.parameters.prefill_observations),
        ("decode", p.parameters.decode_observations),
        (
            "decode_beside_prefill",
            p.parameters.decode_beside_prefill_observations,
        ),
    ] {
        let _ = writeln!(
            out,
            "sluice_cost_model_observations_total{{model=\"{model}\"}} {n}"
        );
    }
    help(
        out,
        "sluice_ttft_prediction_median_error_ratio",
        "Median of (predicted - actual) / actual time to first token over the last 5 minutes (NaN: none).",
        "gauge",
    );
    let _ = writeln!(
        out,
        "sluice_ttft_prediction_median_error_ratio {}",
        p.median_error.unwrap_or(f64::NAN)
    );
    help(
        out,
        "sluice_output_share",
        "Output tokens generated as a share of max_tokens, recent streams' average (the prediction's expected output).",
        "gauge",
    );
    let _ = writeln!(out, "sluice_output_share {}", p.output_share);
}

/// Gauges of the policy in force: whether it runs open (no key asked), how many of the file's
/// keys wait for a restart, and how many access changes its reload made.
pub fn render_policy(out: &mut String, loaded: &LoadedPolicy) {
    let gauges = [
        (
            "sluice_policy_open",
            "Whether the policy in force asks no API key (no [[tenants]]): 1, else 0.",
            u64::from(loaded.policy.tenants.is_empty()),
        ),
        (
            "sluice_policy_restart_pending",
            "Keys of the policy file that changed but need a restart (held at their running values).",
            loaded.restart_pending.len() as u64,
        ),
        (
            "sluice_policy_access_changes",
            "Changes in who may call and how much that the reload in force made (tenants, keys, classes, limits, the admin key, server.open; listed by /admin/policy).",
            loaded.access_changes.len() as u64,
        ),
    ];
    gauges_of(out, &gauges);
}

/// Unlabelled gauges: (name, help, value).
fn gauges_of<V: std::fmt::Display>(out: &mut String, gauges: &[(&str, &str, V)]) {
    for (name, text, v) in gauges {
        help(out, name, text, "gauge");
        let _ = writeln!(out, "{name} {v}");
    }
}

/// One listener's connection metrics: their names (written out, so that a name can be found
/// in the code), what they count, and the key that sets its limit.
struct ListenerMetrics {
    open: &'static str,
    max: &'static str,
    waits: &'static str,
    what: &'static str,
    limit: &'static str,
}

const CLIENT_LISTENER: ListenerMetrics = ListenerMetrics {
    open: "sluice_connections_open",
    max: "sluice_connections_max",
    waits: "sluice_connections_limit_waits_total",
    what: "Client connections",
    limit: "server.max_connections",
};

const PROBE_LISTENER: ListenerMetrics = ListenerMetrics {
    open: "sluice_probe_connections_open",
    max: "sluice_probe_connections_max",
    waits: "sluice_probe_connections_limit_waits_total",
    what: "Connections to the probe listener (server.probe_listen)",
    limit: "fixed",
};

/// The listener's client connections against `server.max_connections`, and the probe
/// listener's against its own limit when `server.probe_listen` is set.
pub fn render_connections(
    out: &mut String,
    clients: &ConnectionLimit,
    probes: Option<&ConnectionLimit>,
) {
    render_listener(out, &CLIENT_LISTENER, clients);
    if let Some(probes) = probes {
        render_listener(out, &PROBE_LISTENER, probes);
    }
}

fn render_listener(out: &mut String, names: &ListenerMetrics, limit: &ConnectionLimit) {
    let what = names.what;
    let open_help = format!("{what} being served now.");
    let max_help = format!(
        "{what} served at once ({}); past it new ones wait in the listen backlog.",
        names.limit
    );
    let gauges = [
        (names.open, open_help.as_str(), limit.open() as u64),
        (names.max, max_help.as_str(), limit.max() as u64),
    ];
    gauges_of(out, &gauges);
    counter(
        out,
        names.waits,
        "Accepted connections that waited for another to close (the limit reached).",
        limit.waited(),
    );
}

/// TLS handshakes that never completed, by why: `refused` (an error: not TLS, a version or
/// suite not offered, the client gone) and `timeout` (not done within
/// [`crate::server::HANDSHAKE_TIMEOUT`]). Timeouts rising with load, not with scanners, mean
/// the gateway itself was too slow to finish handshakes.
pub fn render_failed_handshakes(out: &mut String, failed: &crate::server::FailedHandshakes) {
    let name = "sluice_tls_handshakes_failed_total";
    help(
        out,
        name,
        "TLS handshakes that never completed, by reason (refused: an error; timeout: not done in time).",
        "counter",
    );
    let _ = writeln!(out, "{name}{{reason=\"refused\"}} {}", failed.refused());
    let _ = writeln!(out, "{name}{{reason=\"timeout\"}} {}", failed.timed_out());
}

/// The state shared with the deployment's other gateways through Redis (`[shared]`).
pub fn render_shared(out: &mut String, s: &crate::shared::Report) {
    let gauges = [
        (
            "sluice_shared_state_up",
            "Whether the shared state (Redis) is in use: 1; 0 while [shared] fail decides instead.",
            u64::from(s.up),
        ),
        (
            "sluice_shared_state_fail_closed",
            "Whether [shared] fail = \"closed\" (requests refused while Redis is away): 1, else 0.",
            u64::from(s.fail_closed),
        ),
        (
            "sluice_shared_leases",
            "Slots of the shared ceiling this gateway holds.",
            s.leases as u64,
        ),
    ];
    gauges_of(out, &gauges);
    help(
        out,
        "sluice_shared_state_errors_total",
        "Redis calls that failed or took longer than shared.timeout, by operation.",
        "counter",
    );
    for (op, n) in &s.errors {
        let _ = writeln!(out, "sluice_shared_state_errors_total{{op=\"{op}\"}} {n}");
    }
    counter(
        out,
        "sluice_shared_state_degraded_total",
        "Decisions taken by [shared] fail (locally, or refused) while Redis was unavailable.",
        s.degraded,
    );
}

fn counter(out: &mut String, name: &str, text: &str, v: u64) {
    help(out, name, text, "counter");
    let _ = writeln!(out, "{name} {v}");
}

/// A per-rank gauge: name, help, value.
type RankGauge = (&'static str, &'static str, fn(&RankStatus) -> u64);

/// The engine's ranks, relayed from its `/health`.
fn render_ranks(out: &mut String, ranks: &[RankStatus]) {
    let gauges: [RankGauge; 3] = [
        (
            "sluice_engine_rank_up",
            "Whether the engine rank is up (1) or down (0), from its /health.",
            |r| u64::from(r.up),
        ),
        (
            "sluice_engine_kv_tokens_capacity",
            "KV-cache capacity of the engine rank, in tokens.",
            |r| r.kv_tokens_total,
        ),
        (
            "sluice_engine_kv_tokens_used",
            "KV-cache tokens in use on the engine rank.",
            |r| r.kv_tokens_used,
        ),
    ];
    for (name, text, value) in gauges {
        help(out, name, text, "gauge");
        for r in ranks {
            let _ = writeln!(out, "{name}{{rank=\"{}\"}} {}", r.rank, value(r));
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_engine::http::ConnectionLimit;

    use super::render_connections;

    #[test]
    fn the_probe_listeners_connections_are_shown_only_when_it_runs() {
        let (clients, probes) = (ConnectionLimit::new(1000), ConnectionLimit::new(32));
        let mut without = String::new();
        render_connections(&mut without, &clients, None);
        assert!(
            without.contains("sluice_connections_max 1000\n"),
            "{without}"
        );
        assert!(!without.contains("sluice_probe_"), "{without}");
        let mut with = String::new();
        render_connections(&mut with, &clients, Some(&probes));
        assert!(with.starts_with(&without), "{with}");
        for line in [
            "# TYPE sluice_probe_connections_open gauge\n",
            "sluice_probe_connections_open 0\n",
            "sluice_probe_connections_max 32\n",
            "# TYPE sluice_probe_connections_limit_waits_total counter\n",
            "sluice_probe_connections_limit_waits_total 0\n",
        ] {
            assert!(with.contains(line), "{with} lacks {line}");
        }
    }
}
