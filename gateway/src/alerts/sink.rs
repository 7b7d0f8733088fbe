//! Where notifications go: the [`AlertSink`] that posts one notification to one target, its
//! HTTP implementation, and the dispatcher that delivers in order without ever blocking the
//! evaluation.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::notice::Alert;
use super::Shared;
use crate::forward::client::{http_client, HttpClient};
use crate::tls::TlsError;

/// The longest one post may take.
pub const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Notifications waiting to be sent; more are dropped (and counted) while targets are slow.
pub const QUEUE: usize = 64;
/// At most one warning per target this often; failures in between are counted in the next.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// One receiver of notifications.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Alertmanager's base URL; notifications go to `{url}/api/v2/alerts`.
    Alertmanager(String),
    /// A plain JSON webhook, posted to as is.
    Webhook(String),
}

impl Target {
    /// The URL a notification is posted to.
    pub fn url(&self) -> String {
        match self {
            Self::Alertmanager(base) => format!("{}/api/v2/alerts", base.trim_end_matches('/')),
            Self::Webhook(url) => url.clone(),
        }
    }

    /// The target as errors and logs name it: an Alertmanager without the password of its
    /// userinfo, a webhook by its host alone (its path is its secret).
    pub fn shown(&self) -> String {
        match self {
            Self::Alertmanager(_) => crate::policy::redact::without_password(&self.url()),
            Self::Webhook(url) => crate::policy::redact::host_only(url),
        }
    }

    /// The JSON body this target takes for `alert`.
    pub fn body(&self, alert: &Alert) -> Value {
        match self {
            Self::Alertmanager(_) => Value::Array(vec![alert.alertmanager_json()]),
            Self::Webhook(_) => alert.webhook_json(),
        }
    }
}

/// Why a post failed; each names its target as [`Target::shown`] does.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}: not a URL the client can post to")]
    Url(String),
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{url}: answered {status}: {body}")]
    Status {
        url: String,
        status: StatusCode,
        body: String,
    },
    #[error("{0}: no answer within {POST_TIMEOUT:?}")]
    Timeout(String),
}

/// A boxed future of one post.
pub type PostFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SendError>> + Send + 'a>>;

/// Sends one notification to one target. [`HttpSink`] posts it; tests record it.
pub trait AlertSink: Send + Sync + fmt::Debug + 'static {
    fn post<'a>(&'a self, target: &'a Target, alert: &'a Alert) -> PostFuture<'a>;
}

/// Posts notifications over HTTP or HTTPS (TLS 1.2+, the client the gateway uses for its
/// upstreams: a chat webhook is usually `https://`, Alertmanager often plain HTTP beside the
/// gateway).
#[derive(Clone, Debug)]
pub struct HttpSink {
    client: HttpClient,
}

impl HttpSink {
    /// A sink that trusts `ca` (a PEM bundle, `alerts.ca`) for `https://` targets, or the
    /// system's roots without one.
    ///
    /// # Errors
    ///
    /// The CA file cannot be read or holds no certificate.
    pub fn new(ca: Option<&Path>) -> Result<Self, TlsError> {
        Ok(Self {
            client: http_client(ca)?,
        })
    }
}

impl AlertSink for HttpSink {
    fn post<'a>(&'a self, target: &'a Target, alert: &'a Alert) -> PostFuture<'a> {
        Box::pin(async move {
            let (url, shown) = (target.url(), target.shown());
            let body = serde_json::to_vec(&target.body(alert)).unwrap_or_default();
            let req = Request::builder()
                .method(Method::POST)
                .uri(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::USER_AGENT, "sluice-gateway")
                .body(Full::new(Bytes::from(body)))
                .map_err(|_| SendError::Url(shown.clone()))?;
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|source| SendError::Http {
                    url: shown.clone(),
                    source,
                })?;
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            Err(SendError::Status {
                url: shown,
                status,
                body: text.chars().take(200).collect(),
            })
        })
    }
}

/// Hands notifications to the delivery task: in order, each to all its targets at once.
#[derive(Debug)]
pub(super) struct Dispatcher {
    tx: mpsc::Sender<(Alert, Vec<Target>)>,
    shared: Arc<Shared>,
}

impl Dispatcher {
    /// Starts the delivery task; it ends once the dispatcher is dropped and its queue is sent.
    pub(super) fn spawn(sink: Arc<dyn AlertSink>, shared: Arc<Shared>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver(rx, sink, shared.clone()));
        Self { tx, shared }
    }

    /// Queues `alert` for `targets`; never waits. A full queue drops it, with a warning.
    pub(super) fn send(&self, alert: Alert, targets: Vec<Target>) {
        if targets.is_empty() {
            return;
        }
        if self.tx.try_send((alert, targets)).is_err() {
            let dropped = self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            if dropped.is_power_of_two() || dropped == 0 {
                tracing::warn!(
                    dropped = dropped + 1,
                    "alert notifications are piling up behind slow targets; dropping"
                );
            }
        }
    }
}

async fn deliver(
    mut rx: mpsc::Receiver<(Alert, Vec<Target>)>,
    sink: Arc<dyn AlertSink>,
    shared: Arc<Shared>,
) {
    let mut warnings = Warnings::default();
    while let Some((alert, targets)) = rx.recv().await {
        let alert = Arc::new(alert);
        let mut posts = JoinSet::new();
        for target in targets {
            let (sink, alert) = (sink.clone(), alert.clone());
            posts.spawn(async move {
                let sent = tokio::time::timeout(POST_TIMEOUT, sink.post(&target, &alert)).await;
                let sent = sent.unwrap_or_else(|_| Err(SendError::Timeout(target.shown())));
                (target, sent)
            });
        }
        while let Some(done) = posts.join_next().await {
            let Ok((target, sent)) = done else { continue };
            match sent {
                Ok(()) => {
                    shared.sent_ok.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(to = %target.shown(), alert = alert.name.as_str(),
                        status = alert.status.as_str(), "alert notification sent");
                }
                Err(e) => {
                    shared.sent_error.fetch_add(1, Ordering::Relaxed);
                    warnings.failed(&target, alert.name.as_str(), &e);
                }
            }
        }
    }
}

/// Rate-limits the warnings about failed posts: one per target per [`WARN_EVERY`].
#[derive(Debug, Default)]
struct Warnings {
    /// Per target: when it was last warned about, and failures since.
    last: HashMap<Target, (Instant, u64)>,
}

impl Warnings {
    fn failed(&mut self, target: &Target, alert: &str, e: &SendError) {
        let now = Instant::now();
        match self.last.get_mut(target) {
            Some((at, quiet)) if now.duration_since(*at) < WARN_EVERY => *quiet += 1,
            entry => {
                let suppressed = entry.map_or(0, |(_, quiet)| *quiet);
                tracing::warn!(error = %e, alert, suppressed,
                    "cannot deliver an alert notification (later failures to this target are \
                     warned about at most once a minute)");
                self.last.insert(target.clone(), (now, 0));
            }
        }
    }
}
