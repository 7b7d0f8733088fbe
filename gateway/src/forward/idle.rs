//! The upstream's idle timeout: a body that fails when the upstream sends nothing for too long,
//! so a stalled engine cannot hold a slot forever. A stream (`text/event-stream`) ends the way
//! the engine ends a failed stream — an error event, then `data: [DONE]` — so the client never
//! mistakes the cut for a normal end; any other body fails. A stream the upstream broke off
//! (a rank died, the connection dropped) ends the same way, with `upstream_error`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;
use crate::error::GatewayError;

pin_project! {
    /// A body that fails after `idle` without a frame (the upstream's body and the clock are
    /// held in place, not boxed).
    #[derive(Debug)]
    pub struct IdleBody<B> {
        #[pin]
        inner: B,
        idle: Duration,
        #[pin]
        sleep: Sleep,
        // The response is a server-sent-event stream.
        sse: bool,
        state: State,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Streaming,
    /// The error event was sent; `[DONE]` comes next.
    EventSent,
    Done,
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, idle: Duration, sse: bool) -> Self {
        Self {
            inner,
            idle,
            sleep: tokio::time::sleep(idle),
            sse,
            state: State::Streaming,
        }
    }
}

/// The error event that ends a stream; `[DONE]` follows.
fn event(state: &mut State, err: &GatewayError) -> Frame<Bytes> {
    *state = State::EventSent;
    Frame::data(Bytes::from(format!("data: {}\n\n", err.to_json())))
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.state {
            State::Done => return Poll::Ready(None),
            State::EventSent => {
                *this.state = State::Done;
                return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                    b"data: [DONE]\n\n",
                )))));
            }
            State::Streaming => {}
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            let frame = frame.map(|r| r.map_err(Into::into));
            let deadline = Instant::now() + *this.idle;
            this.sleep.as_mut().reset(deadline);
            match &frame {
                // A stream that broke off (the engine died, the connection was cut) ends
                // with an error event too, never with a bare cut.
                Some(Err(e)) if *this.sse => {
                    let err = GatewayError::Upstream(format!("the stream broke off: {e}"));
                    return Poll::Ready(Some(Ok(event(this.state, &err))));
                }
                None => *this.state = State::Done,
                Some(_) => {}
            }
            return Poll::Ready(frame);
        }
        if this.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let err = GatewayError::UpstreamTimeout(*this.idle);
        if *this.sse {
            return Poll::Ready(Some(Ok(event(this.state, &err))));
        }
        *this.state = State::Done;
        Poll::Ready(Some(Err(Box::new(err))))
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done || (self.state == State::Streaming && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::body::GatewayBody;

    fn stalled() -> (
        http_body_util::channel::Sender<Bytes, BoxError>,
        GatewayBody,
    ) {
        let (tx, body) = http_body_util::channel::Channel::new(4);
        (tx, body.boxed_unsync())
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_stream_ends_with_an_error_event_and_done() {
        let (mut tx, inner) = stalled();
        let mut body = std::pin::pin!(IdleBody::new(inner, Duration::from_secs(300), true));
        tx.send_data(Bytes::from_static(b"data: {}\n\n"))
            .await
            .expect("send");
        let first = body.frame().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().expect("data"), "data: {}\n\n");
        // Nothing for 300 s: the error event, then the error.
        let started = Instant::now();
        let event = body.frame().await.expect("frame").expect("ok");
        assert_eq!(started.elapsed(), Duration::from_secs(300));
        let text = String::from_utf8(event.into_data().expect("data").to_vec()).expect("utf8");
        assert!(text.contains("upstream_timeout"), "{text}");
        let done = body.frame().await.expect("frame").expect("ok");
        assert_eq!(done.into_data().expect("data"), "data: [DONE]\n\n");
        assert!(body.frame().await.is_none());
        drop(tx);
    }

    #[tokio::test]
    async fn a_stream_broken_off_ends_with_an_error_event_and_done() {
        let (mut tx, inner) = stalled();
        let mut body = std::pin::pin!(IdleBody::new(inner, Duration::from_secs(300), true));
        tx.send_data(Bytes::from_static(b"data: {}\n\n"))
            .await
            .expect("send");
        body.frame().await.expect("frame").expect("ok");
        tx.abort(Box::new(std::io::Error::other("connection reset")));
        let event = body
            .frame()
            .await
            .expect("frame")
            .expect("an event, not an error");
        let text = String::from_utf8(event.into_data().expect("data").to_vec()).expect("utf8");
        assert!(
            text.contains("upstream_error") && text.contains("broke off"),
            "{text}"
        );
        let done = body.frame().await.expect("frame").expect("ok");
        assert_eq!(done.into_data().expect("data"), "data: [DONE]\n\n");
    }

    #[tokio::test(start_paused = true)]
    async fn frames_reset_the_clock_and_a_plain_body_just_fails() {
        let (mut tx, inner) = stalled();
        let mut body = std::pin::pin!(IdleBody::new(inner, Duration::from_secs(10), false));
        for _ in 0..5 {
            tokio::time::advance(Duration::from_secs(9)).await;
            tx.send_data(Bytes::from_static(b"x")).await.expect("send");
            assert!(body.frame().await.expect("frame").is_ok());
        }
        let err = body.frame().await.expect("frame").expect_err("idle");
        assert!(err.to_string().contains("sent nothing"), "{err}");
    }
}
