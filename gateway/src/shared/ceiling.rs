//! The upstream's shared active ceiling: each running request holds a lease in Redis (a member
//! of one sorted set, scored by its expiry), taken by a script that applies the class rules
//! across every gateway, renewed every third of `shared.lease_ttl` while the request runs, and
//! given back (with a pub/sub message) when it ends. A gateway that dies without giving its
//! leases back loses them when they expire: within the TTL.
//!
//! A request waits for its lease after its local admission slot, so queues stay local; it is
//! woken by the pub/sub message of a freed slot, and polls every [`POLL`] for the slots no
//! message announces (expired leases of a killed gateway). The local waiter keeps its class:
//! batch never takes the deployment's last slot, nor one while an interactive request waits on
//! any gateway (the script sees the interactive waiters as a second set of expiring members).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::finish::Finish;
use super::scripts::{CEILING_ACQUIRE, CEILING_RELEASE, CEILING_RENEW};
use super::Shared;
use crate::error::GatewayError;
use crate::policy::Class;

/// The longest a waiter goes without asking Redis again (a slot freed by an expired lease
/// announces nothing).
pub const POLL: Duration = Duration::from_millis(100);

/// This gateway's live leases (ids), renewed together.
#[derive(Debug, Default)]
pub struct Registry {
    live: Mutex<HashSet<String>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn insert(&self, id: &str) {
        self.lock().insert(id.to_owned());
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn snapshot(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    fn contains(&self, id: &str) -> bool {
        self.lock().contains(id)
    }
}

/// One slot of the shared ceiling, held until dropped. A lease taken while Redis was away
/// (`fail = "local"`) is adopted by the next renewal once Redis is back, so the shared count
/// includes it. A lease that ends with a budget charge goes back with its settle
/// ([`Finish`]).
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    id: String,
    /// The ceiling it was taken under (whether its release may free a refused request).
    max: usize,
    finish: Option<Arc<Finish>>,
}

impl Lease {
    /// Gives this lease back with `finish`'s settle, in one script.
    pub fn ending_with(mut self, finish: Arc<Finish>) -> Self {
        self.finish = Some(finish);
        self
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.leases.remove(&self.id);
        let id = std::mem::take(&mut self.id);
        if let Some(finish) = self.finish.take() {
            finish.lease_ended(id, self.max);
            return;
        }
        let (shared, max) = (self.shared.clone(), self.max);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { shared.release(&id, max).await });
        }
    }
}

impl Shared {
    /// A lease on the upstream's shared ceiling of `max` slots for a `class` request, waiting
    /// at most `wait`. Unavailable state: a lease decided locally (`fail = "local"`, the local
    /// ceiling already lowered to the gateway's share) or 503 `shared_state_unavailable`.
    pub async fn acquire(
        self: &Arc<Self>,
        class: Class,
        max: usize,
        wait: Duration,
    ) -> Result<Lease, GatewayError> {
        let Some(keys) = &self.ceiling else {
            return Err(GatewayError::Internal("the ceiling is not shared".into()));
        };
        let started = Instant::now();
        let deadline = started + wait;
        let id = self.new_id();
        // Forgets the waiter's registration if the request goes away while waiting.
        let mut waiting = Waiting {
            shared: self.clone(),
            id: Some(id.clone()),
        };
        loop {
            // Listen before asking, so a slot freed in between still wakes this waiter.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let class_arg = class.as_str();
            let answer: Result<(u8, u64), _> = self
                .store
                .script(
                    "acquire",
                    CEILING_ACQUIRE
                        .key(&keys.leases)
                        .key(&keys.waiting)
                        .arg(&id)
                        .arg(class_arg)
                        .arg(max)
                        .arg(self.settings.lease_ttl.as_millis() as u64)
                        .arg("wait"),
                )
                .await;
            match answer {
                Ok((1, _)) => {
                    waiting.id = None;
                    return Ok(self.lease(id, max));
                }
                Ok(_) => {}
                Err(why) => {
                    self.on_unavailable(why)?;
                    waiting.id = None;
                    return Ok(self.lease(id, max));
                }
            }
            tokio::select! {
                () = &mut freed => {}
                () = tokio::time::sleep(POLL) => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(GatewayError::QueueTimeout { waited: started.elapsed() });
                }
            }
        }
    }

    pub(super) fn lease(self: &Arc<Self>, id: String, max: usize) -> Lease {
        self.leases.insert(&id);
        Lease {
            shared: self.clone(),
            id,
            max,
            finish: None,
        }
    }

    /// Gives lease (or waiter) `id`, taken under a ceiling of `max`, back; a freed slot that a
    /// refused request may be waiting for is announced to the other gateways (`max` 0: always).
    pub(super) async fn release(&self, id: &str, max: usize) {
        let Some(keys) = &self.ceiling else { return };
        let _: Result<u8, _> = self
            .store
            .script(
                "release",
                CEILING_RELEASE
                    .key(&keys.leases)
                    .key(&keys.waiting)
                    .arg(id)
                    .arg(&keys.freed)
                    .arg(max),
            )
            .await;
    }

    /// Renews every live lease (adopting those taken while Redis was away); then gives back
    /// any that ended while the renewal was on its way, so none outlives its request.
    async fn renew(&self) {
        let Some(keys) = &self.ceiling else { return };
        let ids = self.leases.snapshot();
        if ids.is_empty() || !self.health().is_up() {
            return;
        }
        let mut call = CEILING_RENEW.key(&keys.leases);
        call.arg(self.settings.lease_ttl.as_millis() as u64);
        for id in &ids {
            call.arg(id);
        }
        if self.store.script::<u64>("renew", &call).await.is_err() {
            return;
        }
        for id in ids.iter().filter(|id| !self.leases.contains(id)) {
            self.release(id, 0).await;
        }
    }
}

/// Renews the gateway's leases every third of the TTL while the shared state lives.
pub fn spawn_renewer(shared: &Arc<Shared>) {
    let every = shared.settings.lease_ttl / 3;
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(shared) = weak.upgrade() else { return };
            shared.renew().await;
        }
    });
}

/// An interactive waiter's registration, removed if the request leaves while waiting.
struct Waiting {
    shared: Arc<Shared>,
    id: Option<String>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let shared = self.shared.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move { shared.release(&id, 0).await });
            }
        }
    }
}
