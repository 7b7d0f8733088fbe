//! Body limit and JSON parsing (stack layer 4): reads the whole body (413 past
//! `server.body_limit_bytes`), parses it (400 naming the line and column), and makes the
//! request a [`Json`] one for the layers after it.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use sluice_engine::server::prompt::Endpoint;
use tower::{Layer, Service, ServiceExt};

use crate::error::GatewayError;
use crate::policy::PolicyStore;
use crate::BoxFuture;

/// A parsed request body, and the endpoint it is for.
#[derive(Clone, Debug, PartialEq)]
pub struct Json {
    pub endpoint: Endpoint,
    pub value: serde_json::Value,
    /// The body's size as it came in (0 when unknown): the buffer size for [`Json::encode`].
    pub received: usize,
}

impl Json {
    /// A body of unknown size.
    pub fn new(endpoint: Endpoint, value: serde_json::Value) -> Self {
        Self {
            endpoint,
            value,
            received: 0,
        }
    }

    /// `value` as JSON, written into one buffer of about the size it came in.
    pub fn encode(&self) -> Result<bytes::Bytes, serde_json::Error> {
        let mut out = Vec::with_capacity(self.received + 64);
        serde_json::to_writer(&mut out, &self.value)?;
        Ok(out.into())
    }
}

/// The layer.
#[derive(Clone, Debug)]
pub struct ParseLayer {
    policy: Arc<PolicyStore>,
}

impl ParseLayer {
    pub fn new(policy: Arc<PolicyStore>) -> Self {
        Self { policy }
    }
}

impl<S> Layer<S> for ParseLayer {
    type Service = Parse<S>;

    fn layer(&self, inner: S) -> Parse<S> {
        Parse {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// Reads and parses the body, then calls the inner service with it.
#[derive(Clone, Debug)]
pub struct Parse<S> {
    inner: S,
    policy: Arc<PolicyStore>,
}

impl<S, B> Service<Request<B>> for Parse<S>
where
    S: Service<Request<Json>, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = GatewayError;
    type Future = BoxFuture<Result<S::Response, GatewayError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let limit = self
            .policy
            .of(req.extensions())
            .policy
            .server
            .body_limit_bytes;
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let endpoint =
                Endpoint::from_path(parts.uri.path()).ok_or_else(|| GatewayError::NotFound {
                    method: parts.method.to_string(),
                    path: parts.uri.path().to_owned(),
                })?;
            let bytes = read_body(body, limit).await?;
            let value = serde_json::from_slice(&bytes)
                .map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
            let json = Json {
                endpoint,
                value,
                received: bytes.len(),
            };
            let req = Request::from_parts(parts, json);
            inner.oneshot(req).await
        })
    }
}

/// The longest a request body may go without a byte: a client that stalls mid-upload is
/// answered 408 `request_timeout` (it held its connection, and over HTTP/2 up to 200 streams of
/// buffered bytes, for good). The same bound as a request's headers.
pub const BODY_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The whole body, at most `limit` bytes, each frame within [`BODY_IDLE`] of the last.
pub async fn read_body<B>(body: B, limit: usize) -> Result<bytes::Bytes, GatewayError>
where
    B: Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let mut body = std::pin::pin!(Limited::new(body, limit));
    let mut out = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(BODY_IDLE, body.frame()).await {
            Err(_) => return Err(GatewayError::BodyTimeout(BODY_IDLE)),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) if e.is::<LengthLimitError>() => {
                return Err(GatewayError::BodyTooLarge { limit })
            }
            Ok(Some(Err(e))) => return Err(GatewayError::UnreadableBody(e.to_string())),
        };
        if let Ok(data) = frame.into_data() {
            bytes::BufMut::put(&mut out, data);
        }
    }
}

#[cfg(test)]
mod tests;
