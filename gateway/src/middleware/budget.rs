//! Token budgets (stack layer 6b, after the cap): a tenant's `tokens_per_minute` is charged on
//! arrival with the exact prompt count plus the `max_tokens` reserved for the completion, so
//! concurrent requests can never overshoot it; when the response ends, the charge is lowered
//! to the real `prompt_tokens + completion_tokens` read from the response's `usage` (when the
//! response carries one — a whole stream without `include_usage` keeps the full reservation).
//! An upstream's error answer generated nothing and is charged nothing; a stream the client
//! left before its usage came is charged the prompt and the output events it was sent (one
//! token each, [`crate::body::output`]), not the whole reservation.
//! 429 `tokens_per_minute_exceeded` with `Retry-After`.
//!
//! With `[shared]`, the charges of every gateway of the deployment are kept in Redis
//! ([`crate::shared::budget`]): one budget per tenant, charged and settled by atomic scripts.
//! A tenant's shared rate limit is checked here too, in the same script as the charge (when it
//! has a budget) and the try at the shared ceiling's lease: one round trip on arrival, once the
//! body is in ([`crate::shared::arrive`], which says why that 429 comes after counting). While Redis is unavailable,
//! `fail = "local"` takes from a local bucket and charges a local budget of the gateway's share
//! (`requests_per_second` and `tokens_per_minute / expected_replicas`) and `fail = "closed"`
//! refuses with 503 `shared_state_unavailable`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use tokio::time::Instant;

use super::around::{Answer, Around, Inner};
use super::auth::Caller;
use super::cap::MaxTokens;
use super::count::PromptTokens;
use super::rate_limit::{limited, RateLimit};
use crate::body::{is_sse, Tap, TapBody};
use crate::error::GatewayError;
use crate::policy::{Class, Tenant};
use crate::shared::{budget as shared_budget, Arrival, Arrived, Ask, Rate, Refused, Shared};
use crate::telemetry::UsageScanner;

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

/// The stage (an [`Around`]): charges the tenant, calls the inner service, settles at the
/// response's end.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    budgets: Arc<TokenBudgets>,
    /// With `[shared]`: the local buckets of the gateway's share of the rate while Redis is
    /// unavailable.
    rates: RateLimit,
    shared: Option<Arc<Shared>>,
}

impl Budget {
    /// Budgets kept locally, or in Redis (with the rate limits) when `shared` is given.
    pub fn new(shared: Option<Arc<Shared>>) -> Self {
        Self {
            budgets: Arc::default(),
            rates: RateLimit::default(),
            shared,
        }
    }

    /// `tenant`'s arrival: its budget charged `needed` when it has one (`tokens`: budget,
    /// needed), locally or in Redis; with `[shared]` its rate limit too and the lease's try, in
    /// the same script. While Redis is unavailable, by `fail`: the gateway's share of the rate,
    /// then of the budget, counted locally. The charge to settle, if any, and the arrival.
    async fn arrive(
        &self,
        tenant: &Tenant,
        tokens: Option<(u64, u64)>,
        class: Class,
    ) -> Result<(Option<Held>, Option<Arrival>), GatewayError> {
        let local = |budget: u64, needed: u64| {
            let charge = self.budgets.charge(&tenant.name, budget, needed)?;
            Ok::<_, GatewayError>((Some(Held::Local(charge)), None))
        };
        let Some(shared) = &self.shared else {
            return match tokens {
                Some((budget, needed)) => local(budget, needed),
                None => Ok((None, None)),
            };
        };
        let ask = Ask {
            tenant: &tenant.name,
            rate: tenant
                .requests_per_second
                .map(|r| Rate::new(r, tenant.burst)),
            tokens,
            class,
        };
        match (shared.arrive(&ask).await, tokens) {
            (Ok(Ok(Arrived { charge, arrival })), _) if charge.is_some() == tokens.is_some() => {
                Ok((charge.map(Held::Shared), Some(arrival)))
            }
            (Ok(Ok(_)), _) => Err(GatewayError::Internal(
                "an arrival's charge does not match the budget asked".into(),
            )),
            (Ok(Err(Refused::Rate(wait))), _) => Err(limited(tenant, wait)),
            (Ok(Err(Refused::Budget(retry_after))), Some((budget, needed))) => {
                Err(GatewayError::TokenBudget {
                    tenant: tenant.name.clone(),
                    budget,
                    needed,
                    retry_after,
                })
            }
            (Ok(Err(Refused::Budget(_))), None) => Err(GatewayError::Internal(
                "a budget refused, none asked".into(),
            )),
            (Err(why), _) => {
                shared.on_unavailable(why)?;
                let n = shared.share();
                self.rates.take_share(tenant, n)?;
                match tokens {
                    Some((budget, needed)) => local((budget / n as u64).max(1), needed),
                    None => Ok((None, None)),
                }
            }
        }
    }
}

impl<B: Send + 'static> Around<B> for Budget {
    fn around<S: Inner<B>>(&self, mut req: Request<B>, mut inner: S) -> Answer {
        let ext = req.extensions();
        let class = Caller::class_of(ext);
        let tenant = ext.get::<Caller>().and_then(|c| c.tenant.clone());
        let Some(tenant) = tenant else {
            return Box::pin(inner.call(req));
        };
        // A budget to charge; with `[shared]`, a rate to take in the arrival's script too.
        let shared_rate = self.shared.is_some() && tenant.requests_per_second.is_some();
        if tenant.tokens_per_minute.is_none() && !shared_rate {
            return Box::pin(inner.call(req));
        }
        let prompt = ext.get::<PromptTokens>().map_or(0, |p| p.0) as u64;
        let max = ext.get::<MaxTokens>().map_or(0, |m| m.0) as u64;
        let tokens = tenant
            .tokens_per_minute
            .map(|budget| (budget, prompt + max));
        let stage = self.clone();
        Box::pin(async move {
            let (charge, arrival) = stage.arrive(&tenant, tokens, class).await?;
            if let Some(a) = arrival {
                // The lease the arrival took (if any), for the shared ceiling's stage.
                req.extensions_mut().insert(a);
            }
            let Some(charge) = charge else {
                // A rate alone: nothing to settle.
                return inner.call(req).await;
            };
            // Refused or failed before anything was generated, or the client gone while the
            // request waited (this future dropped): nothing to charge.
            let mut charge = Reserved {
                charge,
                started: false,
            };
            let resp = inner.call(req).await?;
            if !resp.status().is_success() {
                // Nothing generated: `charge` goes back whole as it drops.
                return Ok(resp);
            }
            charge.started = true;
            let stream = is_sse(resp.headers());
            Ok(resp.map(|b| {
                let settle = Settle {
                    reserved: charge,
                    prompt,
                    usage: UsageScanner::default(),
                    sent: 0,
                    ended: false,
                    stream,
                };
                TapBody::new(b, settle).boxed_unsync()
            }))
        })
    }
}

/// A request's charge, given back whole when dropped before its response started.
#[derive(Debug)]
struct Reserved {
    charge: Held,
    started: bool,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.started {
            self.charge.settle(0);
        }
    }
}

/// Settles the charge to the usage the response carries, once it is over; to the prompt and
/// the output events sent when the client left first.
#[derive(Debug)]
struct Settle {
    reserved: Reserved,
    prompt: u64,
    usage: UsageScanner,
    /// Events (or whole answers) with generated output that went by.
    sent: u64,
    /// The body ended (a whole answer, or one the upstream broke off).
    ended: bool,
    /// An event stream (whole only when its end was read: hyper's `complete`, every byte of a
    /// known length sent, says nothing of the events still to come).
    stream: bool,
}

impl Tap for Settle {
    fn data(&mut self, data: &Bytes) {
        self.usage.push(data);
        self.sent += crate::body::output::scan(data).tokens as u64;
    }

    fn ended(&mut self, _result: Result<(), &crate::body::BoxError>) {
        self.ended = true;
    }

    fn dropped(&mut self, complete: bool) {
        self.ended = complete && !self.stream;
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(c) = self.usage.completion_tokens() {
            self.reserved.charge.settle(self.prompt + c);
        } else if !self.ended {
            // The client left before the usage: what it was sent (the upstream is cancelled
            // with the connection).
            self.reserved.charge.settle(self.prompt + self.sent);
        }
    }
}

#[cfg(test)]
mod tests;
