//! The end of a request's hold on the shared state: its budget charge settled and its lease
//! given back in one script (`lua/finish.lua`) once both are done with, or whichever of them
//! there is alone. Sent in the background: nothing waits on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::scripts::{over, BUDGET_SETTLE, FINISH};
use super::{Shared, Unavailable};

/// No settle asked: the charge stays whole.
const WHOLE: u64 = u64::MAX;

/// One charge, the tokens to settle it to, and the lease that ended with it. Dropped by the
/// last of the charge and the lease: then it sends what is left to send.
#[derive(Debug)]
pub struct Finish {
    shared: Arc<Shared>,
    tenant: String,
    charge: String,
    settle_to: AtomicU64,
    /// The lease's id and the ceiling it was taken under, once it has ended.
    lease: Mutex<Option<(String, usize)>>,
}

impl Finish {
    pub fn new(shared: Arc<Shared>, tenant: &str, charge: String) -> Self {
        Self {
            shared,
            tenant: tenant.to_owned(),
            charge,
            settle_to: AtomicU64::new(WHOLE),
            lease: Mutex::default(),
        }
    }

    /// Lowers the charge to `tokens` (the lowest asked wins; never raised).
    pub fn settle(&self, tokens: u64) {
        self.settle_to.fetch_min(tokens, Ordering::Relaxed);
    }

    /// The lease `id` (taken under a ceiling of `max`) ended: it goes back with the settle.
    pub fn lease_ended(&self, id: String, max: usize) {
        *self.lease.lock().unwrap_or_else(|e| e.into_inner()) = Some((id, max));
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        let settle = Some(self.settle_to.load(Ordering::Relaxed)).filter(|t| *t != WHOLE);
        let lease = self.lease.lock().unwrap_or_else(|e| e.into_inner()).take();
        if settle.is_none() && lease.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.shared.clone();
        let (tenant, charge) = (
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.charge),
        );
        rt.spawn(async move {
            match (settle, lease) {
                (Some(tokens), Some((id, max))) => {
                    let _ = shared.finish(&tenant, &charge, tokens, &id, max).await;
                }
                (Some(tokens), None) => {
                    let _ = shared.settle_now(&tenant, &charge, tokens).await;
                }
                (None, Some((id, max))) => shared.release(&id, max).await,
                (None, None) => {}
            }
        });
    }
}

impl Shared {
    /// Lowers charge `id` of `tenant` to `tokens`; the tokens given back.
    pub async fn settle_now(
        &self,
        tenant: &str,
        id: &str,
        tokens: u64,
    ) -> Result<u64, Unavailable> {
        let keys = self.keys.budget(tenant);
        self.store
            .script("settle", over(&BUDGET_SETTLE, &keys).arg(id).arg(tokens))
            .await
    }

    /// [`Self::settle_now`] and the release of lease `lease` in one script.
    async fn finish(
        &self,
        tenant: &str,
        charge: &str,
        tokens: u64,
        lease: &str,
        max: usize,
    ) -> Result<u64, Unavailable> {
        let Some(c) = &self.ceiling else {
            return self.settle_now(tenant, charge, tokens).await;
        };
        let keys = self.keys.budget(tenant);
        self.store
            .script(
                "finish",
                over(&FINISH, keys.iter().chain([&c.leases, &c.waiting]))
                    .arg(charge)
                    .arg(tokens)
                    .arg(lease)
                    .arg(&c.freed)
                    .arg(max),
            )
            .await
    }
}
