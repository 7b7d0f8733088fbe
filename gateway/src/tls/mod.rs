//! TLS for the gateway: rustls configurations built from PEM files, and
//! locally generated development certificates.
//!
//! - [`server_config`] loads a certificate chain and its private key and
//!   returns the configuration the HTTPS listener accepts connections with
//!   (TLS 1.2 and 1.3 only, ALPN `h2` then `http/1.1`).
//! - [`client_config`] trusts exactly one CA; tests and gateway clients use it
//!   to talk to a gateway running on development certificates.
//! - [`ensure_dev_certs`] and [`generate_dev_certs`] create a local CA and a
//!   `localhost` certificate signed by it (see [`dev_certs`]).
//!
//! All crypto goes through rustls' `ring` provider, passed explicitly, so
//! nothing depends on a process-wide default provider being installed.

pub mod dev_certs;

#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use dev_certs::{ensure_dev_certs, generate_dev_certs, DevCerts};

/// ALPN protocols offered and accepted, in order of preference.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// The protocol versions Sluice speaks: TLS 1.2 and TLS 1.3, nothing older.
pub static PROTOCOL_VERSIONS: &[&SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// Why a TLS configuration or the development certificates could not be built.
///
/// Every variant that concerns a file names it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file does not exist.
    #[error("{}: file not found", path.display())]
    Missing {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// The file exists but could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file that could not be read.
        path: PathBuf,
        /// The underlying I/O error.
        source: io::Error,
    },
    /// The file is not well-formed PEM.
    #[error("{}: malformed PEM: {source}", path.display())]
    Pem {
        /// The file that could not be parsed.
        path: PathBuf,
        /// What the PEM parser objected to.
        source: pem::Error,
    },
    /// The file holds no `CERTIFICATE` block.
    #[error("{}: no certificate in the file (expected a PEM `BEGIN CERTIFICATE` block)", path.display())]
    NoCertificate {
        /// The file that was expected to hold certificates.
        path: PathBuf,
    },
    /// The file holds no private key.
    #[error("{}: no private key in the file (expected a PEM PKCS#8, PKCS#1 or SEC1 key block)", path.display())]
    NoPrivateKey {
        /// The file that was expected to hold a private key.
        path: PathBuf,
    },
    /// The private key is present but unusable (unsupported algorithm, corrupt).
    #[error("{}: unusable private key: {source}", path.display())]
    InvalidKey {
        /// The key file.
        path: PathBuf,
        /// Why rustls rejected the key.
        source: rustls::Error,
    },
    /// The private key does not belong to the certificate.
    #[error("{}: private key does not match the certificate in {}", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// A certificate in the file was rejected (for example as a trust anchor).
    #[error("{}: invalid certificate: {source}", path.display())]
    InvalidCertificate {
        /// The certificate file.
        path: PathBuf,
        /// Why it was rejected.
        source: rustls::Error,
    },
    /// rustls refused the configuration itself.
    #[error("TLS configuration: {0}")]
    Config(#[source] rustls::Error),
    /// rcgen failed to generate a key or certificate.
    #[error("generating development certificates: {0}")]
    Generate(#[source] rcgen::Error),
    /// A generated file or its directory could not be written.
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        /// The file or directory being written.
        path: PathBuf,
        /// The underlying I/O error.
        source: io::Error,
    },
}

/// The crypto provider used for every configuration: rustls' `ring` provider.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the server configuration from a PEM certificate chain (end-entity
/// certificate first) and a PEM private key.
///
/// Only TLS 1.2 and 1.3 are enabled; ALPN offers `h2` then `http/1.1`.
///
/// # Errors
///
/// A [`TlsError`] naming the file: missing or unreadable, malformed PEM, no
/// certificate, no private key, an unusable key, or a key that does not match
/// the certificate.
pub fn server_config(cert_pem: &Path, key_pem: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = load_certs(cert_pem)?;
    let key = load_key(key_pem)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
                cert: cert_pem.to_path_buf(),
                key: key_pem.to_path_buf(),
            },
            rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                TlsError::InvalidCertificate {
                    path: cert_pem.to_path_buf(),
                    source: e,
                }
            }
            other => TlsError::InvalidKey {
                path: key_pem.to_path_buf(),
                source: other,
            },
        })?;
    config.alpn_protocols = alpn_protocols();
    Ok(Arc::new(config))
}

/// Builds a client configuration that trusts exactly the CA certificate(s) in
/// `ca_pem` — no system roots. TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`.
///
/// # Errors
///
/// A [`TlsError`] naming the file: missing or unreadable, malformed PEM, no
/// certificate, or a certificate that cannot serve as a trust anchor.
pub fn client_config(ca_pem: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .map_err(TlsError::Config)?
        .with_root_certificates(root_store(ca_pem)?)
        .with_no_client_auth();
    config.alpn_protocols = alpn_protocols();
    Ok(Arc::new(config))
}

/// A root store holding exactly the certificates in `ca_pem`.
///
/// # Errors
///
/// As for [`client_config`].
pub fn root_store(ca_pem: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca_pem)? {
        roots
            .add(cert)
            .map_err(|source| TlsError::InvalidCertificate {
                path: ca_pem.to_path_buf(),
                source,
            })?;
    }
    Ok(roots)
}

fn alpn_protocols() -> Vec<Vec<u8>> {
    ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect()
}

/// Reads a file, telling a missing file apart from other I/O failures.
fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        io::ErrorKind::NotFound => TlsError::Missing {
            path: path.to_path_buf(),
        },
        _ => TlsError::Read {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// Loads every `CERTIFICATE` block of a PEM file, in order; at least one.
fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// Loads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_file(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| match source {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: path.to_path_buf(),
        },
        source => TlsError::Pem {
            path: path.to_path_buf(),
            source,
        },
    })
}
