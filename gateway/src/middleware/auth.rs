//! API-key auth (stack layer 2): the key's SHA-256 is compared, in constant time, with every
//! tenant's `api_key_sha256`. With no tenants in the policy the gateway is open.
//!
//! Adds the [`Caller`] extension: the tenant and its priority class, lowered (never raised)
//! by an `x-sluice-priority: batch` header.

use std::sync::{Arc, Mutex, PoisonError};

use http::{header, Request};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::check::Check;
use crate::error::GatewayError;
use crate::policy::{Class, LoadedPolicy, PolicyStore, Snapshot, Tenant};
use crate::telemetry::spans::hex_into;
use crate::telemetry::RequestRecord;

/// The header a caller may use to lower its priority.
pub const PRIORITY_HEADER: &str = "x-sluice-priority";

/// Who is calling (a request extension).
#[derive(Clone, Debug, PartialEq)]
pub struct Caller {
    /// The tenant; none when the gateway runs open.
    pub tenant: Option<Arc<Tenant>>,
    pub class: Class,
}

impl Caller {
    /// The tenant's name, or `"anonymous"`.
    pub fn name(&self) -> &str {
        self.tenant.as_ref().map_or("anonymous", |t| &t.name)
    }

    /// The class of the request whose extensions these are; the default class before auth.
    pub fn class_of(ext: &http::Extensions) -> Class {
        ext.get::<Caller>().map(|c| c.class).unwrap_or_default()
    }
}

/// Checks the API key against the policy in force.
#[derive(Clone, Debug)]
pub struct Auth {
    policy: Arc<PolicyStore>,
    /// The tenants of the policy last seen, each shared by its callers' requests (built
    /// again when a reload brings another policy, never per request).
    tenants: Arc<Mutex<Option<Shared>>>,
}

/// A policy and its tenants, shared.
#[derive(Debug)]
struct Shared {
    policy: Arc<LoadedPolicy>,
    tenants: Arc<[Arc<Tenant>]>,
}

impl Auth {
    pub fn new(policy: Arc<PolicyStore>) -> Self {
        Self {
            policy,
            tenants: Arc::default(),
        }
    }

    /// `policy`'s tenants, shared.
    fn tenants(&self, policy: &Arc<LoadedPolicy>) -> Arc<[Arc<Tenant>]> {
        let mut seen = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        match &*seen {
            Some(s) if Arc::ptr_eq(&s.policy, policy) => s.tenants.clone(),
            _ => {
                let tenants: Arc<[Arc<Tenant>]> = policy
                    .policy
                    .tenants
                    .iter()
                    .cloned()
                    .map(Arc::new)
                    .collect();
                *seen = Some(Shared {
                    policy: policy.clone(),
                    tenants: tenants.clone(),
                });
                tenants
            }
        }
    }
}

impl<B> Check<B> for Auth {
    fn check(&self, req: &mut Request<B>) -> Result<(), GatewayError> {
        let policy = self.policy.current();
        let tenant = if policy.policy.tenants.is_empty() {
            None
        } else {
            let key = presented_key(req).ok_or(GatewayError::MissingApiKey)?;
            let tenants = self.tenants(&policy);
            let found = find_tenant(&tenants, key).ok_or(GatewayError::InvalidApiKey)?;
            Some(found.clone())
        };
        let own = tenant.as_ref().map_or(Class::Interactive, |t| t.class);
        let asked = req
            .headers()
            .get(PRIORITY_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(Class::parse);
        // A caller may lower its class, never raise it.
        let class = asked.map_or(own, |c| c.min(own));
        if let Some(r) = req.extensions().get::<RequestRecord>() {
            r.set_caller(tenant.as_deref().map(|t| t.name.as_str()), class);
        }
        req.extensions_mut().insert(Caller { tenant, class });
        req.extensions_mut().insert(Snapshot(policy));
        Ok(())
    }
}

/// The key from `Authorization: Bearer KEY` or `x-api-key: KEY`.
pub fn presented_key<B>(req: &Request<B>) -> Option<&str> {
    let h = req.headers();
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        let (scheme, key) = v.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| key.trim());
    }
    h.get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The tenant whose key hashes to `key`'s SHA-256. Every tenant is compared, each in constant
/// time, so the time taken says nothing about which (or how much of a) hash matched.
pub fn find_tenant<'a, T: AsRef<Tenant>>(tenants: &'a [T], key: &str) -> Option<&'a T> {
    let digest = digest_hex(key);
    let mut found = None;
    for t in tenants {
        if same_hash(&t.as_ref().api_key_sha256, &digest) && found.is_none() {
            found = Some(t);
        }
    }
    found
}

/// Whether `key` hashes to `sha256_hex`, compared in constant time.
pub fn key_matches(sha256_hex: &str, key: &str) -> bool {
    same_hash(sha256_hex, &digest_hex(key))
}

/// `key`'s SHA-256 in lowercase hex.
fn digest_hex(key: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    hex_into(&Sha256::digest(key.as_bytes()), &mut out);
    out
}

/// Whether `expected_hex` (either case) is `digest_hex`, compared in constant time.
fn same_hash(expected_hex: &str, digest_hex: &[u8; 64]) -> bool {
    let Ok(expected) = <[u8; 64]>::try_from(expected_hex.as_bytes()) else {
        return false;
    };
    expected
        .map(|b| b.to_ascii_lowercase())
        .ct_eq(digest_hex)
        .into()
}

#[cfg(test)]
fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    hex_into(bytes, &mut out);
    String::from_utf8(out).expect("hex digits")
}

#[cfg(test)]
mod tests;
