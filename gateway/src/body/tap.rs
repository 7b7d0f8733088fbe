//! Watching a response body go by: a [`Tap`] sees every frame and how the body ended, without
//! changing a byte. The slot, the token budget and the outcome accounting are taps.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{BoxError, GatewayBody};

/// What a tap is told.
pub trait Tap: Send + Unpin + 'static {
    /// A data frame went by.
    fn data(&mut self, _data: &Bytes) {}

    /// The body ended: `Ok` after its last frame, `Err` when it broke off. Called once.
    fn ended(&mut self, _result: Result<(), &BoxError>) {}

    /// The body was dropped before it ended (the client went away), unless `complete`: hyper
    /// stops polling a body once it has sent `Content-Length` bytes, without asking for its end.
    fn dropped(&mut self, _complete: bool) {}
}

/// A body passed through unchanged under a [`Tap`].
#[derive(Debug)]
pub struct TapBody<T: Tap> {
    inner: GatewayBody,
    tap: T,
    ended: bool,
}

impl<T: Tap> TapBody<T> {
    pub fn new(inner: GatewayBody, tap: T) -> Self {
        Self {
            inner,
            tap,
            ended: false,
        }
    }
}

impl<T: Tap> Body for TapBody<T> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    this.tap.data(d);
                }
            }
            Poll::Ready(Some(Err(e))) if !this.ended => {
                this.ended = true;
                this.tap.ended(Err(e));
            }
            Poll::Ready(None) if !this.ended => {
                this.ended = true;
                this.tap.ended(Ok(()));
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<T: Tap> Drop for TapBody<T> {
    fn drop(&mut self) {
        if !self.ended {
            self.tap.dropped(self.inner.is_end_stream());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http_body_util::BodyExt;

    use super::*;

    #[derive(Debug, Default, Clone)]
    struct Log(Arc<Mutex<Vec<String>>>);

    impl Tap for Log {
        fn data(&mut self, data: &Bytes) {
            self.0
                .lock()
                .expect("lock")
                .push(format!("data {}", data.len()));
        }
        fn ended(&mut self, r: Result<(), &BoxError>) {
            self.0
                .lock()
                .expect("lock")
                .push(format!("ended {}", r.is_ok()));
        }
        fn dropped(&mut self, complete: bool) {
            self.0
                .lock()
                .expect("lock")
                .push(format!("dropped {complete}"));
        }
    }

    #[tokio::test]
    async fn a_tap_sees_frames_and_one_end() {
        let log = Log::default();
        let body = TapBody::new(super::super::full("hello"), log.clone());
        assert_eq!(body.collect().await.expect("body").to_bytes(), "hello");
        assert_eq!(*log.0.lock().expect("lock"), ["data 5", "ended true"]);
    }

    #[tokio::test]
    async fn a_body_dropped_midway_says_so() {
        let log = Log::default();
        let (_tx, inner) = http_body_util::channel::Channel::<Bytes, BoxError>::new(1);
        drop(TapBody::new(inner.boxed_unsync(), log.clone()));
        // All its bytes were read but its end was never asked for: complete.
        let log2 = Log::default();
        let mut body = TapBody::new(super::super::full("x"), log2.clone());
        assert!(body.frame().await.is_some());
        drop(body);
        assert_eq!(*log.0.lock().expect("lock"), ["dropped false"]);
        assert_eq!(*log2.0.lock().expect("lock"), ["data 1", "dropped true"]);
    }
}
