//! The listener: TLS (rustls, ALPN h2/http1.1) or, only when asked, plain HTTP; hyper's
//! auto builder serves HTTP/1.1 and HTTP/2 on each connection; graceful shutdown lets the
//! requests in flight finish (streams included) up to the drain timeout. A connection with no
//! request in flight for `server.idle_timeout` is closed gracefully (GOAWAY on HTTP/2; an idle
//! HTTP/1.1 connection is also bounded by the header timeout), so idle connections cannot
//! pile up.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sluice_engine::http::{accept_loop, connection_builder, Busy, Idle, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use http_body_util::BodyExt;

use crate::body::{Tap, TapBody};
use crate::routes::Router;

/// How long a client may take to finish the TLS handshake or send a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` (over TLS when `tls` is given) until `shutdown` completes;
/// then stops accepting, lets in-flight requests finish for up to `drain`, and returns.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let builder = Arc::new(connection_builder(HANDSHAKE_TIMEOUT));
    let router = Arc::new(router);
    accept_loop(listener, shutdown, Some(drain), move |stream, watcher| {
        connection(
            stream,
            tls.clone(),
            router.clone(),
            builder.clone(),
            watcher,
        )
    })
    .await
}

async fn connection(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    router: Arc<Router>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
) {
    match tls {
        None => serve_connection(stream, router, builder, watcher).await,
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_connection(tls, router, builder, watcher).await,
                Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        }
    }
}

/// One connection, shut down gracefully when `watcher` says so.
async fn serve_connection<IO>(
    io: IO,
    router: Arc<Router>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The first request's headers within the handshake bound too (hyper's header timeout only
    // starts once it knows the protocol: not for a client silent after TLS, nor over HTTP/2).
    let idle = Idle::new(router.app.policy.current().policy.server.idle_timeout)
        .first_request_within(HANDSHAKE_TIMEOUT);
    let activity = idle.clone();
    let service = service_fn(move |req| {
        let router = router.clone();
        // Counted from the request's arrival until its response body's end (or drop).
        let busy = activity.busy();
        async move {
            let resp = router.handle(req).await?;
            Ok::<_, Infallible>(
                resp.map(|body| TapBody::new(body, Held { _busy: busy }).boxed_unsync()),
            )
        }
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch_idle(conn, idle).await {
        tracing::debug!("connection: {e}");
    }
}

/// Holds a connection's [`Busy`] mark until the response body ends or is dropped.
struct Held {
    _busy: Busy,
}

impl Tap for Held {}
