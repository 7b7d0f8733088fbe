//! The gateway application: its shared parts and the one function that builds the stack.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use http::{Request, Response};
use hyper::body::Incoming;
use sluice_engine::http::ConnectionLimit;
use tower::util::BoxCloneSyncService;
use tower::ServiceBuilder;

use crate::alerts::Alerter;
use crate::body::GatewayBody;
use crate::forward::{Forward, Upstream};
use crate::middleware::admission::{Admission, AdmissionLayer, Limits};
use crate::middleware::around::AroundLayer;
use crate::middleware::auth::Auth;
use crate::middleware::budget::Budget;
use crate::middleware::cap::Cap;
use crate::middleware::check::CheckLayer;
use crate::middleware::count::{CountLayer, TokenCounter};
use crate::middleware::parse::ParseLayer;
use crate::middleware::rate_limit::RateLimit;
use crate::middleware::request_id::RequestIdLayer;
use crate::policy::PolicyStore;
use crate::shared::hold::SharedCeiling;
use crate::shared::Shared;
use crate::telemetry::Metrics;

/// The generation stack as one service.
pub type Stack = BoxCloneSyncService<Request<Incoming>, Response<GatewayBody>, Infallible>;

/// What the stack and the server share.
#[derive(Clone, Debug)]
pub struct App {
    pub policy: Arc<PolicyStore>,
    pub admission: Arc<Admission>,
    pub upstream: Arc<dyn Upstream>,
    pub metrics: Arc<Metrics>,
    /// The state shared with the deployment's other gateways (`[shared]`), when on.
    pub shared: Option<Arc<Shared>>,
    /// The alerter, when one runs (its state is part of `/metrics`).
    pub alerter: Arc<OnceLock<Alerter>>,
    /// The model name clients see.
    pub model: String,
    /// The client connections the listener holds open at once (`server.max_connections`).
    pub connections: ConnectionLimit,
    /// The probe listener's own (`server.probe_listen`, [`crate::server::PROBE_CONNECTIONS`]).
    pub probe_connections: ConnectionLimit,
    /// TLS handshakes either listener saw fail or time out.
    pub failed_handshakes: Arc<crate::server::FailedHandshakes>,
}

impl App {
    /// An app whose admission limits start from the policy in force and follow its reloads.
    pub fn new(policy: Arc<PolicyStore>, upstream: Arc<dyn Upstream>, model: String) -> Self {
        let admission = Admission::new(Limits::from(&policy.current().policy));
        let policy_max_connections = policy.current().policy.server.max_connections;
        let mut changes = policy.subscribe();
        let follower = Arc::downgrade(&admission);
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let limits = Limits::from(&changes.borrow_and_update().policy);
                match follower.upgrade() {
                    Some(admission) => admission.set_limits(limits),
                    None => break,
                }
            }
        });
        let shared = Shared::start(&policy.current().policy).unwrap_or_else(|e| {
            tracing::error!("{e}: the shared state is off");
            None
        });
        if let Some(s) = &shared {
            s.watch_admission(&admission);
        }
        // The upstream's own ceiling (replicas up and not saturated) lowers admission's, and so
        // does the gateway's share of a shared ceiling while Redis is away (`fail = "local"`).
        crate::shared::capacity::follow(
            &admission,
            policy.clone(),
            upstream.capacity(),
            shared.clone(),
        );
        Self {
            policy,
            admission,
            upstream,
            metrics: Arc::default(),
            shared,
            alerter: Arc::default(),
            connections: ConnectionLimit::new(policy_max_connections),
            probe_connections: ConnectionLimit::new(crate::server::PROBE_CONNECTIONS),
            failed_handshakes: Arc::default(),
            model,
        }
    }
}

/// Builds the generation stack (`POST /v1/chat/completions`, `POST /v1/completions`), outermost
/// first:
///
/// 1. **request id + trace + outcome** ([`crate::middleware::request_id`]): adds `RequestId`
///    and `RequestTrace`; turns every error below into its OpenAI-shaped response; counts the
///    request accepted and records its outcome.
/// 2. **auth** ([`crate::middleware::auth`]): the API key → `Caller` (tenant, class); 401.
/// 3. **rate limit** ([`crate::middleware::rate_limit`]): GCRA per tenant; reads `Caller`; 429.
///    With `[shared]` the buckets are in Redis ([`crate::shared`]), checked by the request's
///    one script on arrival at 6, once the body is in; here only a refusal that still stands.
/// 4. **parse** ([`crate::middleware::parse`]): body limit (413) and JSON (400); the request
///    becomes `Request<Json>`.
/// 5. **count** ([`crate::middleware::count`]): prompt tokens with the model's tokenizer and
///    chat template → `PromptTokens`.
/// 6. **cap** ([`crate::middleware::cap`]): input cap and context window (400
///    `context_length_exceeded`); `max_tokens` defaulted and clamped → `MaxTokens`.
///    Then the tenant's **token budget** ([`crate::middleware::budget`]): prompt + `max_tokens`
///    charged on arrival (429 `tokens_per_minute_exceeded`), settled to the real usage when
///    the response ends; reads `Caller`, `PromptTokens`, `MaxTokens`. With `[shared]` one script
///    checks the tenant's rate limit (429 `rate_limit_exceeded`), charges the budget and, with a
///    free local slot, tries for the shared ceiling's lease → `Arrival`; 503
///    `shared_state_unavailable` when Redis is away and `fail = "closed"`.
/// 7. **admission** ([`crate::middleware::admission`]): a slot among `active_max`, or a place
///    in the queue, or 503 `overloaded` / `queue_timeout`; reads `Caller` and `PromptTokens`;
///    the slot moves into the response body; adds `QueueTime`, `x-sluice-queue-ms`.
///    Then the **shared ceiling** ([`crate::shared::hold`], with `[shared]` and an `openai`
///    upstream): a lease on the deployment's `active_max`, waited for within the rest of
///    `queue_wait_max` (or the one `Arrival` brought), held by the body; reads `Caller`,
///    `QueueTime`, `Arrival`; adds `x-sluice-shared-wait-ms`.
/// 8. **forward** ([`crate::forward`]): to the upstream, streaming the response back; reads
///    `RequestTrace` (→ `traceparent`) and `PromptTokens` (→ `x-sluice-prompt-tokens`).
pub fn stack(app: &App, counter: Arc<dyn TokenCounter>) -> Stack {
    let service = ServiceBuilder::new()
        .layer(RequestIdLayer::new(app.metrics.clone()))
        .layer(CheckLayer::new(Auth::new(app.policy.clone())))
        .layer(CheckLayer::new(RateLimit::new(app.shared.clone())))
        .layer(ParseLayer::new(app.policy.clone()))
        .layer(CountLayer::new(counter))
        .layer(CheckLayer::new(Cap::new(app.policy.clone())))
        .layer(AroundLayer::new(Budget::new(app.shared.clone())))
        .layer(AdmissionLayer::new(
            app.admission.clone(),
            app.metrics.clone(),
        ))
        .layer(AroundLayer::new(SharedCeiling::new(
            app.shared.clone(),
            app.admission.clone(),
            app.policy.clone(),
        )))
        .service(Forward::new(app.upstream.clone(), app.policy.clone()));
    BoxCloneSyncService::new(service)
}
