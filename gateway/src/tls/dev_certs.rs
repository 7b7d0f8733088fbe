//! Development certificates: a local CA and a `localhost` server certificate
//! signed by it, generated with rcgen.
//!
//! Files written into the directory (PEM):
//!
//! | file                  | contents                                              | mode |
//! |-----------------------|-------------------------------------------------------|------|
//! | `sluice-dev-ca.pem`   | the CA certificate; clients trust this one            | 0644 |
//! | `localhost.pem`       | server certificate for `localhost`, `127.0.0.1`, `::1`| 0644 |
//! | `localhost-key.pem`   | the server certificate's private key                  | 0600 |
//!
//! The CA's private key is **never written**: it exists only in memory while
//! the server certificate is signed, then is dropped. A CA someone adds to a
//! trust store can vouch for any name, so a key for it lying around a
//! checkout would be a liability; the price is that issuing another
//! certificate means generating a new CA (`sluice certs dev`) and trusting
//! that one instead.
//!
//! The CA is valid for about ten years, the server certificate for about one;
//! both start a day in the past to tolerate clock skew. Keys are ECDSA P-256.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{ServerName, UnixTime};

use super::{load_certs, provider, root_store, TlsError};

/// File name of the development CA certificate.
pub const CA_CERT_FILE: &str = "sluice-dev-ca.pem";
/// File name of the development server certificate.
pub const CERT_FILE: &str = "localhost.pem";
/// File name of the development server certificate's private key.
pub const KEY_FILE: &str = "localhost-key.pem";

/// Subject alternative names of the development server certificate.
pub const DEV_SANS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

const CA_VALIDITY_DAYS: i64 = 3650;
const CERT_VALIDITY_DAYS: i64 = 365;

/// Where the development certificates live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCerts {
    /// The directory holding the files.
    pub dir: PathBuf,
    /// The CA certificate (PEM); give it to clients (`curl --cacert`).
    pub ca_cert: PathBuf,
    /// The server certificate (PEM).
    pub cert: PathBuf,
    /// The server certificate's private key (PEM, mode 0600).
    pub key: PathBuf,
}

impl DevCerts {
    /// The paths the development certificates have (or would have) in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            ca_cert: dir.join(CA_CERT_FILE),
            cert: dir.join(CERT_FILE),
            key: dir.join(KEY_FILE),
        }
    }

    fn all_exist(&self) -> bool {
        [&self.ca_cert, &self.cert, &self.key]
            .iter()
            .all(|p| p.is_file())
    }
}

/// Makes sure usable development certificates exist in `dir`, creating the
/// directory if needed.
///
/// When all three files exist and the server certificate still verifies
/// against the CA for `localhost` today, they are reused and the flag is
/// `false`. Otherwise (a file is missing, or the certificate has expired or
/// was not issued by that CA) a fresh set is generated and the flag is `true`.
///
/// # Errors
///
/// A [`TlsError`] if existing files cannot be read or parsed, or if
/// generating or writing new ones fails.
pub fn ensure_dev_certs(dir: &Path) -> Result<(DevCerts, bool), TlsError> {
    let certs = DevCerts::in_dir(dir);
    if certs.all_exist() && still_valid(&certs)? {
        return Ok((certs, false));
    }
    Ok((generate_dev_certs(dir)?, true))
}

/// Generates a new CA and server certificate in `dir`, replacing any that are
/// there (used by `sluice certs dev`). Creates the directory if needed.
///
/// Each file is written to a temporary name and renamed into place, so a
/// reader never sees half a file.
///
/// # Errors
///
/// A [`TlsError`] if generation fails or a file cannot be written.
pub fn generate_dev_certs(dir: &Path) -> Result<DevCerts, TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let today = days_since_epoch();

    let ca_key = KeyPair::generate().map_err(TlsError::Generate)?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = distinguished_name("Sluice development CA");
    // Unique per CA: with only the CN, a client trusting an older CA would find
    // a same-named issuer and report a bad signature instead of an unknown CA.
    ca_params
        .distinguished_name
        .push(DnType::OrganizationalUnitName, key_tag(&ca_key));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut ca_params, today, CA_VALIDITY_DAYS);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(TlsError::Generate)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate().map_err(TlsError::Generate)?;
    let sans: Vec<String> = DEV_SANS.iter().map(|s| (*s).to_owned()).collect();
    let mut params = CertificateParams::new(sans).map_err(TlsError::Generate)?;
    params.distinguished_name = distinguished_name("localhost");
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, today, CERT_VALIDITY_DAYS);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(TlsError::Generate)?;

    let certs = DevCerts::in_dir(dir);
    write_file(&certs.key, key.serialize_pem().as_bytes(), true)?;
    write_file(&certs.cert, cert.pem().as_bytes(), false)?;
    write_file(&certs.ca_cert, ca_cert.pem().as_bytes(), false)?;
    Ok(certs)
}

/// Whether the server certificate verifies against the CA for `localhost`
/// right now (signature, validity period, name, server-auth usage).
fn still_valid(certs: &DevCerts) -> Result<bool, TlsError> {
    let roots = match root_store(&certs.ca_cert) {
        Ok(roots) => roots,
        Err(TlsError::InvalidCertificate { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let chain = load_certs(&certs.cert)?;
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Ok(false);
    };
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider())
            .build()
            .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))?;
    let name = ServerName::try_from("localhost")
        .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))?;
    Ok(verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .is_ok())
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "Sluice development");
    dn
}

/// A short hex tag derived from a key's public half, unique per key.
fn key_tag(key: &KeyPair) -> String {
    let raw = key.public_key_raw();
    let tail = &raw[raw.len().saturating_sub(8)..];
    let hex: String = tail.iter().map(|b| format!("{b:02x}")).collect();
    format!("key {hex}")
}

/// Valid from yesterday (clock-skew margin) for `days` days from today.
fn set_validity(params: &mut CertificateParams, today: i64, days: i64) {
    let (y, m, d) = civil_from_days(today - 1);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = civil_from_days(today + days);
    params.not_after = rcgen::date_time_ymd(y, m, d);
}

fn days_since_epoch() -> i64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    i64::try_from(secs / 86_400).unwrap_or(0)
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month, day).
///
/// Howard Hinnant's `civil_from_days`; always yields a valid date, so
/// `rcgen::date_time_ymd` (which panics on invalid dates) is safe to call.
pub(super) fn civil_from_days(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let month = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let year = yoe + era * 400 + i64::from(month <= 2);
    // The ranges above make these conversions lossless for any plausible clock.
    (
        i32::try_from(year).unwrap_or(i32::MAX),
        u8::try_from(month).unwrap_or(1),
        u8::try_from(day).unwrap_or(1),
    )
}

/// Writes `contents` to `path` via a temporary file renamed into place;
/// `private` files get mode 0600 on Unix from the moment they are created.
fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let _ = std::fs::remove_file(&tmp);

    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(&tmp).map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(err)
}
