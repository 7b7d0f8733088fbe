//! The policy's keys. Every table and the file itself refuse unknown keys; every key has a
//! default, so an empty file is the deployment's measured defaults (see `docs/policy.md`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A whole policy file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    pub server: Server,
    pub limits: Limits,
    pub admission: Admission,
    pub upstream: Upstream,
    pub tenants: Vec<Tenant>,
    pub alerts: Alerts,
    pub traces: Traces,
    pub admin: Admin,
    pub shared: Shared,
}

/// `[server]`: where and how the gateway listens.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// Read at start: a change needs a restart.
    pub listen: SocketAddr,
    /// Run without API keys on purpose. With no `[[tenants]]` the gateway is open anyway; this
    /// key says so explicitly, which is what a non-loopback `listen` needs at start-up and what
    /// a reload that removes every tenant needs (see `policy::guard`).
    pub open: bool,
    /// PEM certificate chain; with `tls_key`. Neither: a generated development certificate.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// The largest request body read (413 above it).
    pub body_limit_bytes: usize,
    /// How long shutdown waits for requests in flight before closing connections.
    #[serde(with = "super::duration")]
    pub drain_timeout: Duration,
    /// How long a client connection may stay open with no request in flight before it is
    /// closed gracefully (read when the connection opens).
    #[serde(with = "super::duration")]
    pub idle_timeout: Duration,
    /// Client connections held open at once; past it new ones wait in the listen backlog until
    /// one closes. Read at start: a change needs a restart.
    pub max_connections: usize,
    /// A second listener for health probes and metrics scrapes alone (`/healthz`, `/readyz`,
    /// `/metrics`), over the same TLS as `listen`, with connections of its own: clients at
    /// `max_connections` never hold a probe back. None: they share `listen`. Read at start.
    pub probe_listen: Option<SocketAddr>,
}

impl Default for Server {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8443)),
            open: false,
            tls_cert: None,
            tls_key: None,
            body_limit_bytes: 4 << 20,
            drain_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            max_connections: 1000,
            probe_listen: None,
        }
    }
}

/// `[limits]`: token limits checked on arrival.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest prompt accepted (400 `context_length_exceeded` above).
    pub input_tokens_max: usize,
    /// Prompt + `max_tokens` must fit in this many tokens.
    pub context_window: usize,
    /// `max_tokens` when a request gives none.
    pub max_tokens_default: usize,
    /// `max_tokens` above this is lowered to it.
    pub max_tokens_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            input_tokens_max: 8192,
            context_window: 12288,
            max_tokens_default: 512,
            max_tokens_max: 4096,
        }
    }
}

/// `[admission]`: how many requests run upstream at once, and how the rest wait.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admission {
    /// Requests active upstream at once.
    pub active_max: usize,
    /// Requests waiting for a slot; one more is shed with 503 `overloaded`.
    pub queue_depth: usize,
    /// Longest wait for a slot (503 `queue_timeout` after it).
    #[serde(with = "super::duration")]
    pub queue_wait_max: Duration,
    /// Prompts longer than this are heavy.
    pub heavy_input_tokens: usize,
    /// Heavy requests active at once.
    pub heavy_active_max: usize,
    /// Admit by predicted time to first token: refuse at once (503 `deadline_unmeetable`) a
    /// request whose class deadline cannot be met. Off: count-based admission only.
    pub predictive: bool,
    /// The time-to-first-token deadline of interactive requests (arrival → first token).
    #[serde(with = "super::duration")]
    pub interactive_ttft_deadline: Duration,
    /// The time-to-first-token deadline of batch requests.
    #[serde(with = "super::duration")]
    pub batch_ttft_deadline: Duration,
    /// Prompt tokens admitted but not yet past their prefill, at most (a prompt larger than
    /// this runs when nothing else is prefilling).
    pub prefill_tokens_max: usize,
    /// Fairness between a class's tenants: the weight of an output token against a prompt
    /// token in each tenant's virtual token counter (the least served tenant goes first).
    pub fair_output_weight: f64,
    /// Keep the room of each request told to come back by `deadline_unmeetable` until it does
    /// (or lapses): later arrivals that would take it are refused. Off by default: under
    /// independent arrivals it serves more requests and more retries get in, but the ones that
    /// retry wait longer (docs/capacity.md).
    pub hold_for_returns: bool,
    /// The seed of the upstream's cost model (written by `sluice-load calibrate`).
    pub cost: Cost,
}

/// `[admission.cost]`: the upstream's cost model as calibrated, in milliseconds; refitted
/// online from then on (see `docs/policy.md`). `k` = prompt tokens / 1000.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Cost {
    /// Prefill: fixed cost of a request.
    pub prefill_base_ms: f64,
    /// Prefill: per 1K prompt tokens (× k).
    pub prefill_ms_per_1k: f64,
    /// Prefill: attention over the prompt itself (× k²).
    pub prefill_ms_per_1k_squared: f64,
    /// Prefill: the running sequences' decode rows carried along (× k × running tokens / 10K).
    pub prefill_ms_per_1k_per_10k_running: f64,
    /// Prefill: more while other requests decode, per 1K prompt tokens (× k × the share of the
    /// prefill beside decodes): the decodes run in each of its smaller chunks' steps.
    pub prefill_ms_per_1k_beside_decodes: f64,
    /// Prefill: more while other requests decode, per 1K² prompt tokens (× k² × the share of
    /// the prefill beside decodes): each smaller chunk reads the context before it again.
    pub prefill_ms_per_1k_squared_beside_decodes: f64,
    /// Decode step: fixed cost.
    pub decode_base_ms: f64,
    /// Decode step: per running sequence.
    pub decode_ms_per_seq: f64,
    /// Decode step: per 10K tokens of running context.
    pub decode_ms_per_10k_context: f64,
    /// Refit online from observed streams (off: the seed stays as written).
    pub refit: bool,
}

impl Default for Cost {
    /// Below what this machine's bundled engine measures (`sluice-load calibrate` writes the
    /// measured values): a cold model errs toward admitting.
    fn default() -> Self {
        Self {
            prefill_base_ms: 30.0,
            prefill_ms_per_1k: 500.0,
            prefill_ms_per_1k_squared: 50.0,
            prefill_ms_per_1k_per_10k_running: 0.0,
            prefill_ms_per_1k_beside_decodes: 0.0,
            prefill_ms_per_1k_squared_beside_decodes: 0.0,
            decode_base_ms: 10.0,
            decode_ms_per_seq: 2.0,
            decode_ms_per_10k_context: 0.0,
            refit: true,
        }
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self {
            active_max: 4,
            queue_depth: 16,
            queue_wait_max: Duration::from_secs(60),
            heavy_input_tokens: 4096,
            heavy_active_max: 1,
            predictive: true,
            interactive_ttft_deadline: Duration::from_secs(5),
            batch_ttft_deadline: Duration::from_secs(120),
            prefill_tokens_max: 8192,
            fair_output_weight: 2.0,
            hold_for_returns: false,
            cost: Cost::default(),
        }
    }
}

/// What the gateway forwards to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    /// The bundled engine, started and supervised by the gateway.
    #[default]
    Bundled,
    /// Any OpenAI-compatible server(s) at `urls`.
    Openai,
}

/// `[upstream]`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Upstream {
    pub kind: UpstreamKind,
    /// Base URLs (`http://host:port`) of an `openai` upstream.
    pub urls: Vec<String>,
    /// The model name clients see (default: the upstream's own).
    pub model: Option<String>,
    /// `tokenizer.json` or GGUF to count with (default: the bundled model).
    pub tokenizer: Option<PathBuf>,
    /// Bundled engine: ranks in the pipeline.
    pub ranks: usize,
    /// Bundled engine: how long its start may take before it counts as failed.
    #[serde(with = "super::duration")]
    pub start_timeout: Duration,
    /// Bundled engine: generation defaults for requests that leave a field out.
    pub sampling: SamplingDefaults,
    /// Longest silence from the upstream (waiting for its headers, or between two pieces of
    /// its body) before the request is failed with `upstream_timeout`.
    #[serde(with = "super::duration")]
    pub idle_timeout: Duration,
    /// The order the upstream gives its running prompts' prefill in, which the prediction of
    /// time to first token plays (restart only: the bundled engine is started with it, as
    /// `--prefill-order`). Unset: `shortest` for the bundled engine, `oldest` (first come,
    /// first served, as vLLM's and SGLang's schedulers) for `openai`.
    pub prefill_order: Option<PrefillOrder>,
    /// `openai`: a PEM CA bundle trusted for `https://` upstreams (default: the system's roots).
    pub ca: Option<PathBuf>,
    /// `openai`: the environment variable holding the upstream's API key (sent as
    /// `Authorization: Bearer`); the key itself never goes in the policy file.
    pub api_key_env: Option<String>,
    /// Model names clients send → the names the upstream serves (others pass unchanged).
    pub models: BTreeMap<String, String>,
    /// `openai`: the most requests one replica holds at once; the total stays `active_max`.
    /// Unset: only the total applies.
    pub replica_active_max: Option<usize>,
    /// `openai`: how often each replica's health is checked.
    #[serde(with = "super::duration")]
    pub health_interval: Duration,
    /// `openai`: the path checked: `/health` on vLLM, SGLang, `llama-server` and the bundled
    /// engine (`/healthz` for another Sluice gateway).
    pub health_path: String,
    /// `openai`: consecutive failures (connect errors, 5xx other than 503, failed health
    /// checks) that take a replica out of rotation.
    pub eject_after: u32,
    /// `openai`: how long an ejection lasts before a health check may bring the replica back
    /// (doubling with each ejection in a row, at most 32×).
    #[serde(with = "super::duration")]
    pub eject_for: Duration,
    /// `openai`: how often each replica's Prometheus `/metrics` is read.
    #[serde(with = "super::duration")]
    pub metrics_interval: Duration,
    /// `openai`: metrics older than this count as saturation.
    #[serde(with = "super::duration")]
    pub metrics_stale_after: Duration,
    /// `openai`: a replica whose engine holds more than this many requests in its own queue
    /// (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`) takes no more.
    pub engine_waiting_max: u32,
    /// `openai`: a replica whose KV cache use (`vllm:kv_cache_usage_perc`,
    /// `sglang:token_usage`) reaches this takes no more.
    pub engine_kv_usage_max: f64,
}

impl Default for Upstream {
    fn default() -> Self {
        Self {
            kind: UpstreamKind::Bundled,
            urls: Vec::new(),
            model: None,
            tokenizer: None,
            ranks: 3,
            start_timeout: Duration::from_secs(120),
            sampling: SamplingDefaults::default(),
            idle_timeout: Duration::from_secs(300),
            prefill_order: None,
            ca: None,
            api_key_env: None,
            models: BTreeMap::new(),
            replica_active_max: None,
            health_interval: Duration::from_secs(5),
            health_path: "/health".into(),
            eject_after: 3,
            eject_for: Duration::from_secs(10),
            metrics_interval: Duration::from_secs(2),
            metrics_stale_after: Duration::from_secs(10),
            engine_waiting_max: 2,
            engine_kv_usage_max: 0.95,
        }
    }
}

impl Upstream {
    /// The prefill order in force: the policy's, else the kind's own.
    pub fn prefill_order(&self) -> PrefillOrder {
        self.prefill_order.unwrap_or(match self.kind {
            UpstreamKind::Bundled => PrefillOrder::Shortest,
            UpstreamKind::Openai => PrefillOrder::Oldest,
        })
    }
}

/// The order in which an upstream prefills the prompts it runs (`upstream.prefill_order`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefillOrder {
    /// The oldest grant first: a short prompt waits out the rest of a long one's prefill.
    #[default]
    Oldest,
    /// The least prefill left first, the oldest among equals: a short prompt goes ahead of
    /// a long one already prefilling.
    Shortest,
}

impl PrefillOrder {
    /// The value of the bundled engine's `--prefill-order`.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Oldest => "oldest",
            Self::Shortest => "shortest",
        }
    }
}

/// `[upstream.sampling]`: the bundled engine's generation defaults, for requests that leave the
/// field out (its `--default-*` flags). Unset: the GGUF's `general.sampling.*`, else
/// llama-server's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no repetition penalty).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingDefaults {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// 0: no top-k cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f64>,
}

impl SamplingDefaults {
    /// The engine flag (after `--default-`) and value of each default set.
    pub fn flags(&self) -> Vec<(&'static str, String)> {
        let floats = [
            ("temperature", self.temperature),
            ("top-p", self.top_p),
            ("min-p", self.min_p),
            ("repetition-penalty", self.repetition_penalty),
        ];
        let mut out: Vec<(&'static str, String)> = floats
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?.to_string())))
            .collect();
        if let Some(k) = self.top_k {
            out.push(("top-k", k.to_string()));
        }
        out
    }
}

/// A request's priority class.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Shed first, never takes the last slot.
    Batch,
    #[default]
    Interactive,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "interactive" => Some(Self::Interactive),
            "batch" => Some(Self::Batch),
            _ => None,
        }
    }
}

/// `[[tenants]]`: one API key and its limits.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    pub name: String,
    /// Lowercase hex SHA-256 of the key (never the key itself).
    pub api_key_sha256: String,
    #[serde(default)]
    pub class: Class,
    /// Sustained request rate (GCRA); none: unlimited.
    pub requests_per_second: Option<f64>,
    /// Requests allowed at once above the sustained rate.
    #[serde(default = "default_burst")]
    pub burst: u32,
    /// Tokens (prompt + `max_tokens` reserved) per minute; none: unlimited.
    pub tokens_per_minute: Option<u64>,
}

fn default_burst() -> u32 {
    10
}

/// `[alerts]`: where the gateway posts its own alerts, and when the load-shedding alert fires
/// (see `docs/policy.md` and [`crate::alerts`]).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Alerts {
    /// Alertmanager base URLs (`http://host:9093`); alerts go to `{url}/api/v2/alerts`.
    pub alertmanager_urls: Vec<String>,
    /// Plain JSON webhooks: each alert change and repeat is `POST`ed to the URL as is.
    pub webhooks: Vec<String>,
    /// A PEM bundle trusted for `https://` targets instead of the system's roots. Read at
    /// start: a change needs a restart.
    pub ca: Option<PathBuf>,
    /// Share of the requests ended over `window` that were shed (503 `overloaded` or
    /// `queue_timeout`) at which `SluiceLoadShedding` fires.
    pub shed_ratio: f64,
    /// A firing shedding alert resolves only once the share falls below this (hysteresis).
    pub resolve_ratio: f64,
    /// Fewest requests ended over `window` for the share to fire the alert.
    pub min_requests: u64,
    /// Queue-time p95 that raises the queueing alert (Prometheus rules).
    #[serde(with = "super::duration")]
    pub queue_p95: Duration,
    /// The sliding window the shed share is taken over.
    #[serde(with = "super::duration")]
    pub window: Duration,
    /// How often the shed share is sampled and the alerts evaluated.
    #[serde(with = "super::duration")]
    pub evaluate_every: Duration,
    /// How often a firing alert is sent again.
    #[serde(with = "super::duration")]
    pub repeat_interval: Duration,
}

impl Default for Alerts {
    fn default() -> Self {
        Self {
            alertmanager_urls: Vec::new(),
            webhooks: Vec::new(),
            ca: None,
            shed_ratio: 0.1,
            resolve_ratio: 0.05,
            min_requests: 20,
            queue_p95: Duration::from_secs(10),
            window: Duration::from_secs(60),
            evaluate_every: Duration::from_secs(5),
            repeat_interval: Duration::from_secs(60),
        }
    }
}

/// `[traces]`: OTLP trace export, for when the standard `OTEL_EXPORTER_OTLP_*` variables are not
/// set (they win when they are). Read at start: a change needs a restart.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Traces {
    /// The collector's base URL, `http://host:4318` (HTTP) or `http://host:4317` (gRPC); none:
    /// no export.
    pub endpoint: Option<String>,
    /// `http/protobuf` (the default) or `grpc`.
    pub protocol: Option<String>,
    /// The gateway's `service.name` (default `sluice-gateway`; the bundled engine reports as
    /// `sluice-engine`).
    pub service_name: Option<String>,
}

impl Traces {
    pub fn settings(&self) -> sluice_engine::trace::otlp::OtlpSettings {
        sluice_engine::trace::otlp::OtlpSettings {
            endpoint: self.endpoint.clone(),
            protocol: self.protocol.clone(),
            service_name: self.service_name.clone(),
        }
    }
}

/// `[admin]`: the key of the `/admin/*` endpoints; none: they answer 404.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Admin {
    pub api_key_sha256: Option<String>,
    /// The admin endpoints are off on purpose: what a reload that drops `api_key_sha256` must
    /// say (see `policy::guard`).
    pub disabled: bool,
}

/// What a gateway does while its `[shared]` Redis is unreachable or slower than `timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedFail {
    /// Each gateway falls back to its share: `active_max / expected_replicas` slots and each
    /// tenant's rate and budget divided by `expected_replicas`, counted locally.
    #[default]
    Local,
    /// Every request that needs the shared state is refused: 503 `shared_state_unavailable`.
    Closed,
}

/// `[shared]`: the state several gateway replicas share through one Redis (the upstream's
/// ceiling, tenants' rate limits and token budgets; see `docs/operations.md`). No `redis_url`:
/// off, each gateway counts alone. Read at start: a change needs a restart.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shared {
    /// `redis://host:port[/db]` (`redis://:password@host:port` for `requirepass`).
    pub redis_url: Option<String>,
    /// The key prefix every gateway of one deployment shares (and no other deployment uses).
    pub prefix: String,
    /// How long a slot's lease lives without renewal: what a killed gateway's slots take to
    /// come back (renewed every third of it while the request runs).
    #[serde(with = "super::duration")]
    pub lease_ttl: Duration,
    /// The longest any Redis call may take; slower counts as unavailable (`fail` applies).
    #[serde(with = "super::duration")]
    pub timeout: Duration,
    pub fail: SharedFail,
    /// Gateways in the deployment: each one's share while Redis is unavailable.
    pub expected_replicas: usize,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            redis_url: None,
            prefix: "sluice".into(),
            lease_ttl: Duration::from_secs(5),
            timeout: Duration::from_millis(50),
            fail: SharedFail::Local,
            expected_replicas: 2,
        }
    }
}
