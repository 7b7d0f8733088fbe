//! The stage between admission and forward: a request that holds its local slot takes a lease
//! on the upstream's shared ceiling (waiting for one within what is left of
//! `admission.queue_wait_max`), unless its budget's charge took one on arrival
//! ([`super::Arrival`]), and the response body holds the lease until its end, as it holds the
//! local slot. Without `[shared]`, or with a bundled engine (each gateway's own), it
//! passes requests through untouched.
//!
//! The lease also goes back when the client stops reading, by admission's write-stall watch:
//! this stage hands it an [`OnStall`] in the response's extensions, so it must sit inside
//! admission (`app::stack`), whose `slot_body` takes it out.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::{Arrival, Lease, Shared};
use crate::body::stall::OnStall;
use crate::body::{BoxError, GatewayBody, Tap, TapBody};
use crate::error::GatewayError;
use crate::middleware::admission::{Admission, QueueTime, UpstreamStart};
use crate::middleware::around::{Answer, Around, Inner};
use crate::middleware::auth::Caller;
use crate::policy::PolicyStore;

/// The response header with the time spent waiting for the shared slot, in whole milliseconds
/// (after `x-sluice-queue-ms` in the local queue).
pub const SHARED_WAIT_HEADER: &str = "x-sluice-shared-wait-ms";

/// The stage (an [`Around`]): takes the shared slot, calls the inner service, moves the lease
/// into the body.
#[derive(Clone, Debug)]
pub struct SharedCeiling {
    shared: Option<Arc<Shared>>,
    admission: Arc<Admission>,
    policy: Arc<PolicyStore>,
}

impl SharedCeiling {
    pub fn new(
        shared: Option<Arc<Shared>>,
        admission: Arc<Admission>,
        policy: Arc<PolicyStore>,
    ) -> Self {
        Self {
            shared: shared.filter(|s| s.shares_ceiling()),
            admission,
            policy,
        }
    }
}

impl<B: Send + 'static> Around<B> for SharedCeiling {
    fn around<S: Inner<B>>(&self, req: Request<B>, mut inner: S) -> Answer {
        let Some(shared) = self.shared.clone() else {
            return Box::pin(inner.call(req));
        };
        let class = Caller::class_of(req.extensions());
        let queued = req
            .extensions()
            .get::<QueueTime>()
            .map_or(Duration::ZERO, |q| q.0);
        let arrival = req.extensions().get::<Arrival>().cloned();
        if let Some(lease) = arrival.as_ref().and_then(Arrival::take_lease) {
            return Box::pin(async move { held(inner.call(req).await?, lease, Duration::ZERO) });
        }
        let wait_max = self
            .policy
            .of(req.extensions())
            .policy
            .admission
            .queue_wait_max;
        let max = self.admission.snapshot().active_max;
        Box::pin(async move {
            let started = tokio::time::Instant::now();
            let lease = match shared
                .acquire(class, max, wait_max.saturating_sub(queued))
                .await
            {
                Ok(l) => match &arrival {
                    Some(a) => a.join(l),
                    None => l,
                },
                Err(GatewayError::QueueTimeout { waited }) => {
                    return Err(GatewayError::QueueTimeout {
                        waited: queued + waited,
                    })
                }
                Err(e) => return Err(e),
            };
            let waited = started.elapsed();
            // The time held here was not the upstream's: its prefill is timed from now.
            if let Some(start) = req.extensions().get::<UpstreamStart>() {
                start.mark();
            }
            held(inner.oneshot(req).await?, lease, waited)
        })
    }
}

/// The response with its body holding `lease`, and the time waited for it.
pub(super) fn held(
    resp: Response<GatewayBody>,
    lease: Lease,
    waited: Duration,
) -> Result<Response<GatewayBody>, GatewayError> {
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(
        SHARED_WAIT_HEADER,
        HeaderValue::from(waited.as_millis() as u64),
    );
    let lease = Arc::new(Mutex::new(Some(lease)));
    let body = TapBody::new(body, Held(lease.clone())).boxed_unsync();
    // Given back too when the client stops reading, by admission's watch of its local slot.
    parts
        .extensions
        .insert(OnStall::new(move || drop(give_back(&lease))));
    Ok(Response::from_parts(parts, body))
}

/// The lease, once.
fn give_back(lease: &Mutex<Option<Lease>>) -> Option<Lease> {
    lease.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The lease, given back when the body ends, fails or is dropped.
#[derive(Debug)]
struct Held(Arc<Mutex<Option<Lease>>>);

impl Tap for Held {
    fn ended(&mut self, _result: Result<(), &BoxError>) {
        drop(give_back(&self.0));
    }

    fn dropped(&mut self, _complete: bool) {
        drop(give_back(&self.0));
    }
}
