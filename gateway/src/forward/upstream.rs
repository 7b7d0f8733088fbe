//! Where requests go.

use std::sync::Arc;

use http::uri::{self, PathAndQuery};
use http::Uri;

use tokio::sync::watch;

use super::replicas::Lease;
use crate::bundled::{RankStatus, Supervisor};
use crate::error::GatewayError;

/// An upstream base address (`http://host:port`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub base: Uri,
}

impl Target {
    /// The base as logs and traces show it: scheme, host and port, no credentials, no path
    /// (`http://10.0.0.7:8000`).
    pub fn shown(&self) -> String {
        let scheme = self.base.scheme_str().unwrap_or("http");
        let host = self.base.host().unwrap_or("");
        match self.base.port_u16() {
            Some(port) => format!("{scheme}://{host}:{port}"),
            None => format!("{scheme}://{host}"),
        }
    }

    /// The upstream URI of `path_and_query`, under the base's own path if it has one.
    pub fn uri(&self, path_and_query: &PathAndQuery) -> Result<Uri, GatewayError> {
        let bad =
            |e: &dyn std::fmt::Display| GatewayError::Internal(format!("bad upstream URI: {e}"));
        let prefix = self.base.path().trim_end_matches('/');
        let mut parts = uri::Parts::default();
        parts.scheme = self.base.scheme().cloned();
        parts.authority = self.base.authority().cloned();
        parts.path_and_query = Some(if prefix.is_empty() {
            path_and_query.clone()
        } else {
            format!("{prefix}{path_and_query}")
                .parse()
                .map_err(|e| bad(&e))?
        });
        Uri::from_parts(parts).map_err(|e| bad(&e))
    }
}

/// The engine(s) behind the gateway.
pub trait Upstream: Send + Sync + std::fmt::Debug + 'static {
    /// Where the next request goes; `engine_unavailable` when nowhere is ready.
    fn target(&self) -> Result<Target, GatewayError>;
    /// Where the next attempt goes, avoiding the replicas in `tried` (they refused the
    /// connection); the lease counts the request as outstanding there until it is dropped.
    fn lease(&self, tried: &[usize]) -> Result<Lease, GatewayError> {
        let _ = tried;
        self.target().map(Lease::fixed)
    }
    /// The ceiling the upstream puts on admission (`None`: the policy's `active_max` alone),
    /// as it changes.
    fn capacity(&self) -> Option<watch::Receiver<Option<usize>>> {
        None
    }
    /// Its own Prometheus series, appended to `/metrics`.
    fn render_metrics(&self, out: &mut String) {
        let _ = out;
    }
    /// Whether requests can be served now (`/readyz`).
    fn is_ready(&self) -> bool;
    /// The engine's ranks, when the upstream is the bundled engine.
    fn ranks(&self) -> Vec<RankStatus> {
        Vec::new()
    }
    /// The answer a failed connection deserves.
    fn connect_error(&self, target: &Target, e: &dyn std::fmt::Display) -> GatewayError {
        GatewayError::EngineUnavailable(format!("cannot reach {}: {e}", target.base))
    }
}

/// A fixed upstream URL, assumed ready.
#[derive(Debug)]
pub struct StaticUpstream {
    target: Target,
}

impl StaticUpstream {
    pub fn new(base: &str) -> Result<Self, GatewayError> {
        let base: Uri = base
            .parse()
            .map_err(|e| GatewayError::Internal(format!("bad upstream URL {base:?}: {e}")))?;
        Ok(Self {
            target: Target { base },
        })
    }
}

impl Upstream for StaticUpstream {
    fn target(&self) -> Result<Target, GatewayError> {
        Ok(self.target.clone())
    }

    fn is_ready(&self) -> bool {
        true
    }
}

/// The bundled engine, started and watched by the [`Supervisor`].
#[derive(Debug)]
pub struct BundledUpstream {
    supervisor: Arc<Supervisor>,
    target: Target,
}

impl BundledUpstream {
    pub fn new(supervisor: Arc<Supervisor>) -> Result<Self, GatewayError> {
        let base = format!("http://{}", supervisor.addr())
            .parse()
            .map_err(|e| GatewayError::Internal(format!("bad engine address: {e}")))?;
        Ok(Self {
            supervisor,
            target: Target { base },
        })
    }
}

impl Upstream for BundledUpstream {
    fn target(&self) -> Result<Target, GatewayError> {
        if !self.supervisor.is_ready() {
            return Err(GatewayError::EngineUnavailable(
                "the bundled engine is starting or restarting".into(),
            ));
        }
        Ok(self.target.clone())
    }

    fn is_ready(&self) -> bool {
        self.supervisor.is_ready()
    }

    fn ranks(&self) -> Vec<RankStatus> {
        self.supervisor.ranks()
    }
}
