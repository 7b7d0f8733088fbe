//! A request's one call on arrival (`lua/arrive.lua`): its tenant's GCRA, its token budget's
//! charge and, when the local admission has a free slot now, a try at the shared ceiling's
//! lease; whichever of them apply, in that order, in one round trip. With the one at its end
//! ([`super::finish`]: the settle and the release), a request makes two calls to Redis.
//!
//! The call needs the prompt's token count (the budget charges prompt + `max_tokens`), so it
//! runs where the budget is checked, after counting: with `[shared]` the rate limit's 429 comes
//! after the body is parsed and counted, where a single gateway answers it before. That costs a
//! limited request its count and saves every admitted request a round trip; a tenant that goes
//! on past its limit gets the remembered refusal ([`super::rate`]) at the rate limit's place,
//! without counting and without Redis.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::{Arrival, Charge, WINDOW};
use super::finish::Finish;
use super::rate::Rate;
use super::scripts::ARRIVE;
use super::{Shared, Unavailable};
use crate::policy::Class;

/// What a request asks of the shared state on arrival.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub tenant: &'a str,
    /// The tenant's rate limit, if it has one.
    pub rate: Option<Rate>,
    /// The tenant's budget per minute and the tokens this request needs, if it has a budget.
    pub tokens: Option<(u64, u64)>,
    pub class: Class,
}

/// Why the arrival was refused, and when to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Rate(Duration),
    Budget(Duration),
}

/// What an admitted arrival holds: the budget's charge, if one was asked, and what the shared
/// ceiling's layer needs.
#[derive(Debug)]
pub struct Arrived {
    pub charge: Option<Charge>,
    pub arrival: Arrival,
}

impl Shared {
    /// Runs `ask` in one script: `Ok(Ok(_))` admitted, `Ok(Err(_))` refused by the rate or the
    /// budget, `Err` when the state is unavailable.
    pub async fn arrive(
        self: &Arc<Self>,
        ask: &Ask<'_>,
    ) -> Result<Result<Arrived, Refused>, Unavailable> {
        let lease = self.ceiling.as_ref().zip(self.local_room());
        let parts: String = [
            (ask.rate.is_some(), 'r'),
            (ask.tokens.is_some(), 'b'),
            (lease.is_some(), 'l'),
        ]
        .iter()
        .filter_map(|(on, part)| on.then_some(*part))
        .collect();
        if parts.is_empty() {
            return Ok(Ok(Arrived {
                charge: None,
                arrival: Arrival::new(None, None),
            }));
        }
        let id = self.new_id();
        let mut call = ARRIVE.prepare_invoke();
        call.arg(&parts);
        if let Some(r) = ask.rate {
            call.key(self.keys.rate(ask.tenant))
                .arg(r.period_us)
                .arg(r.burst);
        }
        if let Some((budget, needed)) = ask.tokens {
            for k in self.keys.budget(ask.tenant) {
                call.key(k);
            }
            call.arg(&id)
                .arg(budget)
                .arg(needed)
                .arg(WINDOW.as_millis() as u64);
        }
        if let Some((c, max)) = lease {
            call.key(&c.leases)
                .key(&c.waiting)
                .arg(&id)
                .arg(ask.class.as_str())
                .arg(max)
                .arg(self.settings.lease_ttl.as_millis() as u64);
        }
        let sent = Instant::now();
        // A client that goes away while the script is on its way (or an answer lost to the
        // bound) leaves nothing taken: what the script may have taken is given back.
        let mut taken = Untaken {
            shared: self.clone(),
            tenant: ask.tenant.to_owned(),
            id: id.clone(),
            charge: ask.tokens.is_some(),
            lease: lease.map(|(_, max)| max),
        };
        let (verdict, wait, leased): (u8, u64, u8) = self.store.script("arrive", &call).await?;
        taken.charge = false;
        taken.lease = None;
        match (verdict, ask.rate) {
            (0, _) => {}
            (1, Some(rate)) => {
                let wait = Duration::from_micros(wait);
                self.refusals.note(ask.tenant, rate, sent + wait);
                return Ok(Err(Refused::Rate(wait)));
            }
            (2, _) => return Ok(Err(Refused::Budget(Duration::from_millis(wait)))),
            _ => {
                return Err(Unavailable(format!(
                    "arrive answered {verdict} to parts {parts:?}"
                )))
            }
        }
        let finish = ask
            .tokens
            .map(|_| Arc::new(Finish::new(self.clone(), ask.tenant, id.clone())));
        let lease = match lease {
            Some((_, max)) if leased == 1 => Some(self.lease(id, max)),
            _ => None,
        };
        Ok(Ok(Arrived {
            charge: finish.clone().map(Charge::new),
            arrival: Arrival::new(lease, finish),
        }))
    }
}

/// What an arrival's script may have taken until its answer is read: the budget's charge (given
/// back by settling it to 0) and the lease. Given back in the background when dropped armed.
struct Untaken {
    shared: Arc<Shared>,
    tenant: String,
    id: String,
    charge: bool,
    /// The ceiling of the lease asked for.
    lease: Option<usize>,
}

impl Drop for Untaken {
    fn drop(&mut self) {
        if !self.charge && self.lease.is_none() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (shared, charge, lease) = (self.shared.clone(), self.charge, self.lease);
        let (tenant, id) = (
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.id),
        );
        // Sent on the script's connection, after it: Redis runs them in that order.
        rt.spawn(async move {
            if charge {
                let _ = shared.settle_now(&tenant, &id, 0).await;
            }
            if let Some(max) = lease {
                shared.release(&id, max).await;
            }
        });
    }
}
