//! A client that stops reading its response: hyper takes a frame of the body and then does not
//! come back for the next one (over HTTP/2 a client can keep its flow-control window shut; over
//! HTTP/1 the socket's buffers fill), so nothing that runs only when the body is polled (the idle
//! timeout, the end that gives the admission slot back) ever runs. [`watch_writes`] notices it
//! apart from polling: a frame handed over and not followed by the next poll within the limit
//! is a stall. Time waiting on the upstream (a long prefill: the body's poll returned Pending) is
//! never one.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::{BoxError, GatewayBody};

/// `body`, whose writes are watched: `on_stall` runs once (in a task of its own) when a frame
/// handed to the client's connection is not followed by the next poll within `limit`. The watch
/// ends with the body.
pub fn watch_writes(
    body: GatewayBody,
    limit: Duration,
    on_stall: impl FnOnce() + Send + 'static,
) -> GatewayBody {
    let handed = Arc::new(Mutex::new(None));
    let watch = handed.clone();
    // Dropped with the body: the watch ends then (its timer and task gone at once, not at
    // its next check: at a thousand responses a second those would pile up).
    let (alive, gone) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::pin!(gone);
        let mut check = Instant::now() + limit;
        loop {
            tokio::select! {
                _ = &mut gone => return,
                () = tokio::time::sleep_until(check) => {}
            }
            let at: Option<Instant> = *watch.lock().unwrap_or_else(PoisonError::into_inner);
            match at {
                Some(at) if at + limit <= Instant::now() => break,
                Some(at) => check = at + limit,
                None => check = Instant::now() + limit,
            }
        }
        on_stall();
    });
    Watched {
        inner: body,
        handed,
        _alive: alive,
    }
    .boxed_unsync()
}

/// What a stage inside admission gives back when its response's client stops reading (the
/// shared ceiling's lease), carried out in the response's extensions to admission's watch
/// ([`crate::middleware::admission::slot_body`]): one watch, one task, a response.
#[derive(Clone)]
pub struct OnStall(Arc<Mutex<Option<GiveBack>>>);

/// What [`OnStall`] runs.
type GiveBack = Box<dyn FnOnce() + Send>;

impl std::fmt::Debug for OnStall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnStall").finish_non_exhaustive()
    }
}

impl OnStall {
    /// `f`, to run at most once.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        OnStall(Arc::new(Mutex::new(Some(Box::new(f)))))
    }

    /// Runs it (once).
    pub fn run(&self) {
        let f = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(f) = f {
            f();
        }
    }
}

/// The body and when it last handed a frame over that the connection has not come back after.
struct Watched {
    inner: GatewayBody,
    handed: Arc<Mutex<Option<Instant>>>,
    /// Its drop ends the watch.
    _alive: tokio::sync::oneshot::Sender<()>,
}

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        let handed = matches!(polled, Poll::Ready(Some(Ok(_)))).then(Instant::now);
        *self.handed.lock().unwrap_or_else(PoisonError::into_inner) = handed;
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn flag() -> (Arc<AtomicBool>, impl FnOnce() + Send + 'static) {
        let f = Arc::new(AtomicBool::new(false));
        let set = f.clone();
        (f, move || set.store(true, Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_not_followed_by_the_next_poll_is_a_stall() {
        let (tx, rx) = http_body_util::channel::Channel::<Bytes, BoxError>::new(4);
        let (stalled, on_stall) = flag();
        let mut body = watch_writes(rx.boxed_unsync(), Duration::from_secs(60), on_stall);
        let mut tx = tx;
        tx.send_data(Bytes::from_static(b"data: a\n\n"))
            .await
            .expect("send");
        body.frame().await.expect("frame").expect("ok");
        // The client takes no more for 59 s: not yet; past 60 s: a stall.
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!stalled.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(stalled.load(Ordering::SeqCst));
        drop(body);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_on_the_upstream_is_never_a_stall() {
        let (mut tx, rx) = http_body_util::channel::Channel::<Bytes, BoxError>::new(4);
        let (stalled, on_stall) = flag();
        let mut body = watch_writes(rx.boxed_unsync(), Duration::from_secs(60), on_stall);
        // A prefill of five minutes: the connection waits on the body the whole time.
        let reader = tokio::spawn(async move {
            let mut n = 0;
            while let Some(f) = body.frame().await {
                f.expect("ok");
                n += 1;
            }
            n
        });
        tokio::time::sleep(Duration::from_secs(300)).await;
        tx.send_data(Bytes::from_static(b"data: a\n\n"))
            .await
            .expect("send");
        drop(tx);
        assert_eq!(reader.await.expect("task"), 1);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(!stalled.load(Ordering::SeqCst));
    }
}
