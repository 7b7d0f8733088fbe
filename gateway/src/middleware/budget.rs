//! Token budgets (stack layer 6b, after the cap): a tenant's `tokens_per_minute` is charged on
//! arrival with the exact prompt count plus the `max_tokens` reserved for the completion, so
//! concurrent requests can never overshoot it; when the response ends, the charge is lowered
//! to the real `prompt_tokens + completion_tokens` read from the response's `usage` (when the
//! response carries one — a stream without `include_usage` keeps the full reservation).
//! 429 `tokens_per_minute_exceeded` with `Retry-After`.
//!
//! With `[shared]`, the charges of every gateway of the deployment are kept in Redis
//! ([`crate::shared::budget`]): one budget per tenant, charged and settled by atomic scripts.
//! While Redis is unavailable, `fail = "local"` charges a local budget of the gateway's share
//! (`tokens_per_minute / expected_replicas`) and `fail = "closed"` refuses with 503
//! `shared_state_unavailable`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::auth::Caller;
use super::cap::MaxTokens;
use super::count::PromptTokens;
use crate::body::{GatewayBody, Tap, TapBody};
use crate::error::GatewayError;
use crate::policy::Class;
use crate::shared::{budget as shared_budget, Shared};
use crate::telemetry::UsageScanner;
use crate::BoxFuture;

/// The window a budget covers.
const WINDOW: Duration = Duration::from_secs(60);

/// Every tenant's charges over the last minute.
#[derive(Debug, Default)]
pub struct TokenBudgets {
    ledgers: Mutex<HashMap<String, Ledger>>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// (when, id, tokens), oldest first.
    charges: VecDeque<(Instant, u64, u64)>,
    next_id: u64,
}

impl Ledger {
    fn expire(&mut self, now: Instant) {
        while self
            .charges
            .front()
            .is_some_and(|(at, _, _)| now.duration_since(*at) >= WINDOW)
        {
            self.charges.pop_front();
        }
    }

    fn used(&self) -> u64 {
        self.charges.iter().map(|c| c.2).sum()
    }
}

/// A charge that can still be lowered to what the request really used.
#[derive(Debug)]
pub struct Charge {
    budgets: Arc<TokenBudgets>,
    tenant: String,
    id: u64,
}

impl Charge {
    /// Lowers the charge to `tokens` (never raises it).
    pub fn settle(&self, tokens: u64) {
        let mut map = self.budgets.lock();
        if let Some(l) = map.get_mut(&self.tenant) {
            if let Some(c) = l.charges.iter_mut().find(|c| c.1 == self.id) {
                c.2 = c.2.min(tokens);
            }
        }
    }
}

impl TokenBudgets {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Ledger>> {
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Charges `needed` tokens to `tenant` within `budget` per minute, or says when to retry.
    pub fn charge(
        self: &Arc<Self>,
        tenant: &str,
        budget: u64,
        needed: u64,
    ) -> Result<Charge, GatewayError> {
        let now = Instant::now();
        let mut map = self.lock();
        let ledger = map.entry(tenant.to_owned()).or_default();
        ledger.expire(now);
        let used = ledger.used();
        if used + needed > budget {
            // When enough of the oldest charges leave the window; a request larger than the
            // whole budget can never pass, and waits out a full window like any other.
            let mut freed = 0;
            let mut at = now + WINDOW;
            for (when, _, tokens) in &ledger.charges {
                freed += tokens;
                if used - freed + needed <= budget {
                    at = *when + WINDOW;
                    break;
                }
            }
            return Err(GatewayError::TokenBudget {
                tenant: tenant.to_owned(),
                budget,
                needed,
                retry_after: at.saturating_duration_since(now),
            });
        }
        let id = ledger.next_id;
        ledger.next_id += 1;
        ledger.charges.push_back((now, id, needed));
        Ok(Charge {
            budgets: self.clone(),
            tenant: tenant.to_owned(),
            id,
        })
    }
}

/// A charge, local or shared.
#[derive(Debug)]
enum Held {
    Local(Charge),
    Shared(shared_budget::Charge),
}

impl Held {
    fn settle(&self, tokens: u64) {
        match self {
            Self::Local(c) => c.settle(tokens),
            Self::Shared(c) => c.settle(tokens),
        }
    }
}

/// Charges `needed` tokens to `tenant`: in Redis when shared (by `fail` when it is not
/// available), else locally.
async fn charge(
    budgets: &Arc<TokenBudgets>,
    shared: Option<&Arc<Shared>>,
    tenant: &str,
    budget: u64,
    needed: u64,
    class: Class,
) -> Result<Held, GatewayError> {
    let Some(shared) = shared else {
        return budgets.charge(tenant, budget, needed).map(Held::Local);
    };
    match shared.charge(tenant, budget, needed, class).await {
        Ok(Ok(c)) => Ok(Held::Shared(c)),
        Ok(Err(retry_after)) => Err(GatewayError::TokenBudget {
            tenant: tenant.to_owned(),
            budget,
            needed,
            retry_after,
        }),
        Err(why) => {
            shared.on_unavailable(why)?;
            let share = (budget / shared.share() as u64).max(1);
            budgets.charge(tenant, share, needed).map(Held::Local)
        }
    }
}

/// The layer.
#[derive(Clone, Debug, Default)]
pub struct BudgetLayer {
    budgets: Arc<TokenBudgets>,
    shared: Option<Arc<Shared>>,
}

impl BudgetLayer {
    /// Budgets kept locally, or in Redis when `shared` is given.
    pub fn new(shared: Option<Arc<Shared>>) -> Self {
        Self {
            budgets: Arc::default(),
            shared,
        }
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = Budget<S>;

    fn layer(&self, inner: S) -> Budget<S> {
        Budget {
            inner,
            budgets: self.budgets.clone(),
            shared: self.shared.clone(),
        }
    }
}

/// Charges the tenant, calls the inner service, settles at the response's end.
#[derive(Clone, Debug)]
pub struct Budget<S> {
    inner: S,
    budgets: Arc<TokenBudgets>,
    shared: Option<Arc<Shared>>,
}

impl<S, B> Service<Request<B>> for Budget<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = GatewayError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = GatewayError;
    type Future = BoxFuture<Result<Response<GatewayBody>, GatewayError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), GatewayError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let ext = req.extensions();
        let class = ext.get::<Caller>().map(|c| c.class).unwrap_or_default();
        let tenant = ext.get::<Caller>().and_then(|c| c.tenant.clone());
        let Some((tenant, budget)) = tenant.and_then(|t| t.tokens_per_minute.map(|b| (t, b)))
        else {
            return Box::pin(self.inner.call(req));
        };
        let prompt = ext.get::<PromptTokens>().map_or(0, |p| p.0) as u64;
        let max = ext.get::<MaxTokens>().map_or(0, |m| m.0) as u64;
        let (budgets, shared) = (self.budgets.clone(), self.shared.clone());
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let needed = prompt + max;
            let mut charge = charge(
                &budgets,
                shared.as_ref(),
                &tenant.name,
                budget,
                needed,
                class,
            )
            .await?;
            if let Held::Shared(c) = &mut charge {
                // The lease the charge's script took (if any), for the shared ceiling's layer.
                req.extensions_mut().insert(c.arrival());
            }
            let resp = inner.call(req).await;
            match resp {
                Ok(resp) => Ok(resp.map(|b| {
                    let settle = Settle {
                        charge,
                        prompt,
                        usage: UsageScanner::default(),
                    };
                    TapBody::new(b, settle).boxed_unsync()
                })),
                Err(e) => {
                    // Refused or failed before anything was generated: nothing to charge.
                    charge.settle(0);
                    Err(e)
                }
            }
        })
    }
}

/// Settles the charge to the usage the response carries, once it is over.
#[derive(Debug)]
struct Settle {
    charge: Held,
    prompt: u64,
    usage: UsageScanner,
}

impl Tap for Settle {
    fn data(&mut self, data: &Bytes) {
        self.usage.push(data);
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(c) = self.usage.completion_tokens() {
            self.charge.settle(self.prompt + c);
        }
    }
}

#[cfg(test)]
mod tests;
