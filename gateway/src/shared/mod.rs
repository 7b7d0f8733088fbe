//! State several gateway replicas share through one Redis (`[shared]` in the policy): the
//! upstream's active ceiling, each tenant's GCRA rate limit and token budget. Off by default: a
//! gateway without `shared.redis_url` counts alone, as before.
//!
//! - [`keys`]: the key names, all under the deployment's hash tag `{prefix}`.
//! - [`health`]: the bound on every call, up/down, and the fault counters.
//! - [`store`]: the connection, its probe, and the pub/sub that wakes local waiters.
//! - [`arrive`]: a request's one script on arrival: its tenant's GCRA ([`rate`]) and token
//!   budget's charge ([`budget`]), and a try at the ceiling's lease, checked and updated in one
//!   step on Redis's clock.
//! - [`ceiling`]: slots as leases with a TTL, renewed while a request runs; [`hold`] is the
//!   layer that takes one after the local admission slot (unless the arrival took it) and
//!   keeps it in the response body.
//! - [`finish`]: a request's charge settled and its lease given back in one script: with the
//!   arrival, two calls a request.
//! - [`capacity`]: with `fail = "local"`, the local ceiling falls to the gateway's share while
//!   Redis is away.
//!
//! The client is the `redis` crate (redis-rs) with only `tokio-comp` and `script`: one
//! multiplexed connection, `EVALSHA` with a fallback to `EVAL`, pub/sub, no TLS and no
//! connection manager (the probe in [`store`] reconnects, under our own bound). `fred` would do
//! too, but brings its own reconnection and pooling policy, which is what [`health`] must own
//! to keep every call under `shared.timeout`.

pub mod arrive;
pub mod budget;
pub mod capacity;
pub mod ceiling;
mod finish;
pub mod health;
pub mod hold;
pub mod keys;
pub mod rate;
#[cfg(test)]
mod redis_tests;
mod scripts;
pub mod store;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use tokio::sync::Notify;

pub use arrive::{Arrived, Ask, Refused};
pub use budget::Arrival;
pub use ceiling::Lease;
pub use health::{Health, Unavailable};
pub use rate::Rate;

use crate::error::GatewayError;
use crate::middleware::admission::Admission;
use crate::policy::{self, Policy, SharedFail, UpstreamKind};
use ceiling::Registry;
use keys::Keys;
use store::Store;

/// One gateway's handle on the shared state.
#[derive(Debug)]
pub struct Shared {
    settings: policy::Shared,
    keys: Keys,
    store: Arc<Store>,
    /// The upstream's ceiling keys, when the ceiling is shared (an `openai` upstream: every
    /// gateway in front of the same engines; a bundled engine is each gateway's own).
    ceiling: Option<keys::Ceiling>,
    /// Woken when a slot of the shared ceiling frees (pub/sub) or the state changes.
    freed: Arc<Notify>,
    /// This gateway's leases, renewed together.
    leases: Registry,
    /// The shared GCRA's refusals still in force, answered without Redis.
    refusals: rate::Refusals,
    /// This process's name in lease and charge ids.
    instance: String,
    next_id: AtomicU64,
    /// The local admission, whose free slot lets a budget's charge try for the lease too.
    admission: OnceLock<Weak<Admission>>,
}

/// What `/metrics` shows of the shared state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub up: bool,
    pub fail_closed: bool,
    pub errors: Vec<(&'static str, u64)>,
    pub degraded: u64,
    pub leases: usize,
}

impl Shared {
    /// Starts the shared state the policy's `[shared]` names (none: `None`, off). Connects in
    /// the background: until the first connection the state is down and `fail` applies.
    pub fn start(policy: &Policy) -> Result<Option<Arc<Self>>, GatewayError> {
        let settings = policy.shared.clone();
        let Some(url) = settings.redis_url.as_deref() else {
            return Ok(None);
        };
        let client = redis::Client::open(url)
            .map_err(|e| GatewayError::Internal(format!("shared.redis_url: {e}")))?;
        let health = Health::new(settings.timeout, settings.fail);
        let store = Arc::new(Store::new(client, health));
        let keys = Keys::new(&settings.prefix);
        let ceiling = match policy.upstream.kind {
            UpstreamKind::Openai => Some(keys.ceiling(&keys::upstream_id(&policy.upstream.urls))),
            UpstreamKind::Bundled => None,
        };
        let shared = Arc::new(Self {
            keys,
            store: store.clone(),
            ceiling,
            freed: Arc::default(),
            leases: Registry::default(),
            refusals: rate::Refusals::default(),
            instance: instance_name(),
            next_id: AtomicU64::new(0),
            admission: OnceLock::new(),
            settings,
        });
        store.spawn_probe();
        if let Some(c) = &shared.ceiling {
            store.spawn_subscriber(c.freed.clone(), shared.freed.clone());
            ceiling::spawn_renewer(&shared);
        }
        tracing::info!(
            prefix = %shared.settings.prefix,
            ceiling = shared.ceiling.is_some(),
            fail = ?shared.settings.fail,
            "shared state on (Redis)"
        );
        Ok(Some(shared))
    }

    pub fn health(&self) -> &Health {
        &self.store.health
    }

    pub fn settings(&self) -> &policy::Shared {
        &self.settings
    }

    /// Whether the upstream's ceiling is shared.
    pub fn shares_ceiling(&self) -> bool {
        self.ceiling.is_some()
    }

    /// Waits (at most `limit`) for the state to be up; whether it is.
    pub async fn wait_up(&self, limit: std::time::Duration) -> bool {
        let mut changes = self.health().subscribe();
        let _ = tokio::time::timeout(limit, changes.wait_for(|up| *up)).await;
        self.health().is_up()
    }

    /// Lets the arrival's script try for the lease as well while `admission` has a free slot
    /// and nobody queued (the request will hold its local slot at once).
    pub fn watch_admission(&self, admission: &Arc<Admission>) {
        let _ = self.admission.set(Arc::downgrade(admission));
    }

    /// The ceiling to take a lease under on arrival, when the local admission has room now.
    fn local_room(&self) -> Option<usize> {
        let s = self.admission.get()?.upgrade()?.snapshot();
        let room = s.active < s.active_max && s.queued_interactive + s.queued_batch == 0;
        room.then_some(s.active_max)
    }

    /// A new id, unique across the deployment's gateways.
    fn new_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.instance)
    }

    /// What the policy's `fail` makes of an unavailable state: `Ok` to decide locally (by the
    /// gateway's share), or 503 `shared_state_unavailable`.
    pub fn on_unavailable(&self, why: Unavailable) -> Result<(), GatewayError> {
        self.health().degraded();
        match self.settings.fail {
            SharedFail::Local => Ok(()),
            SharedFail::Closed => Err(GatewayError::SharedStateUnavailable(why.0)),
        }
    }

    /// This gateway's share of a deployment-wide limit while deciding alone.
    pub fn share(&self) -> usize {
        self.settings.expected_replicas.max(1)
    }

    pub fn report(&self) -> Report {
        Report {
            up: self.health().is_up(),
            fail_closed: self.settings.fail == SharedFail::Closed,
            errors: self.health().errors().into_iter().collect(),
            degraded: self.health().degraded_total(),
            leases: self.leases.len(),
        }
    }
}

/// The host, the process and its start time: unique per gateway process, readable in Redis.
fn instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{host}:{}:{started:x}", std::process::id())
}
