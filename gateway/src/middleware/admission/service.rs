//! The admission service: takes a slot (waiting in the queue if need be, or refused when its
//! deadline cannot be met), then calls the upstream and moves the slot into the response body.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response};
use tower::{Service, ServiceExt};

use super::queue::{Admission, Ticket};
use super::slot::slot_body;
use super::wait::acquire_or;
use crate::body::stall::OnStall;
use crate::body::GatewayBody;
use crate::error::GatewayError;
use crate::middleware::auth::Caller;
use crate::middleware::cap::MaxTokens;
use crate::middleware::count::PromptTokens;
use crate::middleware::parse::Json;
use crate::telemetry::{Metrics, QueueOutcome, RequestRecord, UpstreamTrace};
use crate::BoxFuture;

/// The response header with the time spent queued, in whole milliseconds.
pub const QUEUE_MS_HEADER: &str = "x-sluice-queue-ms";
/// The response header with the time to first token predicted on arrival, in milliseconds.
pub const PREDICTED_TTFT_MS_HEADER: &str = "x-sluice-predicted-ttft-ms";
/// The request header that lowers (never raises) the class's TTFT deadline, in milliseconds.
pub const DEADLINE_MS_HEADER: &str = "x-sluice-ttft-deadline-ms";

/// What `req` asks admission for: its caller's class and tenant, its prompt and output
/// budget, whether it streams, and the deadline it asks for (400 when that is not a positive
/// whole number of milliseconds).
fn ticket<B: 'static>(req: &Request<B>) -> Result<Ticket, GatewayError> {
    let caller = req.extensions().get::<Caller>();
    let deadline = match req.headers().get(DEADLINE_MS_HEADER) {
        None => None,
        Some(v) => {
            let ms = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0)
                .ok_or_else(|| GatewayError::InvalidRequest {
                    param: Some(DEADLINE_MS_HEADER.into()),
                    code: Some("invalid_header".into()),
                    message: format!(
                        "{DEADLINE_MS_HEADER}: {v:?} is not a positive whole number of milliseconds"
                    ),
                })?;
            Some(std::time::Duration::from_millis(ms))
        }
    };
    let json = (req.body() as &dyn std::any::Any).downcast_ref::<Json>();
    Ok(Ticket {
        class: caller.map(|c| c.class).unwrap_or_default(),
        prompt_tokens: req.extensions().get::<PromptTokens>().map_or(0, |p| p.0),
        tenant: Arc::from(caller.map_or("anonymous", Caller::name)),
        max_tokens: req.extensions().get::<MaxTokens>().map_or(128, |m| m.0),
        deadline,
        stream: json.is_none_or(|j| j.value.get("stream") == Some(&serde_json::Value::Bool(true))),
    })
}

/// How long a request waited for its slot (a request extension, set once admitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueTime(pub std::time::Duration);

/// Admits requests to `inner` under the [`Admission`] limits.
#[derive(Clone, Debug)]
pub struct Admit<S> {
    inner: S,
    admission: Arc<Admission>,
    metrics: Arc<Metrics>,
}

impl<S> Admit<S> {
    pub fn new(inner: S, admission: Arc<Admission>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            admission,
            metrics,
        }
    }
}

impl<S, B> Service<Request<B>> for Admit<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = GatewayError;
    type Future = BoxFuture<Result<Response<GatewayBody>, GatewayError>>;

    /// Ready while a request could be granted or queued; otherwise parked until the queue
    /// changes — the backpressure [`super::Shed`] turns into an immediate `overloaded`.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        if !self.admission.accepting(cx.waker()) {
            return Poll::Pending;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let ticket = match ticket(&req) {
            Ok(t) => t,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let admission = self.admission.clone();
        let metrics = self.metrics.clone();
        // The clone that was driven to ready is the one called; a fresh clone stays here.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let record = req.extensions().get::<RequestRecord>().cloned();
        Box::pin(async move {
            let arrived = tokio::time::Instant::now();
            if let Some(r) = &record {
                r.queue_entered(admission.queued());
            }
            // A lease on the shared ceiling that the arrival took goes back while the request
            // waits here: the shared ceiling's stage takes one once the local slot is granted.
            let arrival = req.extensions().get::<crate::shared::Arrival>().cloned();
            let queued = move || {
                arrival
                    .iter()
                    .for_each(crate::shared::Arrival::give_back_lease)
            };
            // The wait is observed however it ends, a client that leaves while queued included.
            let mut wait = Waited {
                metrics: Some(metrics.clone()),
                arrived,
            };
            let admitted = match acquire_or(admission, ticket, queued).await {
                Ok(a) => a,
                Err(e) => {
                    drop(wait);
                    if let Some(r) = &record {
                        r.queue_refused(match e {
                            GatewayError::QueueTimeout { .. } => QueueOutcome::Timeout,
                            _ => QueueOutcome::Shed,
                        });
                    }
                    return Err(e);
                }
            };
            wait.metrics = None;
            metrics.queue_wait.observe(admitted.queued);
            req.extensions_mut().insert(QueueTime(admitted.queued));
            if let Some(r) = &record {
                req.extensions_mut().insert(UpstreamTrace(r.granted()));
            }
            // For the stages below that hold the request before the upstream has it.
            req.extensions_mut()
                .insert(admitted.permit.upstream_start());
            let resp = inner.oneshot(req).await?;
            let (mut parts, body) = resp.into_parts();
            let also = parts.extensions.remove::<OnStall>();
            parts.headers.insert(
                QUEUE_MS_HEADER,
                HeaderValue::from(admitted.queued.as_millis() as u64),
            );
            parts.headers.insert(
                PREDICTED_TTFT_MS_HEADER,
                HeaderValue::from(admitted.permit.predicted().as_millis() as u64),
            );
            let body = slot_body(body, admitted.permit, metrics, also);
            Ok(Response::from_parts(parts, body))
        })
    }
}

/// A wait in the queue, observed in `sluice_queue_wait_seconds` when dropped (refused, timed
/// out, or its client gone: the future dropped) unless granted, which observes its own.
struct Waited {
    metrics: Option<Arc<Metrics>>,
    arrived: tokio::time::Instant,
}

impl Drop for Waited {
    fn drop(&mut self) {
        if let Some(m) = self.metrics.take() {
            m.queue_wait.observe(self.arrived.elapsed());
        }
    }
}
