//! The engine's OpenAI-compatible HTTP server (rank 0 of the pipeline).
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: generation, whole or streamed as
//!   server-sent events.
//! - `GET /v1/models`, `GET /health` (200 when every rank is up, else 503), `GET /metrics`
//!   (Prometheus text).
//!
//! HTTP/1.1 and HTTP/2 over cleartext (h2c, prior knowledge) on the same port. Every error is
//! an OpenAI-shaped JSON body (see `error`). A `traceparent` request header joins the
//! engine's spans to the caller's trace and is echoed on the response.

mod body;
mod chat;
mod chat_request;
mod completions;
mod constrain;
mod error;
mod fields;
mod format;
mod generation;
mod logprobs;
mod metrics;
mod parse;
pub mod prompt;
mod tools;
mod types;

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};

use crate::http::Watcher;

use crate::api::Engine;
use crate::trace::TraceContext;
use body::Body;
use error::{ApiError, BODY_LIMIT};
use generation::{unix_now, SseStream};
use metrics::HttpMetrics;

/// How long a connection may take to send a request's headers (also the keep-alive idle
/// limit of HTTP/1 connections).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections the engine's server holds open at once (its clients are a gateway's pool or a
/// few benchmark clients; past this, new ones wait in the listen backlog).
const MAX_CONNECTIONS: usize = 1024;

/// Serves `engine` on `listener` until `shutdown` completes; then stops accepting, lets the
/// requests in flight finish (streams included) for at most `drain`, closes the connections
/// still open (their requests are aborted) and returns. Without the limit a client that stops
/// reading a stream but keeps its connection open would keep the server from ever stopping.
///
/// Accept errors (a connection reset before it was accepted, running out of file descriptors)
/// are logged and retried, so this returns `Ok` once shut down.
pub async fn serve(
    listener: TcpListener,
    engine: Arc<dyn Engine>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let state = Arc::new(State {
        engine,
        http: Arc::new(HttpMetrics::default()),
        created: unix_now(),
    });
    let builder = Arc::new(crate::http::connection_builder(HEADER_READ_TIMEOUT));
    let limit = crate::http::ConnectionLimit::new(MAX_CONNECTIONS);
    crate::http::accept_loop(
        listener,
        shutdown,
        Some(drain),
        limit,
        move |stream, watcher| connection(stream, state.clone(), builder.clone(), watcher),
    )
    .await
}

/// One connection, shut down gracefully (in-flight requests finish) when `watcher` says so.
async fn connection(
    stream: TcpStream,
    state: Arc<State>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
) {
    let service = service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&state, req).await) }
    });
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("connection: {e}");
    }
}

/// What every handler shares.
pub(crate) struct State {
    pub engine: Arc<dyn Engine>,
    pub http: Arc<HttpMetrics>,
    /// When the server started (the `created` of `/v1/models`).
    pub created: u64,
}

/// A generation request, read.
pub(crate) struct Call {
    pub body: Bytes,
    pub trace: Option<TraceContext>,
    /// When the request arrived (latency histograms start here).
    pub start: Instant,
}

async fn handle(state: &State, req: Request<Incoming>) -> Response<Body> {
    let start = Instant::now();
    let trace = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceContext::parse);
    let mut resp = match crate::error::caught(route(state, req, trace, start)).await {
        Ok(answer) => answer.unwrap_or_else(ApiError::into_response),
        Err(panic) => {
            tracing::error!(panic, "a request's handling panicked");
            ApiError::internal("the server failed on this request (a bug; see its log)")
                .into_response()
        }
    };
    if let Some(t) = trace {
        if let Ok(v) = HeaderValue::from_str(&t.to_string()) {
            resp.headers_mut().insert("traceparent", v);
        }
    }
    resp
}

#[derive(Clone, Copy)]
enum Route {
    Chat,
    Completions,
    Models,
    Health,
    Metrics,
}

async fn route(
    state: &State,
    req: Request<Incoming>,
    trace: Option<TraceContext>,
    start: Instant,
) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path();
    let (allowed, route) = match path {
        "/v1/chat/completions" => (Method::POST, Route::Chat),
        "/v1/completions" => (Method::POST, Route::Completions),
        "/v1/models" => (Method::GET, Route::Models),
        "/health" => (Method::GET, Route::Health),
        "/metrics" => (Method::GET, Route::Metrics),
        _ => return Err(ApiError::not_found(req.method(), path)),
    };
    if req.method() != allowed {
        let allow = if allowed == Method::POST {
            "POST"
        } else {
            "GET"
        };
        return Err(ApiError::method_not_allowed(req.method(), path, allow));
    }
    match route {
        Route::Chat | Route::Completions => {
            let call = Call {
                body: read_body(req).await?,
                trace,
                start,
            };
            if let Route::Chat = route {
                chat::handle(state, call).await
            } else {
                completions::handle(state, call).await
            }
        }
        Route::Models => Ok(models(state)),
        Route::Health => {
            let health = state.engine.health();
            let status = if health.status == "ok" {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            Ok(json_response(status, &health))
        }
        Route::Metrics => {
            let text = metrics::render(
                state.engine.model_id(),
                &state.engine.metrics(),
                &state.http,
            );
            let mut resp = Response::new(Body::full(text));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            Ok(resp)
        }
    }
}

/// The request body, at most [`BODY_LIMIT`] bytes (413 above).
async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
        return Err(ApiError::too_large());
    }
    match Limited::new(req.into_body(), BODY_LIMIT).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large()),
        Err(e) => Err(ApiError::unreadable_body(&e)),
    }
}

fn models(state: &State) -> Response<Body> {
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": state.engine.model_id(),
            "object": "model",
            "created": state.created,
            "owned_by": "sluice",
            // The window requests are held to (the flag, capped at the KV pool).
            "max_model_len": state.engine.context_window(),
        }],
    });
    json_response(StatusCode::OK, &body)
}

/// A JSON response.
pub(crate) fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let mut resp = Response::new(Body::full(generation::to_json(value)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A 200 `text/event-stream` response.
pub(crate) fn sse_response(stream: SseStream) -> Response<Body> {
    let mut resp = Response::new(Body::Sse(Box::new(stream)));
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
