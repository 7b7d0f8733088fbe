//! Per-tenant rate limit (stack layer 3): GCRA, one bucket per tenant, keyed by the
//! authenticated tenant (never by a forwarded-for header a client can forge).
//! 429 `rate_limit_exceeded` with `Retry-After`. Open gateways (no tenants) have no limit.
//!
//! Alone, a gateway keeps its buckets in memory (`governor`). With `[shared]`, every gateway of
//! the deployment takes from one bucket per tenant in Redis ([`crate::shared::rate`]), in the
//! request's one script on arrival ([`crate::shared::arrive`]), which runs at the budget's stage
//! ([`crate::middleware::budget`]) once the body is in and counted (with the budget's charge
//! and the try at the shared ceiling's lease: a lease taken before the body was in was held by
//! a client that stalled mid-upload). Here, with `[shared]`, only a refusal of Redis that still
//! stands is answered, at once, without a call. While Redis is unavailable, `fail = "local"`
//! takes from a local bucket of the gateway's share (`requests_per_second / expected_replicas`,
//! burst likewise, rounded up; [`RateLimit::take_share`]) and `fail = "closed"` refuses with
//! 503 `shared_state_unavailable`.

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
use crate::policy::validate::EXPECTED_REPLICAS_MAX;
use crate::policy::Tenant;
use crate::shared::Shared;

/// The tenants' limiters, rebuilt when a reload changes a tenant's quota; with `[shared]`,
/// the shared state whose refusals it answers.
#[derive(Clone, Debug, Default)]
pub struct RateLimit {
    buckets: Arc<Mutex<HashMap<String, Bucket>>>,
    shared: Option<Arc<Shared>>,
}

/// One tenant's limiter and the quota it was built for.
#[derive(Debug)]
struct Bucket {
    quota: Quota,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimit {
    /// Local buckets, or the shared ones' standing refusals when `shared` is given.
    pub fn new(shared: Option<Arc<Shared>>) -> Self {
        Self {
            buckets: Arc::default(),
            shared,
        }
    }

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

impl RateLimit {
    /// Takes one request from `tenant`'s local bucket of `rate` per second and `burst`.
    fn take(&self, tenant: &Tenant, rate: f64, burst: u32) -> Result<(), GatewayError> {
        let Some(quota) = quota(rate, burst) else {
            return Ok(());
        };
        match self.limiter(&tenant.name, quota).check() {
            Ok(()) => Ok(()),
            Err(not_until) => Err(limited(
                tenant,
                not_until.wait_time_from(DefaultClock::default().now()),
            )),
        }
    }

    /// Takes one request from `tenant`'s local bucket of its share of `share` gateways (rate
    /// and burst divided, the burst rounded up); none without a rate.
    pub fn take_share(&self, tenant: &Tenant, share: usize) -> Result<(), GatewayError> {
        let Some(rate) = tenant.requests_per_second else {
            return Ok(());
        };
        // Validation bounds `share` (shared.expected_replicas); the clamp keeps one no policy
        // allows from truncating to a zero divisor or a period the limiter cannot hold.
        let n = share.clamp(1, EXPECTED_REPLICAS_MAX) as u32;
        self.take(tenant, rate / f64::from(n), tenant.burst.div_ceil(n))
    }
}

/// 429 `rate_limit_exceeded` for `tenant`, retry after `retry_after`.
pub fn limited(tenant: &Tenant, retry_after: Duration) -> GatewayError {
    GatewayError::RateLimited {
        tenant: tenant.name.clone(),
        rate: tenant.requests_per_second.unwrap_or_default(),
        retry_after,
    }
}

/// The caller's tenant when it has a rate limit.
fn limited_tenant<B>(req: &Request<B>) -> Option<(Arc<Tenant>, f64)> {
    let tenant = req.extensions().get::<Caller>()?.tenant.clone()?;
    let rate = tenant.requests_per_second?;
    Some((tenant, rate))
}

impl<B> Check<B> for RateLimit {
    fn check(&self, req: &mut Request<B>) -> Result<(), GatewayError> {
        let Some((tenant, rate)) = limited_tenant(req) else {
            return Ok(());
        };
        let Some(shared) = &self.shared else {
            return self.take(&tenant, rate, tenant.burst);
        };
        // Shared: checked by the arrival's script (see the module's doc); here only a refusal
        // Redis gave that still stands.
        match shared.rate_refused(&tenant.name, rate, tenant.burst) {
            Some(wait) => Err(limited(&tenant, wait)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
