//! The pool's background checks: each replica's `/health` every `health_interval`, its
//! `/metrics` every `metrics_interval`. Both stop once the pool is gone.

use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::replica::Replica;
use super::{signals, Shared};
use crate::forward::client::HttpClient;

/// The most of a `/metrics` page read (vLLM's is tens of KiB).
const METRICS_BYTES_MAX: usize = 4 << 20;

pub(super) fn spawn(pool: Weak<Shared>, client: HttpClient) {
    tokio::spawn(every(pool.clone(), client.clone(), Check::Health));
    tokio::spawn(every(pool, client, Check::Metrics));
}

#[derive(Clone, Copy, Debug)]
enum Check {
    Health,
    Metrics,
}

async fn every(pool: Weak<Shared>, client: HttpClient, check: Check) {
    loop {
        let Some(shared) = pool.upgrade() else {
            return;
        };
        let u = &shared.policy.current().policy.upstream;
        let interval = match check {
            Check::Health => u.health_interval,
            Check::Metrics => u.metrics_interval,
        };
        // A check never outlasts its interval (nor 5 s).
        let limit = interval.min(Duration::from_secs(5));
        let mut checks = JoinSet::new();
        for r in &shared.replicas {
            let (r, client, shared) = (r.clone(), client.clone(), shared.clone());
            checks.spawn(async move {
                match check {
                    Check::Health => health(&shared, &r, &client, limit).await,
                    Check::Metrics => metrics(&r, &client, limit).await,
                }
            });
        }
        while checks.join_next().await.is_some() {}
        shared.refresh_capacity();
        drop(shared);
        tokio::time::sleep(interval).await;
    }
}

async fn health(shared: &Shared, r: &Replica, client: &HttpClient, limit: Duration) {
    let path = shared.policy.current().policy.upstream.health_path.clone();
    let ok = matches!(get(client, r, &path, limit).await, Some((status, _)) if status.is_success());
    let now = Instant::now();
    let t = shared.thresholds();
    if ok {
        let was_up = r.is_up();
        r.healthy(now);
        if !was_up && r.is_up() {
            tracing::info!(replica = %r.target.base, "replica back in rotation");
        }
    } else if r.is_up() {
        if r.failed(&t) {
            tracing::warn!(replica = %r.target.base, "replica ejected: health checks failing");
        }
    } else if r.recovery_due(now) {
        r.still_unhealthy(&t);
    }
}

async fn metrics(r: &Replica, client: &HttpClient, limit: Duration) {
    let Some((status, body)) = get(client, r, "/metrics", limit).await else {
        return;
    };
    if !status.is_success() {
        return;
    }
    let s = signals::parse(&String::from_utf8_lossy(&body));
    if !s.is_empty() {
        r.scraped(s, Instant::now());
    }
}

/// `GET {replica}{path}` within `limit`: the status and body, or `None` on any failure.
async fn get(
    client: &HttpClient,
    r: &Replica,
    path: &str,
    limit: Duration,
) -> Option<(http::StatusCode, Bytes)> {
    let uri: Uri = format!("{}{path}", r.target.base.to_string().trim_end_matches('/'))
        .parse()
        .ok()?;
    let req = Request::get(uri).body(Full::new(Bytes::new())).ok()?;
    let call = async {
        let resp = client.request(req).await.ok()?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), METRICS_BYTES_MAX)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some((status, body))
    };
    tokio::time::timeout(limit, call).await.ok().flatten()
}
