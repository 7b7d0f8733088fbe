//! The forwarding service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::{HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::Service;

use super::idle::IdleBody;
use super::upstream::Upstream;
use crate::body::{BoxError, GatewayBody};
use crate::error::GatewayError;
use crate::middleware::auth::PRIORITY_HEADER;
use crate::middleware::count::{PromptTokens, PROMPT_TOKENS_HEADER};
use crate::middleware::parse::Json;
use crate::middleware::request_id::{RequestId, REQUEST_ID_HEADER};
use crate::policy::PolicyStore;
use crate::telemetry::{RequestRecord, RequestTrace, UpstreamTrace};

/// The HTTP client to upstreams.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A client with pooled keep-alive connections and `TCP_NODELAY`.
pub fn http_client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Sends each request to the upstream and streams its response back.
#[derive(Clone, Debug)]
pub struct Forward {
    client: HttpClient,
    upstream: Arc<dyn Upstream>,
    policy: Arc<PolicyStore>,
}

impl Forward {
    pub fn new(upstream: Arc<dyn Upstream>, policy: Arc<PolicyStore>) -> Self {
        Self {
            client: http_client(),
            upstream,
            policy,
        }
    }
}

impl Service<Request<Json>> for Forward {
    type Response = Response<GatewayBody>;
    type Error = GatewayError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<GatewayBody>, GatewayError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Json>) -> Self::Future {
        let client = self.client.clone();
        let upstream = self.upstream.clone();
        let idle = self.policy.current().policy.upstream.idle_timeout;
        Box::pin(async move {
            let target = upstream.target()?;
            let (parts, json) = req.into_parts();
            let path = parts
                .uri
                .path_and_query()
                .map_or(parts.uri.path(), |p| p.as_str());
            let body = serde_json::to_vec(&json.value)
                .map_err(|e| GatewayError::Internal(format!("re-encoding the body: {e}")))?;
            let mut out = Request::builder()
                .method(Method::POST)
                .uri(target.uri(path)?)
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| GatewayError::Internal(e.to_string()))?;
            copy_headers(&parts.headers, out.headers_mut(), REQUEST_ONLY);
            let h = out.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            if let Some(id) = parts.extensions.get::<RequestId>() {
                if let Ok(v) = HeaderValue::from_str(&id.0) {
                    h.insert(REQUEST_ID_HEADER, v);
                }
            }
            // The engine's spans go under `gateway.upstream` (or the request's own span when
            // nothing admitted it, as in tests of this layer alone).
            let trace = parts
                .extensions
                .get::<UpstreamTrace>()
                .map(|u| u.0)
                .or_else(|| parts.extensions.get::<RequestTrace>().map(|t| t.span));
            if let Some(Ok(v)) = trace.map(|t| HeaderValue::from_str(&t.to_string())) {
                h.insert("traceparent", v);
            }
            if let (Some(r), Some(m)) = (
                parts.extensions.get::<RequestRecord>(),
                json.value.get("model").and_then(|m| m.as_str()),
            ) {
                r.set_model(m);
            }
            let resp = tokio::time::timeout(idle, client.request(out))
                .await
                .map_err(|_| GatewayError::UpstreamTimeout(idle))?
                .map_err(|e| upstream.connect_error(&target, &e))?;
            let (mut rparts, incoming) = resp.into_parts();
            let mut headers = HeaderMap::new();
            copy_headers(&rparts.headers, &mut headers, &[]);
            if let Some(p) = parts.extensions.get::<PromptTokens>() {
                headers.insert(PROMPT_TOKENS_HEADER, HeaderValue::from(p.0));
            }
            rparts.headers = headers;
            let sse = rparts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let body = incoming
                .map_err(|e| -> BoxError { Box::new(e) })
                .boxed_unsync();
            let body = IdleBody::new(body, idle, sse).boxed_unsync();
            Ok(Response::from_parts(rparts, body))
        })
    }
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
