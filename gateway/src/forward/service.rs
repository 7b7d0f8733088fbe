//! The forwarding service.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::capture_connection;
use tower::Service;

use super::client::{http_client, HttpClient};
use super::connection::closed_before_answering;
use super::idle::IdleBody;
use super::upstream::{Target, Upstream};
use crate::body::{is_sse, GatewayBody};
use crate::error::GatewayError;
use crate::middleware::admission::UpstreamStart;
use crate::middleware::auth::PRIORITY_HEADER;
use crate::middleware::cap::{MaxTokens, MAX_TOKENS_HEADER};
use crate::middleware::count::{PromptTokens, PROMPT_TOKENS_HEADER};
use crate::middleware::parse::Json;
use crate::middleware::request_id::{RequestId, REQUEST_ID_HEADER};
use crate::policy::PolicyStore;
use crate::telemetry::spans::traceparent;
use crate::telemetry::{RequestRecord, RequestTrace, UpstreamTrace};
use crate::BoxFuture;

/// Sends each request to the upstream and streams its response back.
#[derive(Clone, Debug)]
pub struct Forward {
    /// `None` only if no TLS client could be built at all (every request then says so).
    client: Option<HttpClient>,
    upstream: Arc<dyn Upstream>,
    policy: Arc<PolicyStore>,
}

impl Forward {
    /// Trusts `upstream.ca` for `https://` upstreams (read now; a change needs a restart).
    pub fn new(upstream: Arc<dyn Upstream>, policy: Arc<PolicyStore>) -> Self {
        let ca = policy.current().policy.upstream.ca.clone();
        let client = http_client(ca.as_deref())
            .or_else(|e| {
                tracing::error!(error = %e, "upstream.ca is unusable; trusting the system's roots");
                http_client(None)
            })
            .map_err(|e| tracing::error!(error = %e, "no TLS client for upstreams"))
            .ok();
        Self {
            client,
            upstream,
            policy,
        }
    }
}

impl Service<Request<Json>> for Forward {
    type Response = Response<GatewayBody>;
    type Error = GatewayError;
    type Future = BoxFuture<Result<Response<GatewayBody>, GatewayError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Json>) -> Self::Future {
        let client = self.client.clone();
        let upstream = self.upstream.clone();
        let policy = self.policy.of(req.extensions());
        let up = &policy.policy.upstream;
        let idle = up.idle_timeout;
        let api_key = up
            .api_key_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok());
        let (parts, mut json) = req.into_parts();
        if let Some(model) = json.value.get("model").and_then(|m| m.as_str()) {
            if let Some(r) = parts.extensions.get::<RequestRecord>() {
                r.set_model(model);
            }
            if let Some(to) = up.models.get(model) {
                json.value["model"] = to.clone().into();
            }
        }
        Box::pin(async move {
            let client = client
                .ok_or_else(|| GatewayError::Internal("no TLS client for upstreams".into()))?;
            let body = json
                .encode()
                .map_err(|e| GatewayError::Internal(format!("re-encoding the body: {e}")))?;
            let outgoing = Outgoing {
                parts: &parts,
                body,
                api_key: api_key.as_deref(),
            };
            // Only a request that reached no engine is sent again: a refused connection (on
            // another replica), or a pooled connection the upstream had closed (once; see
            // `connection`). Once a request may have started generating, it is never sent twice.
            // An engine that answers 503 (vLLM's "engine is currently busy", SGLang's and
            // llama-server's full queues) has not started the request either: it goes to
            // another replica with room, once each, and when none is left the client gets the
            // gateway's own 503 `overloaded` with a Retry-After, never the engine's text.
            let mut tried = Vec::new();
            let mut refused = None;
            let mut busy = None;
            let mut resent = false;
            let upstream_start = parts.extensions.get::<UpstreamStart>();
            let (lease, resp) = loop {
                let lease = match upstream.lease(&tried) {
                    Ok(l) => l,
                    Err(e) => return Err(busy.or(refused).unwrap_or(e)),
                };
                if resent || !tried.is_empty() {
                    // A retry: the attempts before it were not the upstream's prefill.
                    if let Some(start) = upstream_start {
                        start.mark();
                    }
                }
                let mut req = outgoing.to(&lease.target)?;
                let conn = capture_connection(&mut req);
                let started = Instant::now();
                match tokio::time::timeout(idle, client.request(req)).await {
                    Ok(Ok(resp)) if resp.status() == StatusCode::SERVICE_UNAVAILABLE => {
                        lease.answered(resp.status());
                        let retry_after = retry_after(resp.headers());
                        tracing::info!(upstream = %lease.target.base, ?retry_after, "the engine is busy (503); trying another replica");
                        busy = Some(GatewayError::UpstreamBusy { retry_after });
                        match lease.replica() {
                            Some(i) => tried.push(i),
                            None => return Err(GatewayError::UpstreamBusy { retry_after }),
                        }
                    }
                    Ok(Ok(resp)) => break (lease, resp),
                    Ok(Err(e)) if !resent && closed_before_answering(&conn, started, &e) => {
                        tracing::debug!(upstream = %lease.target.base, error = %e, "a pooled connection was closed under the request; sending it on a new one");
                        resent = true;
                    }
                    Ok(Err(e)) => {
                        lease.failed();
                        let err = request_error(&*upstream, &lease.target, &e);
                        match lease.replica() {
                            Some(i) if e.is_connect() => {
                                tracing::warn!(replica = %lease.target.base, error = %e, "connect failed; trying another replica");
                                tried.push(i);
                                refused = Some(err);
                            }
                            _ => return Err(err),
                        }
                    }
                    Err(_) => {
                        lease.failed();
                        return Err(GatewayError::UpstreamTimeout(idle));
                    }
                }
            };
            if let Some(r) = parts.extensions.get::<RequestRecord>() {
                r.answered_by(lease.target.shown());
            }
            let sse = is_sse(resp.headers());
            // A stream's health is judged at its end (`IdleBody`).
            if !(resp.status().is_success() && sse) {
                lease.answered(resp.status());
            }
            let (mut rparts, incoming) = resp.into_parts();
            for name in HOP_BY_HOP {
                rparts.headers.remove(name);
            }
            if let Some(p) = parts.extensions.get::<PromptTokens>() {
                rparts
                    .headers
                    .insert(PROMPT_TOKENS_HEADER, HeaderValue::from(p.0));
            }
            if let Some(m) = parts.extensions.get::<MaxTokens>() {
                rparts
                    .headers
                    .insert(MAX_TOKENS_HEADER, HeaderValue::from(m.0));
            }
            let body = IdleBody::new(incoming, idle, sse)
                .holding(lease)
                .boxed_unsync();
            Ok(Response::from_parts(rparts, body))
        })
    }
}

/// The request as it goes upstream, rebuilt for each attempt.
struct Outgoing<'a> {
    parts: &'a http::request::Parts,
    body: Bytes,
    api_key: Option<&'a str>,
}

impl Outgoing<'_> {
    fn to(&self, target: &Target) -> Result<Request<Full<Bytes>>, GatewayError> {
        let parts = self.parts;
        let root = PathAndQuery::from_static("/");
        let mut out = Request::new(Full::new(self.body.clone()));
        *out.method_mut() = Method::POST;
        *out.uri_mut() = target.uri(parts.uri.path_and_query().unwrap_or(&root))?;
        let h = out.headers_mut();
        h.reserve(parts.headers.len() + 3);
        copy_headers(&parts.headers, h, REQUEST_ONLY);
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(id) = parts.extensions.get::<RequestId>() {
            h.insert(REQUEST_ID_HEADER, id.header());
        }
        // The engine's spans go under `gateway.upstream` (or the request's own span when
        // nothing admitted it, as in tests of this layer alone).
        let trace = parts
            .extensions
            .get::<UpstreamTrace>()
            .map(|u| u.0)
            .or_else(|| parts.extensions.get::<RequestTrace>().map(|t| t.span));
        if let Some(t) = trace {
            h.insert("traceparent", traceparent(&t));
        }
        if let Some(Ok(v)) = self
            .api_key
            .map(|k| HeaderValue::from_str(&format!("Bearer {k}")))
        {
            h.insert(header::AUTHORIZATION, v);
        }
        Ok(out)
    }
}

/// A request that failed: an upstream it could not reach gets its connect error (503 for the
/// engine); one that answered something that is not HTTP, or hung up, a 502.
fn request_error(
    upstream: &dyn Upstream,
    target: &Target,
    e: &hyper_util::client::legacy::Error,
) -> GatewayError {
    if e.is_connect() {
        return upstream.connect_error(target, e);
    }
    GatewayError::Upstream(format!(
        "{} gave no valid HTTP answer ({})",
        target.base,
        sluice_engine::error::chain(e)
    ))
}

/// Headers that never cross a proxy (RFC 9110 §7.6.1), plus the length the body sets.
const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::HOST,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Request headers that are the gateway's business, not the upstream's: the caller's
/// credentials, its priority, and the trace (replaced with the gateway's span).
const REQUEST_ONLY: &[&str] = &[
    "authorization",
    "x-api-key",
    PRIORITY_HEADER,
    "traceparent",
    REQUEST_ID_HEADER,
    "keep-alive",
    "proxy-connection",
];

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, also_drop: &[&str]) {
    for (name, value) in from {
        if HOP_BY_HOP.contains(name) || also_drop.contains(&name.as_str()) {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

/// An upstream's `Retry-After` in whole seconds (the HTTP-date form is not worth a parser here:
/// engines send seconds), between 1 s and a minute; 1 s without one.
fn retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), |s| {
            Duration::from_secs(s.clamp(1, 60))
        })
}
