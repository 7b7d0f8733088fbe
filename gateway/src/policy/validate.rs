//! Rules across keys that types alone cannot express: ranges, consistency, uniqueness.
//!
//! Every rule names the key it is about by its path in the file (`admission.active_max`,
//! `tenants[1].api_key_sha256`), so [`super::load`] can point at its line and column. All
//! broken rules are reported at once, not only the first. `docs/policy.md` lists the rules.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use http::Uri;

use super::load::PolicyError;
use super::redact::{host_only, without_password};
use super::schema::SamplingDefaults;
use super::schema::Shared;
use super::schema::{
    Admin, Admission, Alerts, Limits, Policy, Server, Tenant, Traces, Upstream, UpstreamKind,
};

/// The most `server.max_connections` may be: far past any file-descriptor limit in use.
pub const MAX_CONNECTIONS_MAX: usize = 1_000_000;

/// The longest `admission.queue_wait_max`, `server.drain_timeout`, `server.idle_timeout` and
/// `upstream.start_timeout`.
pub const DURATION_MAX: Duration = Duration::from_secs(3600);
/// The smallest `server.body_limit_bytes`: a chat request with a short prompt must fit.
pub const BODY_LIMIT_MIN: usize = 1024;
/// The largest `admission.cost.*` coefficient, ms: an hour.
pub const COST_MS_MAX: f64 = 3_600_000.0;
/// The most gateways `shared.expected_replicas` may name: one tenant's rate divided among them
/// stays a GCRA period a `Duration` holds (`RPS_MIN / EXPECTED_REPLICAS_MAX` is one request in
/// ~12 days).
pub const EXPECTED_REPLICAS_MAX: usize = 1024;
/// The longest `admission.queue_depth`. With `predictive`, an arrival's verdict plays the whole
/// queue forward two or three times under admission's lock, and each re-check tick once, at a
/// cost that grows with the square of the queue: measured on the 2-core dev box, 6 ms an arrival
/// at 512 waiters, 55 ms at 1024 (at most ~18 arrivals a second then, all tenants together),
/// 370 ms at 4096. 1024 is twice the shipped batch example's queue.
pub const QUEUE_DEPTH_MAX: usize = 1024;
/// The largest `admission.fair_output_weight`.
pub const COST_WEIGHT_MAX: f64 = 1000.0;
/// Pipeline ranks the bundled engine can run.
pub const RANKS_MAX: usize = 30;
/// `tenants[].requests_per_second` range: one request per ~17 minutes up to a million per second
/// (outside it the GCRA period does not fit a `Duration` or rounds to zero).
pub const RPS_MIN: f64 = 0.001;
pub const RPS_MAX: f64 = 1_000_000.0;
/// The longest `alerts.window` and `alerts.repeat_interval`.
pub const ALERT_WINDOW_MAX: Duration = Duration::from_secs(24 * 3600);
/// The shortest `alerts.evaluate_every`.
pub const ALERT_EVALUATE_MIN: Duration = Duration::from_millis(100);
/// The most samples of the counters one `alerts.window` may hold (`window / evaluate_every`).
pub const ALERT_SAMPLES_MAX: u128 = 20_000;

/// `shared.lease_ttl` range: long enough to renew a lease (every third of it) through a slow
/// moment, short enough that a killed gateway's slots come back soon.
pub const LEASE_TTL_MIN: Duration = Duration::from_millis(500);
pub const LEASE_TTL_MAX: Duration = Duration::from_secs(60);
/// The longest `shared.timeout`: a request never waits longer than this on Redis.
pub const SHARED_TIMEOUT_MAX: Duration = Duration::from_secs(1);

/// One broken rule: the key it is about and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The key's path in the file: `limits.context_window`, `tenants[0].name`.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Checks `policy` whole; the error lists every broken rule, separated by `; `.
pub fn check(p: &Policy) -> Result<(), PolicyError> {
    let found = problems(p);
    if found.is_empty() {
        return Ok(());
    }
    let text: Vec<String> = found.iter().map(ToString::to_string).collect();
    Err(PolicyError::new(text.join("; ")))
}

/// Every broken rule of `policy`, in file order (empty: valid).
pub fn problems(p: &Policy) -> Vec<Problem> {
    let mut out = Problems::default();
    server(&p.server, &mut out);
    limits(&p.limits, &mut out);
    admission(&p.admission, &p.limits, &mut out);
    upstream(&p.upstream, &mut out);
    tenants(&p.tenants, &p.admin, &mut out);
    if p.server.open && !p.tenants.is_empty() {
        out.add(
            "server.open",
            format!(
                "true says the gateway runs without API keys, but [[tenants]] gives {} key(s); \
                 remove one or the other",
                p.tenants.len()
            ),
        );
    }
    alerts(&p.alerts, &mut out);
    traces(&p.traces, &mut out);
    admin(&p.admin, &mut out);
    shared(&p.shared, &mut out);
    out.0
}

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

    /// `value >= 1`, for counts where zero makes no sense.
    fn positive(&mut self, key: &str, value: usize, what: &str) {
        if value == 0 {
            self.add(key, format!("must be at least 1 ({what})"));
        }
    }

    /// `0 < value <= max` for durations (`zero_ok`: 0 allowed too).
    fn duration(&mut self, key: &str, value: Duration, max: Duration, zero_ok: bool) {
        if value.is_zero() && !zero_ok {
            self.add(key, "must be longer than 0s");
        } else if value > max {
            self.add(
                key,
                format!(
                    "{} is longer than the largest allowed, {}",
                    humantime::format_duration(value),
                    humantime::format_duration(max)
                ),
            );
        }
    }
}

fn server(s: &Server, out: &mut Problems) {
    if s.body_limit_bytes < BODY_LIMIT_MIN {
        out.add(
            "server.body_limit_bytes",
            format!(
                "{} is below the smallest allowed, {BODY_LIMIT_MIN} (1 KiB)",
                s.body_limit_bytes
            ),
        );
    }
    match (&s.tls_cert, &s.tls_key) {
        (Some(_), None) => out.add("server.tls_key", "must be set when server.tls_cert is set"),
        (None, Some(_)) => out.add("server.tls_cert", "must be set when server.tls_key is set"),
        _ => {}
    }
    for (key, path) in [
        ("server.tls_cert", &s.tls_cert),
        ("server.tls_key", &s.tls_key),
    ] {
        if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            out.add(key, "must not be empty (leave it out instead)");
        }
    }
    out.duration("server.drain_timeout", s.drain_timeout, DURATION_MAX, true);
    out.duration("server.idle_timeout", s.idle_timeout, DURATION_MAX, false);
    out.positive(
        "server.max_connections",
        s.max_connections,
        "no client could connect",
    );
    if s.max_connections > MAX_CONNECTIONS_MAX {
        out.add(
            "server.max_connections",
            format!("must be at most {MAX_CONNECTIONS_MAX} (each takes a file descriptor)"),
        );
    }
    if s.probe_listen
        .is_some_and(|p| p.port() == s.listen.port() && p.port() != 0)
    {
        out.add(
            "server.probe_listen",
            format!(
                "must not use server.listen's port, {} (the probes need a listener of their own)",
                s.listen.port()
            ),
        );
    }
}

fn limits(l: &Limits, out: &mut Problems) {
    out.positive(
        "limits.input_tokens_max",
        l.input_tokens_max,
        "no prompt would fit",
    );
    out.positive(
        "limits.context_window",
        l.context_window,
        "no request would fit",
    );
    out.positive(
        "limits.max_tokens_default",
        l.max_tokens_default,
        "a request must be able to generate",
    );
    out.positive(
        "limits.max_tokens_max",
        l.max_tokens_max,
        "a request must be able to generate",
    );
    if l.input_tokens_max > l.context_window {
        out.add(
            "limits.input_tokens_max",
            format!(
                "{} is larger than limits.context_window ({})",
                l.input_tokens_max, l.context_window
            ),
        );
    }
    if l.max_tokens_default > l.max_tokens_max {
        out.add(
            "limits.max_tokens_default",
            format!(
                "{} is larger than limits.max_tokens_max ({})",
                l.max_tokens_default, l.max_tokens_max
            ),
        );
    }
    if l.max_tokens_max >= l.context_window {
        out.add(
            "limits.max_tokens_max",
            format!(
                "{} must be smaller than limits.context_window ({}), leaving room for a prompt",
                l.max_tokens_max, l.context_window
            ),
        );
    }
}

fn admission(a: &Admission, l: &Limits, out: &mut Problems) {
    out.positive(
        "admission.active_max",
        a.active_max,
        "nothing would ever be admitted",
    );
    if a.queue_depth > QUEUE_DEPTH_MAX {
        out.add(
            "admission.queue_depth",
            format!(
                "{} is larger than the largest allowed, {QUEUE_DEPTH_MAX} (every arrival and \
                 re-check predicts the whole queue under one lock)",
                a.queue_depth
            ),
        );
    }
    out.duration(
        "admission.queue_wait_max",
        a.queue_wait_max,
        DURATION_MAX,
        false,
    );
    out.positive(
        "admission.heavy_input_tokens",
        a.heavy_input_tokens,
        "every request would be heavy",
    );
    out.positive(
        "admission.heavy_active_max",
        a.heavy_active_max,
        "heavy requests would never run",
    );
    if a.heavy_active_max > a.active_max {
        out.add(
            "admission.heavy_active_max",
            format!(
                "{} is larger than admission.active_max ({})",
                a.heavy_active_max, a.active_max
            ),
        );
    }
    for (key, d) in [
        (
            "admission.interactive_ttft_deadline",
            a.interactive_ttft_deadline,
        ),
        ("admission.batch_ttft_deadline", a.batch_ttft_deadline),
    ] {
        out.duration(key, d, DURATION_MAX, false);
    }
    out.positive(
        "admission.prefill_tokens_max",
        a.prefill_tokens_max,
        "no prompt could be prefilled beside another",
    );
    if !(a.fair_output_weight.is_finite()
        && (0.0..=COST_WEIGHT_MAX).contains(&a.fair_output_weight))
    {
        out.add(
            "admission.fair_output_weight",
            format!(
                "{} must be from 0 to {COST_WEIGHT_MAX}",
                a.fair_output_weight
            ),
        );
    }
    let c = &a.cost;
    for (key, v) in [
        ("prefill_base_ms", c.prefill_base_ms),
        ("prefill_ms_per_1k", c.prefill_ms_per_1k),
        ("prefill_ms_per_1k_squared", c.prefill_ms_per_1k_squared),
        (
            "prefill_ms_per_1k_per_10k_running",
            c.prefill_ms_per_1k_per_10k_running,
        ),
        (
            "prefill_ms_per_1k_beside_decodes",
            c.prefill_ms_per_1k_beside_decodes,
        ),
        (
            "prefill_ms_per_1k_squared_beside_decodes",
            c.prefill_ms_per_1k_squared_beside_decodes,
        ),
        ("decode_base_ms", c.decode_base_ms),
        ("decode_ms_per_seq", c.decode_ms_per_seq),
        ("decode_ms_per_10k_context", c.decode_ms_per_10k_context),
    ] {
        if !(v.is_finite() && (0.0..=COST_MS_MAX).contains(&v)) {
            out.add(
                format!("admission.cost.{key}"),
                format!("{v} must be from 0 to {COST_MS_MAX} ms (a cost is never negative)"),
            );
        }
    }
    if c.decode_base_ms + c.decode_ms_per_seq <= 0.0 {
        out.add(
            "admission.cost.decode_base_ms",
            "a decode step cannot be free: decode_base_ms or decode_ms_per_seq must be positive",
        );
    }
    if a.heavy_input_tokens > l.input_tokens_max {
        out.add(
            "admission.heavy_input_tokens",
            format!(
                "{} is larger than limits.input_tokens_max ({}), so no request could be heavy",
                a.heavy_input_tokens, l.input_tokens_max
            ),
        );
    }
}

fn upstream(u: &Upstream, out: &mut Problems) {
    match u.kind {
        UpstreamKind::Openai => {
            if u.urls.is_empty() {
                out.add("upstream.urls", "kind \"openai\" needs at least one URL");
            }
            let mut seen: HashMap<&str, usize> = HashMap::new();
            for (i, url) in u.urls.iter().enumerate() {
                let key = format!("upstream.urls[{i}]");
                if let Err(why) = base_url(url) {
                    out.add(key, why);
                } else if let Some(first) = seen.insert(url.as_str(), i) {
                    out.add(
                        key,
                        format!("{:?} repeats upstream.urls[{first}]", without_password(url)),
                    );
                }
            }
            replicas(u, out);
        }
        UpstreamKind::Bundled => {
            if !u.urls.is_empty() {
                out.add(
                    "upstream.urls",
                    "kind \"bundled\" takes no URLs (the gateway starts the engine)",
                );
            }
            if !(1..=RANKS_MAX).contains(&u.ranks) {
                out.add(
                    "upstream.ranks",
                    format!("{} is outside 1..={RANKS_MAX}", u.ranks),
                );
            }
            out.duration(
                "upstream.start_timeout",
                u.start_timeout,
                DURATION_MAX,
                false,
            );
            sampling(&u.sampling, out);
        }
    }
    if u.kind == UpstreamKind::Openai && u.sampling != SamplingDefaults::default() {
        out.add(
            "upstream.sampling",
            "only the bundled engine takes defaults from the policy (set them on the server)",
        );
    }
    out.duration("upstream.idle_timeout", u.idle_timeout, DURATION_MAX, false);
    if u.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
        out.add(
            "upstream.model",
            "must not be empty (leave it out for the upstream's own)",
        );
    }
    if u.tokenizer
        .as_ref()
        .is_some_and(|t| t.as_os_str().is_empty())
    {
        out.add(
            "upstream.tokenizer",
            "must not be empty (leave it out for the bundled model's)",
        );
    }
}

/// `[upstream.sampling]`: the ranges the engine accepts per request.
fn sampling(d: &SamplingDefaults, out: &mut Problems) {
    let ranges = [
        ("temperature", d.temperature, 0.0, 2.0, true),
        ("top_p", d.top_p, 0.0, 1.0, false),
        ("min_p", d.min_p, 0.0, 1.0, true),
        ("repetition_penalty", d.repetition_penalty, 0.0, 2.0, false),
    ];
    for (key, value, lo, hi, lo_ok) in ranges {
        let Some(v) = value else { continue };
        if !(v.is_finite() && (v > lo || (lo_ok && v == lo)) && v <= hi) {
            let open = if lo_ok { "[" } else { "(" };
            out.add(
                format!("upstream.sampling.{key}"),
                format!("{v} is outside {open}{lo}, {hi}]"),
            );
        }
    }
}

/// The replica settings of an `openai` upstream.
fn replicas(u: &Upstream, out: &mut Problems) {
    if let Some(ca) = &u.ca {
        if let Err(e) = crate::tls::root_store(ca) {
            out.add("upstream.ca", e.to_string());
        }
    }
    if let Some(var) = &u.api_key_env {
        if var.trim().is_empty() || var.contains('=') {
            out.add("upstream.api_key_env", "must name an environment variable");
        }
    }
    for (from, to) in &u.models {
        if from.trim().is_empty() || to.trim().is_empty() {
            out.add("upstream.models", "model names must not be empty");
        }
    }
    if let Some(n) = u.replica_active_max {
        out.positive(
            "upstream.replica_active_max",
            n,
            "leave it out for no per-replica limit",
        );
    }
    if !u.health_path.starts_with('/') {
        out.add("upstream.health_path", "must start with /");
    }
    let u32_positive = usize::try_from(u.eject_after).unwrap_or(usize::MAX);
    out.positive("upstream.eject_after", u32_positive, "failures in a row");
    for (key, value) in [
        ("upstream.health_interval", u.health_interval),
        ("upstream.eject_for", u.eject_for),
        ("upstream.metrics_interval", u.metrics_interval),
        ("upstream.metrics_stale_after", u.metrics_stale_after),
    ] {
        out.duration(key, value, DURATION_MAX, false);
    }
    if u.metrics_stale_after < u.metrics_interval {
        out.add(
            "upstream.metrics_stale_after",
            "must be at least upstream.metrics_interval (else every reading is stale)",
        );
    }
    let kv = u.engine_kv_usage_max;
    if !(kv.is_finite() && kv > 0.0 && kv <= 1.0) {
        out.add(
            "upstream.engine_kv_usage_max",
            format!("{kv} is outside (0, 1]"),
        );
    }
}

fn tenants(ts: &[Tenant], admin: &Admin, out: &mut Problems) {
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut keys: HashMap<&str, usize> = HashMap::new();
    for (i, t) in ts.iter().enumerate() {
        let at = |k: &str| format!("tenants[{i}].{k}");
        if t.name.trim().is_empty() {
            out.add(at("name"), "must not be empty");
        } else if let Some(first) = names.insert(t.name.as_str(), i) {
            out.add(
                at("name"),
                format!("{:?} is already the name of tenants[{first}]", t.name),
            );
        }
        if let Err(why) = sha256_hex(&t.api_key_sha256) {
            out.add(at("api_key_sha256"), why);
        } else if let Some(first) = keys.insert(t.api_key_sha256.as_str(), i) {
            out.add(
                at("api_key_sha256"),
                format!("is already the key of tenants[{first}]"),
            );
        } else if admin.api_key_sha256.as_deref() == Some(t.api_key_sha256.as_str()) {
            out.add(
                at("api_key_sha256"),
                "is the admin key (admin.api_key_sha256); give the admin its own key",
            );
        }
        if let Some(rps) = t.requests_per_second {
            if !rps.is_finite() || !(RPS_MIN..=RPS_MAX).contains(&rps) {
                out.add(
                    at("requests_per_second"),
                    format!("{rps} is outside {RPS_MIN}..={RPS_MAX} (leave it out for no limit)"),
                );
            }
        }
        if t.burst == 0 {
            out.add(at("burst"), "must be at least 1");
        }
        if t.tokens_per_minute == Some(0) {
            out.add(
                at("tokens_per_minute"),
                "must be at least 1 (leave it out for no limit)",
            );
        }
    }
}

fn traces(t: &Traces, out: &mut Problems) {
    use sluice_engine::trace::otlp::{OtlpConfig, OtlpConfigError};
    match OtlpConfig::resolve(|_| None, &t.settings(), "sluice-gateway") {
        Ok(_) => {}
        Err(e @ OtlpConfigError::Protocol(_)) => out.add("traces.protocol", e.to_string()),
        Err(e) => out.add("traces.endpoint", e.to_string()),
    }
}

fn alerts(al: &Alerts, out: &mut Problems) {
    if let Some(ca) = &al.ca {
        if let Err(e) = crate::tls::root_store(ca) {
            out.add("alerts.ca", e.to_string());
        }
    }
    for (i, url) in al.alertmanager_urls.iter().enumerate() {
        if let Err(why) = alertmanager_url(url) {
            out.add(format!("alerts.alertmanager_urls[{i}]"), why);
        }
    }
    for (i, url) in al.webhooks.iter().enumerate() {
        if let Err(why) = webhook_url(url) {
            out.add(format!("alerts.webhooks[{i}]"), why);
        }
    }
    let shed_ok = al.shed_ratio.is_finite() && al.shed_ratio > 0.0 && al.shed_ratio <= 1.0;
    if !shed_ok {
        out.add(
            "alerts.shed_ratio",
            format!(
                "{} must be a share above 0 and at most 1 (0.1: a tenth of the requests shed)",
                al.shed_ratio
            ),
        );
    }
    if !al.resolve_ratio.is_finite() || al.resolve_ratio < 0.0 {
        out.add(
            "alerts.resolve_ratio",
            format!("{} must be a share of at least 0", al.resolve_ratio),
        );
    } else if shed_ok && al.resolve_ratio > al.shed_ratio {
        out.add(
            "alerts.resolve_ratio",
            format!(
                "{} is larger than alerts.shed_ratio ({}); the alert would never stay firing",
                al.resolve_ratio, al.shed_ratio
            ),
        );
    }
    if al.min_requests == 0 {
        out.add(
            "alerts.min_requests",
            "must be at least 1 (an empty window sheds nothing)",
        );
    }
    out.duration("alerts.queue_p95", al.queue_p95, DURATION_MAX, false);
    out.duration("alerts.window", al.window, ALERT_WINDOW_MAX, false);
    out.duration(
        "alerts.repeat_interval",
        al.repeat_interval,
        ALERT_WINDOW_MAX,
        false,
    );
    let every = al.evaluate_every;
    if every < ALERT_EVALUATE_MIN {
        out.add(
            "alerts.evaluate_every",
            format!(
                "{} is shorter than the shortest allowed, {}",
                humantime::format_duration(every),
                humantime::format_duration(ALERT_EVALUATE_MIN)
            ),
        );
    } else if every > al.window {
        out.add(
            "alerts.evaluate_every",
            format!(
                "{} is longer than alerts.window ({})",
                humantime::format_duration(every),
                humantime::format_duration(al.window)
            ),
        );
    } else if al.window.as_millis() / every.as_millis() > ALERT_SAMPLES_MAX {
        out.add(
            "alerts.evaluate_every",
            format!(
                "{} is too short for alerts.window ({}): at most {ALERT_SAMPLES_MAX} samples \
                 per window",
                humantime::format_duration(every),
                humantime::format_duration(al.window)
            ),
        );
    }
}

fn admin(ad: &Admin, out: &mut Problems) {
    if let Some(Err(why)) = ad.api_key_sha256.as_deref().map(sha256_hex) {
        out.add("admin.api_key_sha256", why);
    }
    if ad.disabled && ad.api_key_sha256.is_some() {
        out.add(
            "admin.disabled",
            "true turns the admin endpoints off, but admin.api_key_sha256 is set; remove one",
        );
    }
}

/// A key hash: exactly 64 lowercase hex digits.
fn sha256_hex(s: &str) -> Result<(), String> {
    let ok = s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        // The value is not quoted: an operator who pasted the key itself would see it in the
        // log, the reload alert and `sluice policy check`.
        Err(format!(
            "is not a SHA-256 in lowercase hex (it has {} characters; 64 characters 0-9a-f \
             expected, e.g. `printf %s \"$KEY\" | sha256sum`), and never the key itself (the \
             value is not repeated here in case it is one)",
            s.chars().count()
        ))
    }
}

/// An `http(s)://host[:port]...` URI; errors quote it as `shown` (never with a secret).
fn http_uri(s: &str, shown: &str) -> Result<Uri, String> {
    let uri: Uri = s
        .parse()
        .map_err(|e| format!("{shown:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{shown:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{shown:?} has no host"));
    }
    Ok(uri)
}

/// An upstream base URL: `http(s)://host:port`, no path (the request's path is appended).
fn base_url(s: &str) -> Result<(), String> {
    let shown = without_password(s);
    let uri = http_uri(s, &shown)?;
    let path_ok = matches!(uri.path(), "" | "/") && uri.query().is_none();
    if !path_ok {
        return Err(format!(
            "{shown:?} has a path or query; write only http(s)://host:port (the request's /v1/... is appended)"
        ));
    }
    Ok(())
}

/// A webhook: any `http(s)://host...` URL (quoted by its host only: the path is the secret).
fn webhook_url(s: &str) -> Result<(), String> {
    http_uri(s, &host_only(s)).map(|_| ())
}

/// An Alertmanager base URL: `http(s)://host[:port][/prefix]`, no query (`/api/v2/alerts` is
/// appended).
fn alertmanager_url(s: &str) -> Result<(), String> {
    let shown = without_password(s);
    let uri = http_uri(s, &shown)?;
    if uri.query().is_some() || uri.path().contains("/api/") {
        return Err(format!(
            "{shown:?} must be Alertmanager's base URL, e.g. http://127.0.0.1:9093 \
             (/api/v2/alerts is appended)"
        ));
    }
    Ok(())
}

fn shared(sh: &Shared, out: &mut Problems) {
    if let Some(url) = &sh.redis_url {
        if !(url.starts_with("redis://") || url.starts_with("unix://")) {
            out.add(
                "shared.redis_url",
                format!(
                    "{:?} is not a redis:// or unix:// URL (rediss:// is not built in: put \
                     Redis on a private network, or behind a local TLS tunnel)",
                    without_password(url)
                ),
            );
        } else if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url.as_str()) {
            out.add("shared.redis_url", e.to_string());
        }
    }
    let bad = |c: char| c.is_whitespace() || c.is_control() || c == '{' || c == '}';
    if sh.prefix.is_empty() || sh.prefix.len() > 64 || sh.prefix.contains(bad) {
        out.add(
            "shared.prefix",
            "must be 1 to 64 characters, without spaces or braces (it becomes a Redis hash tag)",
        );
    }
    if sh.lease_ttl < LEASE_TTL_MIN {
        out.add(
            "shared.lease_ttl",
            format!(
                "must be at least {}",
                humantime::format_duration(LEASE_TTL_MIN)
            ),
        );
    }
    out.duration("shared.lease_ttl", sh.lease_ttl, LEASE_TTL_MAX, false);
    out.duration("shared.timeout", sh.timeout, SHARED_TIMEOUT_MAX, false);
    if sh.timeout * 3 > sh.lease_ttl {
        out.add(
            "shared.timeout",
            "must be at most a third of shared.lease_ttl (a lease is renewed every third of it)",
        );
    }
    out.positive(
        "shared.expected_replicas",
        sh.expected_replicas,
        "gateways in the deployment",
    );
    if sh.expected_replicas > EXPECTED_REPLICAS_MAX {
        out.add(
            "shared.expected_replicas",
            format!(
                "{} is more than {EXPECTED_REPLICAS_MAX} gateways (each one's share of a rate, \
                 burst or ceiling would round to nothing)",
                sh.expected_replicas
            ),
        );
    }
}
