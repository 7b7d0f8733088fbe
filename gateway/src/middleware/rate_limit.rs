//! Per-tenant rate limit (stack layer 3): GCRA, one bucket per tenant, keyed by the
//! authenticated tenant (never by a forwarded-for header a client can forge).
//! 429 `rate_limit_exceeded` with `Retry-After`. Open gateways (no tenants) have no limit.
//!
//! Alone, a gateway keeps its buckets in memory (`governor`). With `[shared]`, every gateway of
//! the deployment takes from one bucket per tenant in Redis ([`crate::shared::rate`]), checked
//! before the request goes on; while Redis is unavailable, `fail = "local"` takes from a local
//! bucket of the gateway's share (`requests_per_second / expected_replicas`, burst likewise,
//! rounded up) and `fail = "closed"` refuses with 503 `shared_state_unavailable`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::Request;
use tower::{Layer, Service};

use super::auth::Caller;
use super::check::Check;
use crate::error::GatewayError;
use crate::policy::Tenant;
use crate::shared::Shared;
use crate::BoxFuture;

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
}

fn limited(tenant: &Tenant, retry_after: Duration) -> GatewayError {
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
        match limited_tenant(req) {
            Some((tenant, rate)) => self.take(&tenant, rate, tenant.burst),
            None => Ok(()),
        }
    }
}

/// The layer: local buckets, or shared ones when `[shared]` is on.
#[derive(Clone, Debug, Default)]
pub struct RateLimitLayer {
    local: RateLimit,
    shared: Option<Arc<Shared>>,
}

impl RateLimitLayer {
    pub fn new(shared: Option<Arc<Shared>>) -> Self {
        Self {
            local: RateLimit::default(),
            shared,
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            limits: self.clone(),
        }
    }
}

/// Checks the tenant's bucket, then calls the inner service.
#[derive(Clone, Debug)]
pub struct RateLimited<S> {
    inner: S,
    limits: RateLimitLayer,
}

impl<S, B> Service<Request<B>> for RateLimited<S>
where
    S: Service<Request<B>, Error = GatewayError> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = GatewayError;
    type Future = BoxFuture<Result<S::Response, GatewayError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some((tenant, rate)) = limited_tenant(&req) else {
            return Box::pin(self.inner.call(req));
        };
        let Some(shared) = self.limits.shared.clone() else {
            return match self.limits.local.take(&tenant, rate, tenant.burst) {
                Ok(()) => Box::pin(self.inner.call(req)),
                Err(e) => Box::pin(std::future::ready(Err(e))),
            };
        };
        let local = self.limits.local.clone();
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            match shared.gcra(&tenant.name, rate, tenant.burst).await {
                Ok(Ok(())) => {}
                Ok(Err(wait)) => return Err(limited(&tenant, wait)),
                Err(why) => {
                    shared.on_unavailable(why)?;
                    let n = shared.share();
                    local.take(&tenant, rate / n as f64, tenant.burst.div_ceil(n as u32))?;
                }
            }
            inner.call(req).await
        })
    }
}

#[cfg(test)]
mod tests;
