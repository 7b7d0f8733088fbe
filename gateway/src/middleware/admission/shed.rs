//! Load shedding: when admission is not ready (queue full), answer `overloaded` at once
//! instead of letting the request wait outside the queue, where nobody counts or bounds it.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::queue::{never_parked, Admission};
use crate::body::GatewayBody;
use crate::error::GatewayError;
use crate::middleware::auth::Caller;
use crate::telemetry::{QueueOutcome, RequestRecord};
use crate::BoxFuture;

/// Sheds calls made while the inner service was not ready.
#[derive(Clone, Debug)]
pub struct Shed<S> {
    inner: S,
    admission: Arc<Admission>,
    shed: bool,
}

impl<S> Shed<S> {
    pub fn new(inner: S, admission: Arc<Admission>) -> Self {
        Self {
            inner,
            admission,
            shed: false,
        }
    }
}

impl<S, B> Service<Request<B>> for Shed<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = GatewayError>,
    S::Future: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = GatewayError;
    type Future = BoxFuture<Result<Response<GatewayBody>, GatewayError>>;

    /// Always ready, so it never has to arrange a wake: the inner service is asked with a waker
    /// that does nothing ([`never_parked`]), of which admission keeps no copy (before 2026-12-04
    /// it kept the task's waker of every request shed, until the next dispatch).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        let waker = never_parked();
        let mut cx = Context::from_waker(&waker);
        match self.inner.poll_ready(&mut cx) {
            Poll::Pending => {
                self.shed = true;
                Poll::Ready(Ok(()))
            }
            ready => {
                self.shed = false;
                ready
            }
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if std::mem::take(&mut self.shed) {
            let class = Caller::class_of(req.extensions());
            let err = self.admission.overloaded(class);
            if let Some(r) = req.extensions().get::<RequestRecord>() {
                r.queue_refused(QueueOutcome::Shed);
            }
            return Box::pin(async move { Err(err) });
        }
        Box::pin(self.inner.call(req))
    }
}
