//! Per-tenant rate limit (stack layer 3): GCRA through `governor`, one limiter per tenant,
//! keyed by the authenticated tenant (never by a forwarded-for header a client can forge).
//! 429 `rate_limit_exceeded` with `Retry-After`. Open gateways (no tenants) have no limit.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::Request;

use super::auth::Caller;
use super::check::Check;
use crate::error::GatewayError;

/// The tenants' limiters, rebuilt when a reload changes a tenant's quota.
#[derive(Clone, Debug, Default)]
pub struct RateLimit {
    buckets: Arc<Mutex<HashMap<String, Bucket>>>,
}

/// One tenant's limiter and the quota it was built for.
#[derive(Debug)]
struct Bucket {
    quota: Quota,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimit {
    fn limiter(&self, tenant: &str, quota: Quota) -> Arc<DefaultDirectRateLimiter> {
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(tenant) {
            Some(b) if b.quota == quota => b.limiter.clone(),
            _ => {
                let limiter = Arc::new(RateLimiter::direct(quota));
                let bucket = Bucket {
                    quota,
                    limiter: limiter.clone(),
                };
                map.insert(tenant.to_owned(), bucket);
                limiter
            }
        }
    }
}

/// The GCRA quota for `rate` requests per second with `burst` at once.
pub fn quota(rate: f64, burst: u32) -> Option<Quota> {
    let period = Duration::from_secs_f64(1.0 / rate);
    let burst = NonZeroU32::new(burst.max(1))?;
    Some(Quota::with_period(period)?.allow_burst(burst))
}

impl<B> Check<B> for RateLimit {
    fn check(&self, req: &mut Request<B>) -> Result<(), GatewayError> {
        let Some(tenant) = req
            .extensions()
            .get::<Caller>()
            .and_then(|c| c.tenant.clone())
        else {
            return Ok(());
        };
        let Some(rate) = tenant.requests_per_second else {
            return Ok(());
        };
        let Some(quota) = quota(rate, tenant.burst) else {
            return Ok(());
        };
        match self.limiter(&tenant.name, quota).check() {
            Ok(()) => Ok(()),
            Err(not_until) => Err(GatewayError::RateLimited {
                tenant: tenant.name.clone(),
                rate,
                retry_after: not_until.wait_time_from(DefaultClock::default().now()),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
