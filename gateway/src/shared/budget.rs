//! The shared token budget: every charge of the last minute in Redis (id → time, id → tokens,
//! and their running sum), charged on arrival and settled at the end in one script each.
//!
//! When the upstream's ceiling is shared too and the local admission has a free slot, the
//! arrival's script also tries for the request's lease (`lua/arrive.lua`), and the settle and
//! the lease's release go back together (`lua/finish.lua`, through [`Finish`]): one round trip
//! on arrival and one at the end instead of two each.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::finish::Finish;
use super::scripts::{over, ARRIVE, BUDGET_CHARGE};
use super::{Lease, Shared, Unavailable};
use crate::policy::Class;

/// The window a budget covers.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A charge in Redis that can still be lowered to what the request used, and the lease the
/// arrival took with it, if any.
#[derive(Debug)]
pub struct Charge {
    finish: Arc<Finish>,
    lease: Option<Lease>,
}

/// What the charge leaves in the request for the shared ceiling's layer: the lease taken on
/// arrival (if any), and the end the request's lease joins.
#[derive(Clone, Debug)]
pub struct Arrival {
    lease: Arc<Mutex<Option<Lease>>>,
    finish: Arc<Finish>,
}

impl Arrival {
    /// The lease taken on arrival, once.
    pub fn take_lease(&self) -> Option<Lease> {
        self.lease.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Makes `lease` go back with the charge's settle.
    pub fn join(&self, lease: Lease) -> Lease {
        lease.ending_with(self.finish.clone())
    }
}

impl Shared {
    /// Charges `needed` tokens to `tenant` within `budget` per minute: `Ok(Ok(charge))`,
    /// `Ok(Err(wait))` when the budget has no room before `wait`, `Err` when unavailable.
    /// With a shared ceiling and a free local slot, a `class` lease is tried in the same call.
    pub async fn charge(
        self: &Arc<Self>,
        tenant: &str,
        budget: u64,
        needed: u64,
        class: Class,
    ) -> Result<Result<Charge, Duration>, Unavailable> {
        let id = self.new_id();
        let keys = self.keys.budget(tenant);
        let window = WINDOW.as_millis() as u64;
        let ceiling = self.ceiling.as_ref().zip(self.local_room());
        let (ok, wait_ms, leased): (u8, u64, u8) = match ceiling {
            Some((c, max)) => {
                self.store
                    .script(
                        "arrive",
                        over(&ARRIVE, keys.iter().chain([&c.leases, &c.waiting]))
                            .arg(&id)
                            .arg(budget)
                            .arg(needed)
                            .arg(window)
                            .arg(&id)
                            .arg(class.as_str())
                            .arg(max)
                            .arg(self.settings.lease_ttl.as_millis() as u64),
                    )
                    .await?
            }
            None => {
                let (ok, wait_ms): (u8, u64) = self
                    .store
                    .script(
                        "charge",
                        over(&BUDGET_CHARGE, &keys)
                            .arg(&id)
                            .arg(budget)
                            .arg(needed)
                            .arg(window),
                    )
                    .await?;
                (ok, wait_ms, 0)
            }
        };
        if ok != 1 {
            return Ok(Err(Duration::from_millis(wait_ms)));
        }
        let finish = Arc::new(Finish::new(self.clone(), tenant, id.clone()));
        let lease = match ceiling {
            Some((_, max)) if leased == 1 => Some(self.lease(id, max).ending_with(finish.clone())),
            _ => None,
        };
        Ok(Ok(Charge { finish, lease }))
    }
}

impl Charge {
    /// Lowers the charge to `tokens` (never raises it) when the request's holdings go back (a
    /// settle lost to an unavailable Redis keeps the whole reservation, which leaves the window
    /// in a minute).
    pub fn settle(&self, tokens: u64) {
        self.finish.settle(tokens);
    }

    /// What the shared ceiling's layer needs of this charge (see [`Arrival`]); call once.
    pub fn arrival(&mut self) -> Arrival {
        Arrival {
            lease: Arc::new(Mutex::new(self.lease.take())),
            finish: self.finish.clone(),
        }
    }
}
