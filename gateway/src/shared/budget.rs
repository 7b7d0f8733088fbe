//! The shared token budget: every charge of the last minute in Redis (id → time, id → tokens,
//! and their running sum), charged on arrival and settled at the end in one script each.

use std::sync::Arc;
use std::time::Duration;

use super::scripts::{BUDGET_CHARGE, BUDGET_SETTLE};
use super::{Shared, Unavailable};

/// The window a budget covers.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A charge in Redis that can still be lowered to what the request used.
#[derive(Debug)]
pub struct Charge {
    shared: Arc<Shared>,
    tenant: String,
    id: String,
}

impl Shared {
    /// Charges `needed` tokens to `tenant` within `budget` per minute: `Ok(Ok(charge))`,
    /// `Ok(Err(wait))` when the budget has no room before `wait`, `Err` when unavailable.
    pub async fn charge(
        self: &Arc<Self>,
        tenant: &str,
        budget: u64,
        needed: u64,
    ) -> Result<Result<Charge, Duration>, Unavailable> {
        let id = self.new_id();
        let keys = self.keys.budget(tenant);
        let (ok, wait_ms): (u8, u64) = self
            .store
            .script(
                "charge",
                BUDGET_CHARGE
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(&id)
                    .arg(budget)
                    .arg(needed)
                    .arg(WINDOW.as_millis() as u64),
            )
            .await?;
        Ok(if ok == 1 {
            Ok(Charge {
                shared: self.clone(),
                tenant: tenant.to_owned(),
                id,
            })
        } else {
            Err(Duration::from_millis(wait_ms))
        })
    }
}

impl Charge {
    /// Lowers the charge to `tokens` (never raises it). Sent in the background: a settle lost
    /// to an unavailable Redis keeps the whole reservation, which leaves the window in a minute.
    pub fn settle(&self, tokens: u64) {
        let (shared, tenant, id) = (self.shared.clone(), self.tenant.clone(), self.id.clone());
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            let _ = shared.settle_now(&tenant, &id, tokens).await;
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
            .script(
                "settle",
                BUDGET_SETTLE
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(id)
                    .arg(tokens),
            )
            .await
    }
}
