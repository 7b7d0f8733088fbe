//! Serving HTTP: the accept loop and graceful drain shared by the engine's server and the
//! gateway's. Each connection is handed to the caller's closure with a [`Watcher`]; on shutdown
//! the listener closes, every watched connection finishes its requests in flight (streams
//! included) and closes, and the loop returns. A connection watched with an [`Idle`] also
//! closes gracefully (GOAWAY on HTTP/2) once it has had no request in flight for its limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

/// The most an HTTP/1.1 request's head (request line and headers) may take; past it the
/// client gets 431. HTTP/2 has its own bound, hyper's 16 KiB header list.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// An HTTP/1.1 + HTTP/2 connection builder; `header_read_timeout` bounds how long a client may
/// take to send a request's headers (and the keep-alive idle time of HTTP/1 connections).
/// Heads are bounded by [`MAX_HEAD_BYTES`] (hyper's default, 400 KiB, lets each slow
/// connection pin that much); HTTP/2 keeps hyper's limits of 200 concurrent streams per
/// connection and reset-flood protection.
pub fn connection_builder(header_read_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// How many connections a server holds open at once. At the limit the accept loop keeps the
/// connection it just accepted waiting (unserved) and accepts no more until one closes: new
/// connections wait in the kernel's listen backlog instead of each taking a file descriptor, a
/// task and a TLS handshake.
#[derive(Clone, Debug)]
pub struct ConnectionLimit {
    slots: Arc<tokio::sync::Semaphore>,
    max: usize,
    /// Connections that waited for another to close, and when that was last logged.
    waited: Arc<Mutex<(u64, Option<Instant>)>>,
}

/// At most one warning a minute while the limit is reached.
const LIMIT_WARN_EVERY: Duration = Duration::from_secs(60);

impl ConnectionLimit {
    /// At most `max` connections (at least one).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        ConnectionLimit {
            slots: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
            waited: Arc::default(),
        }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections being served now.
    pub fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// How many accepted connections had to wait for another to close.
    pub fn waited(&self) -> u64 {
        self.waited.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// A slot for a connection just accepted, waiting for one to close at the limit (logged at
    /// most once every [`LIMIT_WARN_EVERY`]).
    async fn slot(&self) -> tokio::sync::OwnedSemaphorePermit {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return slot;
        }
        {
            let mut waited = self.waited.lock().unwrap_or_else(PoisonError::into_inner);
            waited.0 += 1;
            let now = Instant::now();
            if waited.1.is_none_or(|last| now - last >= LIMIT_WARN_EVERY) {
                waited.1 = Some(now);
                tracing::warn!(
                    max = self.max,
                    times = waited.0,
                    "connection limit reached; new connections wait in the listen backlog"
                );
            }
        }
        self.slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }
}

/// Accepts connections on `listener` (with `TCP_NODELAY`), at most `limit` served at once, and
/// runs `serve` on each, until `shutdown` completes; then drains: waits for the connections to
/// finish gracefully, at most `drain` when given, after which the rest are closed.
///
/// Accept errors (a connection reset before it was accepted, running out of file descriptors)
/// are logged and retried, so this returns `Ok` once shut down.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    drain: Option<Duration>,
    limit: ConnectionLimit,
    mut serve: F,
) -> std::io::Result<()>
where
    F: FnMut(TcpStream, Watcher) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (stop, stopping) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    'accepting: loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // At the limit this connection waits, and no other is accepted meanwhile.
                    // (A connection's slot goes back when its task ends, joined or not.)
                    let held = tokio::select! {
                        () = &mut shutdown => break 'accepting,
                        held = limit.slot() => held,
                    };
                    let _ = stream.set_nodelay(true);
                    let conn = serve(stream, Watcher(stopping.clone()));
                    conns.spawn(async move {
                        conn.await;
                        drop(held);
                    });
                }
                Err(e) => accept_error(e).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = async { while conns.join_next().await.is_some() {} };
    match drain {
        None => drained.await,
        Some(limit) => {
            if tokio::time::timeout(limit, drained).await.is_err() {
                tracing::warn!("connections still open after the {limit:?} drain; closing them");
            }
        }
    }
    Ok(())
}

async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
        | TimedOut => tracing::debug!("accept: {e}"),
        // Out of file descriptors or memory: back off instead of spinning.
        _ => {
            tracing::warn!("accept failed: {e}; retrying");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What a connection watches: the server's shutdown.
#[derive(Clone, Debug)]
pub struct Watcher(watch::Receiver<bool>);

impl Watcher {
    /// Drives `conn` to its end, shutting it down gracefully (requests in flight finish, then
    /// it closes) when the server shuts down. The future resolves to the connection's own
    /// result (an error: a client that broke the protocol or went away).
    pub fn watch<C: GracefulConnection>(self, conn: C) -> Watched<C> {
        Watched::new(conn, self, None)
    }

    /// As [`Watcher::watch`], and also shuts the connection down gracefully once `idle` says
    /// it has had no request in flight for its limit.
    pub fn watch_idle<C: GracefulConnection>(self, conn: C, idle: Idle) -> Watched<C> {
        Watched::new(conn, self, Some(idle))
    }
}

/// How long an idle connection closed gracefully gets to finish closing (one that never brought
/// a request gets none): past it, it is dropped. HTTP/2's graceful close waits for the client's answer to a PING; a client that never
/// answers kept the connection (and its socket) for good.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// A connection driven under a [`Watcher`] (a hand-written future rather than an `async fn`,
/// whose `Send` proof trips over hyper's higher-ranked error bounds).
pub struct Watched<C> {
    conn: Pin<Box<C>>,
    /// Resolves when the server shuts down.
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    idle: Option<(Idle, Pin<Box<Sleep>>)>,
    closing: bool,
    /// Closing because idle: dropped at this deadline if not closed by then ([`CLOSE_GRACE`]).
    /// (Closing for the server's shutdown is bounded by its drain.)
    dropped_at: Option<Pin<Box<Sleep>>>,
}

impl<C> std::fmt::Debug for Watched<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("idle", &self.idle.as_ref().map(|(i, _)| i))
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

impl<C: GracefulConnection> Watched<C> {
    fn new(conn: C, watcher: Watcher, idle: Option<Idle>) -> Self {
        let mut rx = watcher.0;
        Self {
            conn: Box::pin(conn),
            stop: Box::pin(async move {
                let _ = rx.wait_for(|stop| *stop).await;
            }),
            idle: idle.map(|i| (i, Box::pin(tokio::time::sleep(Duration::ZERO)))),
            closing: false,
            dropped_at: None,
        }
    }
}

impl<C: GracefulConnection> Future for Watched<C> {
    type Output = Result<(), C::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            if let Poll::Ready(done) = this.conn.as_mut().poll(cx) {
                return Poll::Ready(done);
            }
            if this.closing {
                if let Some(at) = &mut this.dropped_at {
                    if at.as_mut().poll(cx).is_ready() {
                        tracing::debug!("an idle connection did not close within {CLOSE_GRACE:?}");
                        return Poll::Ready(Ok(()));
                    }
                }
                return Poll::Pending;
            }
            let stop = this.stop.as_mut().poll(cx).is_ready();
            let idle = match &mut this.idle {
                Some((idle, timer)) => match idle.closes_at() {
                    Some(at) if at <= Instant::now() => true,
                    at => {
                        // While a request is in flight, look again after a whole limit.
                        timer
                            .as_mut()
                            .reset(at.unwrap_or_else(|| Instant::now() + idle.limit));
                        // Registers the wake-up; a deadline already past loops once more.
                        if timer.as_mut().poll(cx).is_ready() {
                            continue;
                        }
                        false
                    }
                },
                None => false,
            };
            if !(stop || idle) {
                return Poll::Pending;
            }
            // Polled again at the top: the connection starts its graceful close.
            this.conn.as_mut().graceful_shutdown();
            this.closing = true;
            if idle && !stop {
                // A connection that never brought a request has nothing to finish.
                let seen = this.idle.as_ref().is_some_and(|(i, _)| i.seen());
                let grace = if seen { CLOSE_GRACE } else { Duration::ZERO };
                this.dropped_at = Some(Box::pin(tokio::time::sleep(grace)));
            }
        }
    }
}

/// One connection's requests in flight, and since when it has had none: what closes an idle
/// connection ([`Watcher::watch_idle`]).
#[derive(Clone, Debug)]
pub struct Idle {
    limit: Duration,
    /// The limit until the first request arrives, when shorter ([`Idle::first_request_within`]).
    first: Duration,
    state: Arc<IdleState>,
}

#[derive(Debug)]
struct IdleState {
    /// A request has arrived.
    seen: std::sync::atomic::AtomicBool,
    in_flight: AtomicUsize,
    /// When the last request in flight ended (or the connection opened).
    since: Mutex<Instant>,
}

impl Idle {
    /// A connection that may stay `limit` without a request in flight.
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            first: limit,
            state: Arc::new(IdleState {
                seen: std::sync::atomic::AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                since: Mutex::new(Instant::now()),
            }),
        }
    }

    /// The connection must bring its first request within `first` of opening (when shorter
    /// than the limit): one that opens and sends nothing (or only part of HTTP/2's preface,
    /// before which no header timeout runs) is closed then, not after the whole idle limit.
    pub fn first_request_within(mut self, first: Duration) -> Self {
        self.first = first.min(self.limit);
        self
    }

    /// Whether a request has arrived on the connection.
    pub fn seen(&self) -> bool {
        self.state.seen.load(Ordering::SeqCst)
    }

    /// A request is in flight until the returned guard drops (keep it with the response body,
    /// so that a stream counts until its last byte).
    pub fn busy(&self) -> Busy {
        self.state.seen.store(true, Ordering::SeqCst);
        self.state.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.state.clone())
    }

    /// When the connection will have been idle for its limit; `None` while a request is in
    /// flight.
    pub fn closes_at(&self) -> Option<Instant> {
        if self.state.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = *self
            .state
            .since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let limit = if self.seen() { self.limit } else { self.first };
        Some(since + limit)
    }
}

/// A request in flight on an [`Idle`] connection.
#[derive(Debug)]
pub struct Busy(Arc<IdleState>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut since = self.0.since.lock().unwrap_or_else(PoisonError::into_inner);
        *since = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a limit of 2, a third connection is not taken until one of the first two closes.
    #[tokio::test]
    async fn past_the_connection_limit_accepting_waits_for_a_close() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let limit = ConnectionLimit::new(2);
        let (served, mut serving) = tokio::sync::mpsc::unbounded_channel();
        let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(accept_loop(
            listener,
            async move {
                let _ = stopped.await;
            },
            None,
            limit.clone(),
            move |mut stream, _watcher| {
                let served = served.clone();
                async move {
                    let mut byte = [0u8; 1];
                    let _ = stream.read(&mut byte).await;
                    let _ = served.send(byte[0]);
                    // Open until the client closes.
                    while stream.read(&mut byte).await.is_ok_and(|n| n > 0) {}
                }
            },
        ));
        let mut clients = Vec::new();
        for id in 1..=3u8 {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            tokio::io::AsyncWriteExt::write_all(&mut c, &[id])
                .await
                .expect("write");
            clients.push(c);
        }
        let first_two = [serving.recv().await, serving.recv().await];
        assert_eq!(first_two, [Some(1), Some(2)]);
        let third = tokio::time::timeout(Duration::from_millis(300), serving.recv()).await;
        assert!(third.is_err(), "the third was served past the limit");
        assert_eq!(
            (limit.open(), limit.waited()),
            (2, 1),
            "two served, one waited"
        );
        drop(clients.remove(0));
        let third = tokio::time::timeout(Duration::from_secs(5), serving.recv()).await;
        assert_eq!(third.expect("served once the first closed"), Some(3));
        assert_eq!((limit.open(), limit.waited()), (2, 1));
        drop(clients);
        let closed = async {
            while limit.open() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("every slot back once the clients left");
        assert_eq!(limit.waited(), 1, "reaching the limit alone is no wait");
        server.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_must_bring_its_first_request_sooner() {
        let idle = Idle::new(Duration::from_secs(75)).first_request_within(Duration::from_secs(10));
        let opened = Instant::now();
        assert_eq!(idle.closes_at(), Some(opened + Duration::from_secs(10)));
        drop(idle.busy());
        assert_eq!(
            idle.closes_at(),
            Some(opened + Duration::from_secs(75)),
            "the whole limit once a request came"
        );
    }

    /// An HTTP/2 client that sends its preface and settings, then never answers: closed for
    /// idleness (GOAWAY and a PING it never answers), then dropped after [`CLOSE_GRACE`].
    #[tokio::test(start_paused = true)]
    async fn an_idle_http2_client_that_never_answers_the_close_is_dropped() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (server, mut client) = tokio::io::duplex(1 << 16);
        let service = hyper::service::service_fn(|_req| async {
            Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new()))
        });
        let builder = connection_builder(Duration::from_secs(10));
        let (_stop, stopping) = watch::channel(false);
        let idle = Idle::new(Duration::from_secs(5));
        // As if a request had come and gone (a connection that never brought one is dropped
        // at once when it goes idle).
        drop(idle.busy());
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let watched = Watcher(stopping).watch_idle(conn, idle);
        tokio::pin!(watched);
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .expect("preface");
        // Read what the server sends (its settings, then GOAWAY and PING), never answering.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
        });
        let graced = Duration::from_secs(5) + CLOSE_GRACE - Duration::from_secs(1);
        let early = tokio::time::timeout(graced, &mut watched).await;
        assert!(early.is_err(), "closed before its grace ran out");
        let closed = tokio::time::timeout(Duration::from_secs(2), &mut watched).await;
        assert!(closed.is_ok(), "the connection is still open");
        reader.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_end_of_the_last_request() {
        let idle = Idle::new(Duration::from_secs(60));
        let opened = Instant::now();
        assert_eq!(idle.closes_at(), Some(opened + Duration::from_secs(60)));
        let a = idle.busy();
        let b = idle.busy();
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(idle.closes_at(), None, "requests in flight");
        drop(a);
        assert_eq!(idle.closes_at(), None, "one still in flight");
        tokio::time::advance(Duration::from_secs(10)).await;
        drop(b);
        assert_eq!(
            idle.closes_at(),
            Some(opened + Duration::from_secs(160)),
            "60 s after the last one ended"
        );
    }
}
