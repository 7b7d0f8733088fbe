//! The listener: TLS (rustls, ALPN h2/http1.1) or, only when asked, plain HTTP; hyper's
//! auto builder serves HTTP/1.1 and HTTP/2 on each connection; graceful shutdown lets the
//! requests in flight finish (streams included) up to the drain timeout. A connection with no
//! request in flight for `server.idle_timeout` is closed gracefully (GOAWAY on HTTP/2; an idle
//! HTTP/1.1 connection is also bounded by the header timeout), so idle connections cannot
//! pile up. The probe listener (`server.probe_listen`) is served the same way,
//! with [`PROBE_CONNECTIONS`] of its own and [`Router::probe`]'s routes ([`Surface`]).

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sluice_engine::http::{accept_loop, connection_builder, Busy, Idle, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use http_body_util::BodyExt;

use crate::body::{Tap, TapBody};
use crate::routes::Router;

/// How long a client may take to finish the TLS handshake or send a request's headers.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections the probe listener holds open at once: probes and scrapes come from a few
/// agents (a kubelet, a Prometheus or two), each with a connection or two.
pub const PROBE_CONNECTIONS: usize = 32;

/// TLS handshakes that never completed, on either listener: what a client that could not
/// connect (or a scanner, or a slowloris) leaves behind, on `/metrics` as
/// `sluice_tls_handshakes_failed_total`.
#[derive(Debug, Default)]
pub struct FailedHandshakes {
    refused: AtomicU64,
    timed_out: AtomicU64,
}

impl FailedHandshakes {
    /// Handshakes that ended in an error (not TLS, a version or suite the server does not
    /// offer, a client that went away).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Handshakes not done within [`HANDSHAKE_TIMEOUT`].
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }
}

/// Which routes a listener answers, and under which connection limit.
#[derive(Clone, Copy, Debug)]
pub enum Surface {
    /// Every route ([`Router::handle`]), for clients, at most the app's `connections`
    /// (`server.max_connections`) open at once.
    Clients,
    /// Health and metrics alone ([`Router::probe`]), on `server.probe_listen`, with
    /// [`PROBE_CONNECTIONS`] of its own: a gateway at `max_connections` still answers its
    /// probes and scrapes there.
    Probes,
}

/// One stop for every listener of a gateway: [`Stop::stop`] once, and the [`Stop::stopped`]
/// future each listener was given completes (whether it was taken before or after the stop).
#[derive(Clone, Debug, Default)]
pub struct Stop(Arc<watch::Sender<bool>>);

impl Stop {
    /// Stops every listener holding one of this stop's futures.
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// Completes once [`Stop::stop`] was called: the `shutdown` a listener's [`serve`] takes.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopping = self.0.subscribe();
        async move {
            // The sender lives as long as `self`'s clones; a dropped one means no stop will come.
            let _ = stopping.wait_for(|stopped| *stopped).await;
        }
    }
}

/// Serves `surface`'s routes of `router` on `listener` (over TLS when `tls` is given) until
/// `shutdown` completes; then stops accepting, lets in-flight requests finish for up to
/// `drain`, and returns.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    surface: Surface,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let limit = match surface {
        Surface::Clients => router.app.connections.clone(),
        Surface::Probes => router.app.probe_connections.clone(),
    };
    let builder = Arc::new(connection_builder(HANDSHAKE_TIMEOUT));
    let router = Arc::new(router);
    accept_loop(
        listener,
        shutdown,
        Some(drain),
        limit,
        move |stream, watcher| {
            let routes = Routes {
                router: router.clone(),
                surface,
            };
            connection(stream, tls.clone(), routes, builder.clone(), watcher)
        },
    )
    .await
}

/// A listener's router and the routes it answers there.
#[derive(Clone)]
struct Routes {
    router: Arc<Router>,
    surface: Surface,
}

async fn connection(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    routes: Routes,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
) {
    match tls {
        None => serve_connection(stream, routes, builder, watcher).await,
        Some(acceptor) => {
            let failed = routes.router.app.failed_handshakes.clone();
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => serve_connection(tls, routes, builder, watcher).await,
                Ok(Err(e)) => {
                    failed.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("TLS handshake: {e}");
                }
                Err(_) => {
                    failed.timed_out.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("TLS handshake not done within {HANDSHAKE_TIMEOUT:?}");
                }
            }
        }
    }
}

/// One connection, shut down gracefully when `watcher` says so.
async fn serve_connection<IO>(
    io: IO,
    routes: Routes,
    builder: Arc<auto::Builder<TokioExecutor>>,
    watcher: Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The first request's headers within the handshake bound too (hyper's header timeout only
    // starts once it knows the protocol: not for a client silent after TLS, nor over HTTP/2).
    let idle_timeout = routes
        .router
        .app
        .policy
        .current()
        .policy
        .server
        .idle_timeout;
    let idle = Idle::new(idle_timeout).first_request_within(HANDSHAKE_TIMEOUT);
    let activity = idle.clone();
    let service = service_fn(move |req| {
        let routes = routes.clone();
        // Counted from the request's arrival until its response body's end (or drop).
        let busy = activity.busy();
        async move {
            let resp = match routes.surface {
                Surface::Clients => routes.router.handle(req).await?,
                Surface::Probes => routes.router.probe(req).await?,
            };
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

/// File descriptors the gateway needs beside its client connections (upstream connections,
/// Redis, the policy watch, logs), as a floor.
const FDS_BESIDE_CLIENTS: u64 = 64;

/// Warns when the process's soft limit on open files leaves fewer than [`FDS_BESIDE_CLIENTS`]
/// beside `max_connections`: the connection limit would never be reached, accepting would fail
/// with "too many open files" instead. Linux only (`/proc/self/limits`); silent elsewhere.
pub fn warn_if_fds_short(max_connections: usize) {
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else {
        return;
    };
    if let Some(soft) = soft_open_files(&limits) {
        let needed = max_connections as u64 + FDS_BESIDE_CLIENTS;
        if soft < needed {
            tracing::warn!(
                soft_limit = soft,
                max_connections,
                "the open-files limit is below server.max_connections + {FDS_BESIDE_CLIENTS}: \
                 raise it (ulimit -n, LimitNOFILE=) or lower server.max_connections"
            );
        }
    }
}

/// The soft limit of "Max open files" in `/proc/self/limits` (`None`: unlimited or unread).
fn soft_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Holds a connection's [`Busy`] mark until the response body ends or is dropped.
struct Held {
    _busy: Busy,
}

impl Tap for Held {}

#[cfg(test)]
mod tests {
    use super::{soft_open_files, Duration, Stop};

    #[test]
    fn the_soft_open_files_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95360                95360                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
        assert_eq!(soft_open_files(""), None);
    }

    #[tokio::test(start_paused = true)]
    async fn one_stop_ends_every_listeners_wait_taken_before_or_after_it() {
        let stop = Stop::default();
        let before = tokio::spawn(stop.stopped());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!before.is_finished(), "ended before the stop");
        stop.clone().stop();
        tokio::time::timeout(Duration::from_millis(1), before)
            .await
            .expect("a wait taken before the stop ends at the stop")
            .expect("the wait's task");
        tokio::time::timeout(Duration::from_millis(1), stop.stopped())
            .await
            .expect("a wait taken after the stop ends at once");
    }
}
