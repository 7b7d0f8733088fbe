//! The response body: a whole buffer, or a server-sent-event stream fed by the engine.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};

use super::generation::SseStream;

/// What every response of the server carries.
#[derive(Debug)]
pub(crate) enum Body {
    /// The whole body (taken when sent).
    Full(Option<Bytes>),
    /// `text/event-stream` chunks as the engine produces tokens. Dropping it (the client went
    /// away) drops the engine's receiver, which aborts the request.
    Sse(Box<SseStream>),
}

impl Body {
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self::Full(Some(bytes.into()))
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Self::Sse(stream) => stream
                .poll_next(cx)
                .map(|chunk| chunk.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(bytes) => bytes.is_none(),
            Self::Sse(stream) => stream.is_done(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Sse(_) => SizeHint::default(),
        }
    }
}
