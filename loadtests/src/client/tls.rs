//! The TLS client configuration: trust a given CA file (the gateway's development CA), the
//! system's store, or nothing at all (`--insecure`, for a quick look at a self-signed server).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{self, CryptoProvider};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::error::{Error, Result};

/// Where Debian, Fedora and Alpine keep their CA bundle.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// A client configuration for HTTP/1.1 over TLS: `ca` (PEM) as the only root when given, else
/// the system bundle; `insecure` accepts any certificate.
pub fn client_config(ca: Option<&Path>, insecure: bool) -> Result<ClientConfig> {
    let provider = Arc::new(crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mut config = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
            .with_no_client_auth()
    } else {
        builder
            .with_root_certificates(roots(ca)?)
            .with_no_client_auth()
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn roots(ca: Option<&Path>) -> Result<RootCertStore> {
    let path = match ca {
        Some(p) => p,
        None => SYSTEM_BUNDLES
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .ok_or_else(|| {
                Error::Tls("no system CA bundle found: give --ca FILE (or --insecure)".into())
            })?,
    };
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path)
        .map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?
    {
        let cert = cert.map_err(|e| Error::Tls(format!("{}: {e}", path.display())))?;
        // A bundle may hold a certificate rustls cannot use; one bad entry spoils nothing.
        let _ = store.add(cert);
    }
    if store.is_empty() {
        return Err(Error::Tls(format!(
            "{}: no usable CA certificate",
            path.display()
        )));
    }
    Ok(store)
}

/// `--insecure`: any certificate for any name, signatures still checked so that the
/// handshake is a real one.
#[derive(Debug)]
struct AcceptAnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_empty_ca_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("sluice-load-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(client_config(Some(&empty), false).is_err());
        assert!(client_config(Some(&dir.join("missing.pem")), false).is_err());
        assert!(client_config(Some(&dir.join("missing.pem")), true).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
