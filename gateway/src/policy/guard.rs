//! What a policy must pass beyond being valid before it goes in force: access never widens by
//! accident, and keys the running gateway read once at start are not half-applied.
//!
//! - **Open on purpose.** With no `[[tenants]]` the gateway asks no key. That is fine on
//!   loopback (the shipped default); on any other listen address it needs `[server] open =
//!   true`, at start-up and on every reload.
//! - **A reload never drops every tenant or the admin key silently.** A file without
//!   `[[tenants]]` replacing one with tenants needs `server.open = true`; one without
//!   `admin.api_key_sha256` replacing one with it needs `admin.disabled = true`. A file
//!   truncated or emptied mid-save, or a stray edit, is refused instead of opening the gateway.
//! - **Restart-only keys are held.** [`RESTART_KEYS`] are read once at start (the listener, its
//!   certificate, the upstream's kind and addresses, the tokenizer, the CA alerts trust, the
//!   trace exporter, the whole
//!   `[shared]` table: a live switch of Redis, prefix or fail mode could split a deployment's
//!   counts or turn `closed` into `local`, which widens access). A reload
//!   that changes one keeps the running value in the policy in force and reports the key as
//!   needing a restart; the rest of the file applies.
//!
//! Every refusal names the key path it is about.

use std::net::SocketAddr;

use super::load::PolicyError;
use super::schema::{Policy, Tenant};
use super::validate;

/// Declares [`RESTART_KEYS`] and `hold`, which copies each of them from the running policy into
/// a new one where they differ and returns the keys it held.
macro_rules! restart_keys {
    ($($table:ident . $key:ident),* $(,)?) => {
        /// Keys read once at start: a reload holds their running values (see the module doc).
        pub const RESTART_KEYS: &[&str] = &[$(concat!(stringify!($table), ".", stringify!($key))),*];

        fn hold(running: &Policy, new: &mut Policy) -> Vec<String> {
            let mut held = Vec::new();
            $(
                if running.$table.$key != new.$table.$key {
                    new.$table.$key = running.$table.$key.clone();
                    held.push(concat!(stringify!($table), ".", stringify!($key)).to_owned());
                }
            )*
            held
        }
    };
}

restart_keys!(
    server.listen,
    server.tls_cert,
    server.tls_key,
    server.drain_timeout,
    server.max_connections,
    server.probe_listen,
    upstream.kind,
    upstream.urls,
    upstream.ranks,
    upstream.start_timeout,
    upstream.sampling,
    upstream.ca,
    upstream.tokenizer,
    upstream.model,
    upstream.prefill_order,
    alerts.ca,
    traces.endpoint,
    traces.protocol,
    traces.service_name,
    shared.redis_url,
    shared.prefix,
    shared.lease_ttl,
    shared.timeout,
    shared.fail,
    shared.expected_replicas,
);

/// The rules, for a gateway listening on `listen` (the address it really bound, `--listen`
/// included).
#[derive(Clone, Copy, Debug)]
pub struct Guard {
    listen: SocketAddr,
}

/// A policy the guard let through.
#[derive(Debug)]
pub struct Admitted {
    /// The policy to put in force: the new file with the restart-only keys at their running
    /// values.
    pub policy: Policy,
    /// The restart-only keys the file changed (held at their running values).
    pub restart_pending: Vec<String>,
    /// What changed in who may call and how much (tenants added or removed, their keys,
    /// classes and limits, the admin key, `server.open`): logged at warn, shown by
    /// `/admin/policy` and counted by `sluice_policy_access_changes`.
    pub access_changes: Vec<String>,
}

impl Guard {
    pub fn new(listen: SocketAddr) -> Self {
        Self { listen }
    }

    /// The start-up rule: open (no tenants) off loopback only with `server.open = true`.
    pub fn check_start(&self, p: &Policy) -> Result<(), PolicyError> {
        match self.open_off_loopback(p) {
            Some(why) => Err(PolicyError::new(why)),
            None => Ok(()),
        }
    }

    /// Whether `new` may replace `running` on a reload, and what goes in force if so.
    pub fn admit(&self, running: &Policy, mut new: Policy) -> Result<Admitted, PolicyError> {
        let restart_pending = hold(running, &mut new);
        let mut refused: Vec<String> = Vec::new();
        if !running.tenants.is_empty() && new.tenants.is_empty() && !new.server.open {
            refused.push(format!(
                "tenants: the new file has no [[tenants]], which would let every request in \
                 without a key (the policy in force has {}); to run without keys, say so with \
                 [server] open = true",
                running.tenants.len()
            ));
        }
        if running.admin.api_key_sha256.is_some()
            && new.admin.api_key_sha256.is_none()
            && !new.admin.disabled
        {
            refused.push(
                "admin.api_key_sha256: the new file drops the admin key; to turn /admin/* off, \
                 say so with [admin] disabled = true"
                    .to_owned(),
            );
        }
        if let Some(why) = self.open_off_loopback(&new) {
            refused.push(why);
        }
        // Holding running values can pair keys the file never paired: check the result whole.
        refused.extend(validate::problems(&new).iter().map(|p| {
            if restart_pending
                .iter()
                .any(|k| p.key.starts_with(k.as_str()))
            {
                format!("{p} (held at its running value until a restart)")
            } else {
                p.to_string()
            }
        }));
        if !refused.is_empty() {
            return Err(PolicyError::new(refused.join("; ")));
        }
        let access_changes = access_changes(running, &new);
        Ok(Admitted {
            policy: new,
            restart_pending,
            access_changes,
        })
    }

    fn open_off_loopback(&self, p: &Policy) -> Option<String> {
        (p.tenants.is_empty() && !p.server.open && !self.listen.ip().is_loopback()).then(|| {
            format!(
                "server.open: the gateway listens on {} (not loopback) with no [[tenants]], so \
                 anyone who reaches it needs no key; add [[tenants]], or say so with [server] \
                 open = true",
                self.listen
            )
        })
    }
}

/// One tenant's class and limits, old -> new, where they changed (a raise or a removed limit
/// widens what its key may do; every change is reported, so none goes unseen).
fn tenant_limit_changes(old: &Tenant, new: &Tenant) -> Vec<String> {
    let limit = |v: Option<String>| v.unwrap_or_else(|| "unlimited".to_owned());
    let changes = [
        (
            "class",
            old.class.as_str().to_owned(),
            new.class.as_str().to_owned(),
        ),
        (
            "requests_per_second",
            limit(old.requests_per_second.map(|r| r.to_string())),
            limit(new.requests_per_second.map(|r| r.to_string())),
        ),
        ("burst", old.burst.to_string(), new.burst.to_string()),
        (
            "tokens_per_minute",
            limit(old.tokens_per_minute.map(|t| t.to_string())),
            limit(new.tokens_per_minute.map(|t| t.to_string())),
        ),
    ];
    changes
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(key, a, b)| format!("tenant {:?}: {key} {a} -> {b}", new.name))
        .collect()
}

/// Tenants added and removed (by name), their keys, classes and limits, and admin-key changes
/// between two policies.
fn access_changes(old: &Policy, new: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    let names = |p: &Policy| -> Vec<String> { p.tenants.iter().map(|t| t.name.clone()).collect() };
    let (before, after) = (names(old), names(new));
    let added: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    let removed: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    if !added.is_empty() {
        out.push(format!("tenants added: {added:?}"));
    }
    if !removed.is_empty() {
        out.push(format!("tenants removed: {removed:?}"));
    }
    for (t_old, t_new) in old
        .tenants
        .iter()
        .filter_map(|t| Some((t, new.tenants.iter().find(|n| n.name == t.name)?)))
    {
        if t_old.api_key_sha256 != t_new.api_key_sha256 {
            out.push(format!("tenant {:?}: key changed", t_new.name));
        }
        out.extend(tenant_limit_changes(t_old, t_new));
    }
    if old.server.open != new.server.open {
        out.push(format!(
            "server.open: {} -> {}",
            old.server.open, new.server.open
        ));
    }
    match (&old.admin.api_key_sha256, &new.admin.api_key_sha256) {
        (None, Some(_)) => out.push("admin key set".into()),
        (Some(_), None) => out.push("admin key removed (admin.disabled = true)".into()),
        (Some(a), Some(b)) if a != b => out.push("admin key changed".into()),
        _ => {}
    }
    out
}
