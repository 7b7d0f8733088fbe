//! A layer that runs an asynchronous stage around the rest of the stack. The stage is handed
//! each request with the inner service (the clone driven to ready) and answers for both: it may
//! refuse, wait, amend the request, or wrap the response's body. The token budget and the
//! shared ceiling are stages; a [`super::check::Check`] is the synchronous kind that only
//! looks at the request.

use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::body::GatewayBody;
use crate::error::GatewayError;
use crate::BoxFuture;

/// What a stage answers.
pub type Answer = BoxFuture<Result<Response<GatewayBody>, GatewayError>>;

/// The rest of the stack, as a stage receives it: a ready service it may move into its answer.
pub trait Inner<B>:
    Service<
        Request<B>,
        Response = Response<GatewayBody>,
        Error = GatewayError,
        Future: Send + 'static,
    > + Send
    + 'static
{
}

impl<S, B> Inner<B> for S where
    S: Service<
            Request<B>,
            Response = Response<GatewayBody>,
            Error = GatewayError,
            Future: Send + 'static,
        > + Send
        + 'static
{
}

/// One stage around the inner service.
pub trait Around<B> {
    /// Answers `req`, calling `inner` (ready) if and when it sees fit.
    fn around<S: Inner<B>>(&self, req: Request<B>, inner: S) -> Answer;
}

/// The layer of an [`Around`] stage.
#[derive(Clone, Debug)]
pub struct AroundLayer<A> {
    stage: A,
}

impl<A> AroundLayer<A> {
    pub fn new(stage: A) -> Self {
        Self { stage }
    }
}

impl<S, A: Clone> Layer<S> for AroundLayer<A> {
    type Service = AroundService<S, A>;

    fn layer(&self, inner: S) -> Self::Service {
        AroundService {
            inner,
            stage: self.stage.clone(),
        }
    }
}

/// Hands each request and the ready inner service to the stage.
#[derive(Clone, Debug)]
pub struct AroundService<S, A> {
    inner: S,
    stage: A,
}

impl<S, A, B> Service<Request<B>> for AroundService<S, A>
where
    S: Inner<B> + Clone,
    A: Around<B>,
{
    type Response = Response<GatewayBody>;
    type Error = GatewayError;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Answer {
        // The clone that was driven to ready is the one called; a fresh clone stays here.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        self.stage.around(req, inner)
    }
}
