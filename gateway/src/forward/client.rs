//! The HTTP client to upstreams: plain HTTP or HTTPS (TLS 1.2+, the gateway's own rustls
//! settings), pooled keep-alive connections, `TCP_NODELAY`, HTTP/2 when the upstream's TLS
//! offers it.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::{ClientConfig, RootCertStore};

use super::connection::Stamping;
use crate::tls::{self, TlsError};

/// The client.
pub type HttpClient = Client<HttpsConnector<Stamping<HttpConnector>>, Full<Bytes>>;

/// A client that trusts `ca` (a PEM bundle) for `https://` upstreams, or the system's roots
/// without one.
///
/// # Errors
///
/// The CA file cannot be read or holds no certificate.
pub fn http_client(ca: Option<&Path>) -> Result<HttpClient, TlsError> {
    let roots = match ca {
        Some(path) => tls::root_store(path)?,
        None => system_roots(),
    };
    // ALPN (h2, http/1.1) is the connector's to set.
    let config = ClientConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(tls::PROTOCOL_VERSIONS)
        .map_err(TlsError::Config)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(Stamping(http));
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// The system's trusted roots (what it has; an unreadable store is logged, not fatal: only
/// `https://` upstreams need it).
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "reading the system's CA certificates");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    tracing::debug!(added, ignored, "system CA certificates");
    roots
}
