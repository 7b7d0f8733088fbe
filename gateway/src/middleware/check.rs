//! A layer that runs a synchronous check on each request: pass it on (possibly amended), or
//! refuse it with a [`GatewayError`]. Auth, rate limits and the token caps are checks.

use std::future::ready;
use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use crate::error::GatewayError;
use crate::BoxFuture;

/// A check of one request.
pub trait Check<B> {
    /// Inspects (and may amend) `req`; an error refuses it.
    fn check(&self, req: &mut Request<B>) -> Result<(), GatewayError>;
}

/// The layer of a [`Check`].
#[derive(Clone, Debug)]
pub struct CheckLayer<C> {
    check: C,
}

impl<C> CheckLayer<C> {
    pub fn new(check: C) -> Self {
        Self { check }
    }
}

impl<S, C: Clone> Layer<S> for CheckLayer<C> {
    type Service = CheckService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        CheckService {
            inner,
            check: self.check.clone(),
        }
    }
}

/// Runs the check, then the inner service.
#[derive(Clone, Debug)]
pub struct CheckService<S, C> {
    inner: S,
    check: C,
}

impl<S, C, B> Service<Request<B>> for CheckService<S, C>
where
    S: Service<Request<B>, Error = GatewayError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    C: Check<B>,
{
    type Response = S::Response;
    type Error = GatewayError;
    type Future = BoxFuture<Result<S::Response, GatewayError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        match self.check.check(&mut req) {
            Ok(()) => Box::pin(self.inner.call(req)),
            Err(e) => Box::pin(ready(Err(e))),
        }
    }
}
