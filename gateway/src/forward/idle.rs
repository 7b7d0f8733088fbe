//! The upstream's response body on its way to the client.
//!
//! - **Idle timeout:** the body fails when the upstream sends nothing for too long, so a
//!   stalled engine cannot hold a slot forever. A stream (`text/event-stream`) ends the way the
//!   engine ends a failed stream (an error event, then `data: [DONE]`), so the client never
//!   mistakes the cut for a normal end; any other body fails. A stream the upstream broke off
//!   (a rank died, the connection dropped) ends the same way, with `upstream_error`.
//! - **Whole events:** a stream is passed on an event at a time (the upstream's frames almost
//!   always are), holding back a trailing half event until its end arrives, so that the error
//!   event never lands inside a half-sent one, where the client's parser would lose it.
//! - **The replica's health:** the body holds the request's [`Lease`] until it ends. A stream
//!   that breaks off or stalls is the replica's failure, and a stream that ends well its
//!   success (counted here, not on the response's headers: a replica whose streams all break
//!   after a good start must be ejected).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::replicas::Lease;
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
        // What of the stream is not a whole event yet.
        partial: BytesMut,
        // The replica the body comes from, until the body ends.
        lease: Option<Lease>,
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
            partial: BytesMut::new(),
            lease: None,
            state: State::Streaming,
        }
    }

    /// Holds `lease` until the body ends: a break or a stall is its replica's failure, a
    /// stream's good end its success.
    pub fn holding(mut self, lease: Lease) -> Self {
        self.lease = Some(lease);
        self
    }
}

/// The error event that ends a stream; `[DONE]` follows.
fn event(state: &mut State, err: &GatewayError) -> Frame<Bytes> {
    *state = State::EventSent;
    Frame::data(Bytes::from(format!("data: {}\n\n", err.to_json())))
}

/// The most of one event held back waiting for its end: past it the bytes go on as they are
/// (an upstream that never sends a blank line, or ends its lines with a bare CR, was held whole
/// to the stream's end, rescanned at every frame).
const PARTIAL_MAX: usize = 1 << 20;

/// Where the last whole event in `buf` ends (after its blank line), if one does. SSE lines end
/// with CRLF, LF or CR, so an event ends at LF LF, CR CR or LF CRLF (CRLF CRLF included).
fn events_end(buf: &[u8]) -> Option<usize> {
    [&b"\n\n"[..], b"\r\r", b"\n\r\n"]
        .iter()
        .filter_map(|p| {
            buf.windows(p.len())
                .rposition(|w| w == *p)
                .map(|i| i + p.len())
        })
        .max()
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
        while let Poll::Ready(frame) = this.inner.as_mut().poll_frame(cx) {
            let deadline = Instant::now() + *this.idle;
            this.sleep.as_mut().reset(deadline);
            match frame {
                Some(Ok(frame)) if *this.sse => {
                    let data = match frame.into_data() {
                        Ok(data) => data,
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    };
                    if this.partial.is_empty() && data.ends_with(b"\n\n") {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    let scanned = this.partial.len().saturating_sub(3);
                    this.partial.extend_from_slice(&data);
                    // Only the new bytes (and the 3 before them) can end an event.
                    if let Some(end) = events_end(&this.partial[scanned..]) {
                        let whole = this.partial.split_to(scanned + end).freeze();
                        return Poll::Ready(Some(Ok(Frame::data(whole))));
                    }
                    if this.partial.len() > PARTIAL_MAX {
                        let held = this.partial.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(held))));
                    }
                    // Only part of an event so far: wait for the rest.
                }
                Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                Some(Err(e)) => {
                    let e: BoxError = e.into();
                    if let Some(lease) = this.lease.take() {
                        lease.failed();
                    }
                    if !*this.sse {
                        *this.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    // A stream that broke off (the engine died, the connection was cut) ends
                    // with an error event too, never with a bare cut; a half event is dropped.
                    this.partial.clear();
                    let err = GatewayError::Upstream(format!("the stream broke off: {e}"));
                    return Poll::Ready(Some(Ok(event(this.state, &err))));
                }
                None => {
                    *this.state = State::Done;
                    if let Some(lease) = this.lease.take() {
                        lease.succeeded();
                    }
                    if this.partial.is_empty() {
                        return Poll::Ready(None);
                    }
                    // The stream's last event had no blank line after it: it goes as it is.
                    return Poll::Ready(Some(Ok(Frame::data(this.partial.split().freeze()))));
                }
            }
        }
        if this.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(lease) = this.lease.take() {
            lease.failed();
        }
        let err = GatewayError::UpstreamTimeout(*this.idle);
        if *this.sse {
            this.partial.clear();
            return Poll::Ready(Some(Ok(event(this.state, &err))));
        }
        *this.state = State::Done;
        Poll::Ready(Some(Err(Box::new(err))))
    }

    fn is_end_stream(&self) -> bool {
        self.state == State::Done
            || (self.state == State::Streaming
                && self.partial.is_empty()
                && self.inner.is_end_stream())
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

    #[tokio::test]
    async fn a_stream_goes_by_whole_events_and_a_half_one_never_meets_the_error_event() {
        let (mut tx, inner) = stalled();
        let mut body = std::pin::pin!(IdleBody::new(inner, Duration::from_secs(300), true));
        tx.send_data(Bytes::from_static(b"data: {\"a\":1}\n\ndata: {\"b\""))
            .await
            .expect("send");
        let first = body.frame().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().expect("data"), "data: {\"a\":1}\n\n");
        tx.send_data(Bytes::from_static(b":2}\r\n\r\n"))
            .await
            .expect("send");
        let second = body.frame().await.expect("frame").expect("ok");
        assert_eq!(second.into_data().expect("data"), "data: {\"b\":2}\r\n\r\n");
        // Half an event, then the break: the client gets the error event on its own.
        tx.send_data(Bytes::from_static(b"data: {\"c\""))
            .await
            .expect("send");
        tx.abort(Box::new(std::io::Error::other("connection reset")));
        let event = body.frame().await.expect("frame").expect("ok");
        let text = String::from_utf8(event.into_data().expect("data").to_vec()).expect("utf8");
        assert!(text.starts_with("data: {\"error\""), "{text}");
        let done = body.frame().await.expect("frame").expect("ok");
        assert_eq!(done.into_data().expect("data"), "data: [DONE]\n\n");
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_last_event_without_its_blank_line_is_passed_on_at_the_end() {
        let (mut tx, inner) = stalled();
        let mut body = std::pin::pin!(IdleBody::new(inner, Duration::from_secs(300), true));
        tx.send_data(Bytes::from_static(b"data: [DONE]\n"))
            .await
            .expect("send");
        drop(tx);
        let last = body.frame().await.expect("frame").expect("ok");
        assert_eq!(last.into_data().expect("data"), "data: [DONE]\n");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }

    #[test]
    fn events_end_at_a_blank_line_of_any_line_ending() {
        assert_eq!(events_end(b"data: a\n\ndata: b"), Some(9));
        assert_eq!(events_end(b"data: a\r\rdata: b"), Some(9));
        assert_eq!(events_end(b"data: a\r\n\r\n"), Some(11));
        assert_eq!(events_end(b"data: a\n\r\n"), Some(10));
        assert_eq!(events_end(b"data: a\r\n"), None);
    }

    #[tokio::test]
    async fn events_with_bare_cr_lines_pass_as_they_come_and_an_endless_one_is_not_held() {
        let (mut tx, inner) = stalled();
        let mut body = std::pin::pin!(IdleBody::new(inner, Duration::from_secs(300), true));
        tx.send_data(Bytes::from_static(b"data: {}\r\r"))
            .await
            .expect("send");
        let first = body.frame().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().expect("data"), "data: {}\r\r");
        // An upstream that never ends its event: what is held goes on past PARTIAL_MAX.
        let line = Bytes::from(vec![b'x'; 64 << 10]);
        let sender = tokio::spawn(async move {
            for _ in 0..20 {
                if tx.send_data(line.clone()).await.is_err() {
                    return;
                }
            }
            std::future::pending::<()>().await;
        });
        let held = body.frame().await.expect("frame").expect("ok");
        assert!(held.into_data().expect("data").len() > PARTIAL_MAX);
        sender.abort();
    }
}
