//! Real TLS handshakes over loopback against configurations built from
//! freshly generated development certificates; no mocks.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustls::{ClientConfig, ProtocolVersion, ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::dev_certs::civil_from_days;
use super::*;

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "sluice-tls-{tag}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dev_certs(tag: &str) -> (TempDir, DevCerts) {
    let tmp = TempDir::new(tag);
    let certs = generate_dev_certs(tmp.path()).expect("generate dev certs");
    (tmp, certs)
}

fn server(certs: &DevCerts) -> Arc<ServerConfig> {
    server_config(&certs.cert, &certs.key).expect("server config")
}

/// A client trusting `ca` that speaks only `versions` and offers `alpn`.
fn client_with(
    ca: &Path,
    versions: &[&'static SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .expect("versions")
        .with_root_certificates(root_store(ca).expect("root store"))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// What one side saw once the handshake completed.
#[derive(Debug, PartialEq, Eq)]
struct Negotiated {
    version: Option<ProtocolVersion>,
    alpn: Option<Vec<u8>>,
}

/// Runs a real handshake over 127.0.0.1 and exchanges a few bytes both ways.
/// Returns the client's view; asserts the server saw the same.
async fn handshake(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    name: &str,
) -> io::Result<Negotiated> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(server);
    let server_task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = acceptor.accept(tcp).await?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        tls.write_all(b"pong").await?;
        tls.shutdown().await?;
        let conn = tls.get_ref().1;
        Ok::<_, io::Error>(Negotiated {
            version: conn.protocol_version(),
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
        })
    });

    let server_name = ServerName::try_from(name.to_owned()).expect("server name");
    let tcp = TcpStream::connect(addr).await?;
    let client_result = async {
        let mut tls = TlsConnector::from(client).connect(server_name, tcp).await?;
        tls.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"pong");
        let conn = tls.get_ref().1;
        Ok::<_, io::Error>(Negotiated {
            version: conn.protocol_version(),
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
        })
    }
    .await;

    let server_result = server_task.await.expect("server task panicked");
    let client_seen = client_result?;
    let server_seen = server_result?;
    assert_eq!(client_seen, server_seen, "client and server disagree");
    Ok(client_seen)
}

/// The rustls error inside an I/O error from a failed handshake.
fn rustls_error(err: &io::Error) -> Option<&rustls::Error> {
    err.get_ref()?.downcast_ref::<rustls::Error>()
}

#[tokio::test]
async fn tls13_handshake_negotiates_tls13() {
    let (_tmp, certs) = dev_certs("tls13");
    let client = client_with(&certs.ca_cert, &[&rustls::version::TLS13], &ALPN_PROTOCOLS);
    let seen = handshake(server(&certs), client, "localhost")
        .await
        .expect("handshake");
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_3));
}

#[tokio::test]
async fn tls12_handshake_negotiates_tls12() {
    let (_tmp, certs) = dev_certs("tls12");
    let client = client_with(&certs.ca_cert, &[&rustls::version::TLS12], &ALPN_PROTOCOLS);
    let seen = handshake(server(&certs), client, "localhost")
        .await
        .expect("handshake");
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_2));
    assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]));
}

#[tokio::test]
async fn client_config_negotiates_tls13_and_h2() {
    let (_tmp, certs) = dev_certs("default-client");
    let client = client_config(&certs.ca_cert).expect("client config");
    let seen = handshake(server(&certs), client, "localhost")
        .await
        .expect("handshake");
    assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_3));
    assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]));
}

#[tokio::test]
async fn alpn_client_offering_h2_gets_h2() {
    let (_tmp, certs) = dev_certs("alpn-h2");
    let client = client_with(&certs.ca_cert, PROTOCOL_VERSIONS, &[b"h2"]);
    let seen = handshake(server(&certs), client, "localhost")
        .await
        .expect("handshake");
    assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]));
}

#[tokio::test]
async fn alpn_client_offering_only_http11_gets_http11() {
    let (_tmp, certs) = dev_certs("alpn-http11");
    let client = client_with(&certs.ca_cert, PROTOCOL_VERSIONS, &[b"http/1.1"]);
    let seen = handshake(server(&certs), client, "localhost")
        .await
        .expect("handshake");
    assert_eq!(seen.alpn.as_deref(), Some(&b"http/1.1"[..]));
}

#[tokio::test]
async fn client_not_trusting_the_ca_fails_handshake() {
    let (_tmp, certs) = dev_certs("trusted");
    let (_other_tmp, other) = dev_certs("untrusted");
    let client = client_config(&other.ca_cert).expect("client config");
    let err = handshake(server(&certs), client, "localhost")
        .await
        .expect_err("handshake must fail");
    assert!(
        matches!(
            rustls_error(&err),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))
        ),
        "unexpected error: {err:?}"
    );
}

#[tokio::test]
async fn certificate_is_valid_for_localhost_and_loopback_ips() {
    let (_tmp, certs) = dev_certs("names");
    // The `::1` name is checked over an IPv4 connection: only the name the
    // client verifies against matters, and CI hosts may lack IPv6.
    for name in ["localhost", "127.0.0.1", "::1"] {
        let client = client_config(&certs.ca_cert).expect("client config");
        handshake(server(&certs), client, name)
            .await
            .unwrap_or_else(|e| panic!("handshake as {name} failed: {e}"));
    }
}

#[tokio::test]
async fn certificate_is_not_valid_for_other_names() {
    let (_tmp, certs) = dev_certs("other-name");
    let client = client_config(&certs.ca_cert).expect("client config");
    let err = handshake(server(&certs), client, "example.com")
        .await
        .expect_err("handshake must fail");
    assert!(
        matches!(
            rustls_error(&err),
            Some(rustls::Error::InvalidCertificate(_))
        ),
        "unexpected error: {err:?}"
    );
}

fn read_all(certs: &DevCerts) -> [Vec<u8>; 3] {
    [&certs.ca_cert, &certs.cert, &certs.key].map(|p| std::fs::read(p).expect("read"))
}

#[test]
fn ensure_dev_certs_generates_then_reuses() {
    let tmp = TempDir::new("ensure");
    let dir = tmp.path().join("certs");
    let (first, generated) = ensure_dev_certs(&dir).expect("first ensure");
    assert!(generated, "first call must generate");
    assert_eq!(first, DevCerts::in_dir(&dir));
    let before = read_all(&first);

    let (second, generated) = ensure_dev_certs(&dir).expect("second ensure");
    assert!(!generated, "second call must reuse");
    assert_eq!(second, first);
    assert_eq!(read_all(&second), before, "files must be untouched");
    assert!(
        !dir.join("sluice-dev-ca-key.pem").exists(),
        "CA key is never written"
    );
}

#[test]
fn ensure_dev_certs_regenerates_when_a_file_is_missing() {
    let (_tmp, certs) = dev_certs("ensure-missing");
    let before = read_all(&certs);
    std::fs::remove_file(&certs.key).expect("remove key");
    let (again, generated) = ensure_dev_certs(&certs.dir).expect("ensure");
    assert!(generated);
    assert_ne!(read_all(&again)[0], before[0], "a new CA was generated");
    server_config(&again.cert, &again.key).expect("regenerated set loads");
}

#[test]
fn ensure_dev_certs_regenerates_when_cert_not_issued_by_the_ca() {
    let (_tmp, certs) = dev_certs("ensure-foreign");
    let (_other_tmp, other) = dev_certs("ensure-foreign-other");
    std::fs::copy(&other.cert, &certs.cert).expect("copy foreign cert");
    let (again, generated) = ensure_dev_certs(&certs.dir).expect("ensure");
    assert!(generated, "a cert the CA did not issue is replaced");
    server_config(&again.cert, &again.key).expect("regenerated set loads");
}

#[test]
fn generate_dev_certs_always_regenerates() {
    let (_tmp, certs) = dev_certs("regenerate");
    let before = read_all(&certs);
    let again = generate_dev_certs(&certs.dir).expect("regenerate");
    let after = read_all(&again);
    for (b, a) in before.iter().zip(&after) {
        assert_ne!(a, b);
    }
}

#[cfg(unix)]
#[test]
fn key_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let (_tmp, certs) = dev_certs("mode");
    let mode = std::fs::metadata(&certs.key)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

fn write(dir: &TempDir, name: &str, contents: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).expect("write");
    path
}

#[test]
fn missing_cert_file_is_reported() {
    let (tmp, certs) = dev_certs("missing-cert");
    let missing = tmp.path().join("nope.pem");
    let err = server_config(&missing, &certs.key).expect_err("must fail");
    assert!(
        matches!(&err, TlsError::Missing { path } if path == &missing),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("nope.pem: file not found"),
        "{err}"
    );
}

#[test]
fn missing_key_file_is_reported() {
    let (tmp, certs) = dev_certs("missing-key");
    let missing = tmp.path().join("nokey.pem");
    let err = server_config(&certs.cert, &missing).expect_err("must fail");
    assert!(
        matches!(&err, TlsError::Missing { path } if path == &missing),
        "{err:?}"
    );
}

#[test]
fn empty_cert_file_is_reported() {
    let (tmp, certs) = dev_certs("empty-cert");
    let empty = write(&tmp, "empty.pem", b"");
    let err = server_config(&empty, &certs.key).expect_err("must fail");
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err:?}");
    assert!(
        err.to_string().contains("empty.pem: no certificate"),
        "{err}"
    );
}

#[test]
fn empty_key_file_is_reported() {
    let (tmp, certs) = dev_certs("empty-key");
    let empty = write(&tmp, "empty-key.pem", b"");
    let err = server_config(&certs.cert, &empty).expect_err("must fail");
    assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err:?}");
    assert!(
        err.to_string().contains("empty-key.pem: no private key"),
        "{err}"
    );
}

#[test]
fn swapped_cert_and_key_are_reported() {
    let (_tmp, certs) = dev_certs("swapped");
    let err = server_config(&certs.key, &certs.cert).expect_err("must fail");
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err:?}");
}

#[test]
fn key_not_matching_cert_is_reported() {
    let (_tmp, certs) = dev_certs("mismatch");
    let (_other_tmp, other) = dev_certs("mismatch-other");
    let err = server_config(&certs.cert, &other.key).expect_err("must fail");
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("private key does not match the certificate"),
        "{msg}"
    );
    assert!(msg.contains(&other.key.display().to_string()), "{msg}");
    assert!(msg.contains(&certs.cert.display().to_string()), "{msg}");
}

#[test]
fn malformed_pem_is_reported() {
    let tmp = TempDir::new("malformed");
    let bad = write(&tmp, "bad.pem", b"-----BEGIN CERTIFICATE-----\nAAAA\n");
    let err = client_config(&bad).expect_err("must fail");
    assert!(matches!(err, TlsError::Pem { .. }), "{err:?}");
    assert!(err
        .to_string()
        .starts_with(&format!("{}: malformed PEM", bad.display())));
}

#[test]
fn client_config_reports_missing_and_empty_ca() {
    let tmp = TempDir::new("client-ca");
    let missing = tmp.path().join("ca.pem");
    let err = client_config(&missing).expect_err("must fail");
    assert!(matches!(err, TlsError::Missing { .. }), "{err:?}");
    let empty = write(&tmp, "empty-ca.pem", b"");
    let err = client_config(&empty).expect_err("must fail");
    assert!(matches!(err, TlsError::NoCertificate { .. }), "{err:?}");
}

#[test]
fn civil_from_days_known_dates() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(-1), (1969, 12, 31));
    assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    assert_eq!(civil_from_days(20_000), (2024, 10, 4));
}

#[test]
fn only_modern_cipher_suites_are_offered() {
    // TLS 1.3's AEAD suites, and for TLS 1.2 only ECDHE key exchange with AES-GCM or
    // ChaCha20-Poly1305: no RSA key exchange, no CBC, no SHA-1 MACs.
    let suites = super::provider().cipher_suites.clone();
    assert!(!suites.is_empty());
    for s in suites {
        let name = format!("{:?}", s.suite());
        let aead = name.contains("_GCM_") || name.contains("CHACHA20_POLY1305");
        let modern = name.starts_with("TLS13_") || name.starts_with("TLS_ECDHE_");
        assert!(aead && modern, "{name}");
    }
}
