//! Several replicas of one model behind the gateway (`upstream.kind = "openai"` with one or
//! more `urls`): vLLM, SGLang, `llama-server` or bundled engines.
//!
//! - Balancing: least outstanding requests among the replicas that are up, not saturated and
//!   under `replica_active_max`; ties rotate.
//! - Capacity: admission's ceiling follows the replicas — `active_max`, and at most
//!   `replica_active_max` per available replica — so requests wait in the gateway's queue
//!   (measured, bounded, sheddable) rather than inside a full engine.
//! - Health: `/health` every `health_interval`; `eject_after` failures in a row (requests or
//!   checks) eject a replica for `eject_for` (doubling), then a passing check re-admits it.
//! - Saturation: each engine's own `/metrics` ([`signals`]) — queue or KV past the policy's
//!   thresholds, or readings gone stale, and the replica takes no more.
//! - Retries: only for connect failures (the request never reached an engine), on another
//!   replica; never once a request may have started generating.

mod lease;
mod probe;
mod replica;
pub mod signals;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

pub use lease::Lease;
pub use replica::{Replica, Thresholds};

use super::client::HttpClient;
use super::upstream::{Target, Upstream};
use crate::error::GatewayError;
use crate::policy::PolicyStore;

/// The replica with the fewest outstanding requests; the first in `it` wins a tie.
fn least<'a>(it: &mut dyn Iterator<Item = &'a Arc<Replica>>) -> Option<&'a Arc<Replica>> {
    it.fold(None, |best, r| match best {
        Some(b) if b.outstanding() <= r.outstanding() => Some(b),
        _ => Some(r),
    })
}

/// How one per-replica gauge reads its value.
type ReplicaGauge<'a> = dyn Fn(&Replica) -> Option<f64> + 'a;

/// What the pool's parts share.
#[derive(Debug)]
pub struct Shared {
    replicas: Vec<Arc<Replica>>,
    policy: Arc<PolicyStore>,
    capacity: watch::Sender<Option<usize>>,
    /// Where the next tie-break starts.
    next: AtomicUsize,
    retries: AtomicU64,
}

impl Shared {
    pub(crate) fn thresholds(&self) -> Thresholds {
        let p = &self.policy.current().policy.upstream;
        Thresholds {
            eject_after: p.eject_after,
            eject_for: p.eject_for,
            waiting_max: f64::from(p.engine_waiting_max),
            kv_usage_max: p.engine_kv_usage_max,
            stale_after: p.metrics_stale_after,
        }
    }

    /// Recomputes admission's ceiling from the replicas' state. No replica up: no ceiling, so
    /// requests fail fast with `engine_unavailable` instead of waiting for the queue timeout.
    pub(crate) fn refresh_capacity(&self) {
        let (t, now) = (self.thresholds(), Instant::now());
        let per = self.policy.current().policy.upstream.replica_active_max;
        let up: Vec<_> = self.replicas.iter().filter(|r| r.is_up()).collect();
        let available = up.iter().filter(|r| !r.is_saturated(&t, now)).count();
        let capacity = match (up.is_empty(), per) {
            (true, _) => None,
            (false, Some(per)) => Some(available * per),
            (false, None) => (available == 0).then_some(0),
        };
        self.capacity.send_if_modified(|c| {
            let changed = *c != capacity;
            *c = capacity;
            changed
        });
    }

    /// The replica for the next attempt: up and not in `tried`; preferably not saturated and
    /// under its own ceiling; fewest outstanding requests.
    fn pick(&self, tried: &[usize]) -> Option<&Arc<Replica>> {
        let (t, now) = (self.thresholds(), Instant::now());
        let per = self.policy.current().policy.upstream.replica_active_max;
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n.max(1);
        let rotated = || {
            (0..n)
                .map(move |i| &self.replicas[(start + i) % n])
                .filter(|r| r.is_up() && !tried.contains(&r.index))
        };
        let mut preferred = rotated()
            .filter(|r| !r.is_saturated(&t, now) && per.is_none_or(|p| r.outstanding() < p));
        least(&mut preferred).or_else(|| least(&mut rotated()))
    }
}

/// The replicas of `upstream.urls`, as one [`Upstream`].
#[derive(Debug, Clone)]
pub struct ReplicaPool(Arc<Shared>);

impl ReplicaPool {
    /// A pool over `urls`; every replica starts up, and the first checks follow at once.
    pub fn new(urls: &[String], policy: Arc<PolicyStore>) -> Result<Self, GatewayError> {
        let replicas = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let base = url.trim_end_matches('/').parse().map_err(|e| {
                    GatewayError::Internal(format!("bad upstream URL {url:?}: {e}"))
                })?;
                Ok(Arc::new(Replica::new(i, Target { base })))
            })
            .collect::<Result<Vec<_>, GatewayError>>()?;
        if replicas.is_empty() {
            return Err(GatewayError::Internal("no upstream URLs".into()));
        }
        let shared = Shared {
            replicas,
            policy,
            capacity: watch::channel(None).0,
            next: AtomicUsize::new(0),
            retries: AtomicU64::new(0),
        };
        shared.refresh_capacity();
        Ok(Self(Arc::new(shared)))
    }

    /// Starts the health checks and metrics reads; they stop when the pool is dropped.
    pub fn spawn_probes(&self, client: HttpClient) {
        probe::spawn(Arc::downgrade(&self.0), client);
    }

    pub fn replicas(&self) -> &[Arc<Replica>] {
        &self.0.replicas
    }
}

impl Upstream for ReplicaPool {
    fn target(&self) -> Result<Target, GatewayError> {
        self.lease(&[]).map(|l| l.target.clone())
    }

    fn lease(&self, tried: &[usize]) -> Result<Lease, GatewayError> {
        if !tried.is_empty() {
            self.0.retries.fetch_add(1, Ordering::Relaxed);
        }
        match self.0.pick(tried) {
            Some(r) => Ok(Lease::held(r.clone(), self.0.clone())),
            None => {
                let up = self.0.replicas.iter().filter(|r| r.is_up()).count();
                Err(GatewayError::EngineUnavailable(format!(
                    "no upstream replica to try: {up} of {} up, {} already failed to connect",
                    self.0.replicas.len(),
                    tried.len()
                )))
            }
        }
    }

    fn is_ready(&self) -> bool {
        self.0.replicas.iter().any(|r| r.is_up())
    }

    fn capacity(&self) -> Option<watch::Receiver<Option<usize>>> {
        Some(self.0.capacity.subscribe())
    }

    fn render_metrics(&self, out: &mut String) {
        let (t, now) = (self.0.thresholds(), Instant::now());
        let gauges: [(&str, &str, &ReplicaGauge); 5] = [
            ("sluice_upstream_replica_up", "1 while the replica is in rotation (not ejected).", &|r| {
                Some(f64::from(u8::from(r.is_up())))
            }),
            ("sluice_upstream_replica_outstanding", "Requests sent to the replica whose responses have not ended.", &|r| {
                Some(r.outstanding() as f64)
            }),
            ("sluice_upstream_replica_saturated", "1 while the replica's engine reports its queue or KV cache past the policy's thresholds, or its metrics are stale.", &|r| {
                Some(f64::from(u8::from(r.is_saturated(&t, now))))
            }),
            ("sluice_upstream_replica_engine_waiting", "Requests waiting inside the replica's engine, as its metrics last said.", &|r| {
                r.signals(now).and_then(|(s, _)| s.waiting)
            }),
            ("sluice_upstream_replica_kv_usage", "KV cache use of the replica's engine (0-1), as its metrics last said.", &|r| {
                r.signals(now).and_then(|(s, _)| s.kv_usage)
            }),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for r in &self.0.replicas {
                if let Some(v) = value(r) {
                    let _ = writeln!(out, "{name}{{replica=\"{}\"}} {v}", r.target.base);
                }
            }
        }
        let name = "sluice_upstream_replica_ejections_total";
        let _ = writeln!(
            out,
            "# HELP {name} Times the replica was taken out of rotation.\n# TYPE {name} counter"
        );
        for r in &self.0.replicas {
            let _ = writeln!(
                out,
                "{name}{{replica=\"{}\"}} {}",
                r.target.base,
                r.ejections()
            );
        }
        let name = "sluice_upstream_retries_total";
        let _ = writeln!(
            out,
            "# HELP {name} Attempts on another replica after a connect failure.\n# TYPE {name} counter\n{name} {}",
            self.0.retries.load(Ordering::Relaxed)
        );
    }
}
