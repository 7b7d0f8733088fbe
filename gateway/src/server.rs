//! The listener: TLS (rustls, ALPN h2/http1.1) or, only when asked, plain HTTP; hyper's
//! auto builder serves HTTP/1.1 and HTTP/2 on each connection; graceful shutdown lets the
//! requests in flight finish (streams included) up to the drain timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let router = Arc::new(router);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let conn = connection(stream, tls.clone(), router.clone(), builder.clone(), stop_rx.clone());
                    conns.spawn(conn);
                }
                Err(e) => accept_error(e).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let drained =
        tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            "{} connections still open after the {drain:?} drain; closing them",
            conns.len()
        );
        conns.shutdown().await;
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

async fn connection(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    router: Arc<Router>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    stop: watch::Receiver<bool>,
) {
    match tls {
        None => serve_connection(stream, router, builder, stop).await,
        Some(acceptor) => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_connection(tls, router, builder, stop).await,
                Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                Err(_) => tracing::debug!("TLS handshake timed out"),
            }
        }
    }
}

/// One connection, shut down gracefully when `stop` turns true.
async fn serve_connection<IO>(
    io: IO,
    router: Arc<Router>,
    builder: Arc<auto::Builder<TokioExecutor>>,
    mut stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let router = router.clone();
        async move { router.handle(req).await }
    });
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        res = conn.as_mut() => {
            if let Err(e) = res {
                tracing::debug!("connection: {e}");
            }
            return;
        }
        _ = stop.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    if let Err(e) = conn.await {
        tracing::debug!("connection: {e}");
    }
}
