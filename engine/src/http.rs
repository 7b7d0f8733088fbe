//! Serving HTTP: the accept loop and graceful drain shared by the engine's server and the
//! gateway's. Each connection is handed to the caller's closure with a [`Watcher`]; on shutdown
//! the listener closes, every watched connection finishes its requests in flight (streams
//! included) and closes, and the loop returns.

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
pub use hyper_util::server::graceful::Watcher;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

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

/// Accepts connections on `listener` (with `TCP_NODELAY`) and runs `serve` on each, until
/// `shutdown` completes; then drains: waits for the connections to finish gracefully, at most
/// `drain` when given, after which the rest are closed.
///
/// Accept errors (a connection reset before it was accepted, running out of file descriptors)
/// are logged and retried, so this returns `Ok` once shut down.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    drain: Option<Duration>,
    mut serve: F,
) -> std::io::Result<()>
where
    F: FnMut(TcpStream, Watcher) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    conns.spawn(serve(stream, graceful.watcher()));
                }
                Err(e) => accept_error(e).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let drained = async {
        graceful.shutdown().await;
        while conns.join_next().await.is_some() {}
    };
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
