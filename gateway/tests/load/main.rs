//! Overload, then a mixed soak, against the real bundled engine (one engine for both).
//!
//! The CI versions run a 10 s burst and a 60 s soak, with bounds that leave room for a
//! loaded two-core machine; the documented runs (`docs/reliability.md`) are
//! `SLUICE_OVERLOAD_SECS=60 SLUICE_SOAK_SECS=600 SLUICE_LOAD_STRICT=1`, which also hold the
//! issue's own targets (shed p99 ≤ 5 ms, admitted TTFT p95 ≤ 1.5× unloaded).
//!
//! A test binary of its own, with the e2e suite's harness: the gateway's memory is read from
//! this process's RSS, which must hold nothing but this gateway and its clients (inside the
//! e2e binary, tests running alongside, such as the hostile catalogue's huge bodies, counted
//! too).

// The harness serves the whole e2e suite; this binary uses part of it.
#[allow(dead_code)]
#[path = "../e2e/common.rs"]
mod common;
#[allow(dead_code)]
#[path = "../e2e/engine.rs"]
mod engine;
mod overload;
mod process;
mod sample;
mod soak;

use std::time::Duration;

use serde_json::{json, Value};
use sluice_gateway::policy::Policy;

/// A short streamed chat of exactly 16 tokens; `n` makes its prompt differ from the others'
/// so that no request's prefill is served from another's cached prefix.
pub fn short_stream(n: usize) -> Value {
    json!({"messages": [{"role": "user", "content": format!("Request {n}: count from {n} to {}.", n + 10)}],
           "stream": true, "max_tokens": 16, "ignore_eos": true})
}

/// `var` in seconds, else `default`.
pub fn secs(var: &str, default: u64) -> Duration {
    let s = std::env::var(var).ok().and_then(|v| v.parse().ok());
    Duration::from_secs(s.unwrap_or(default))
}

/// Whether to hold the targets rather than CI's margins.
pub fn strict() -> bool {
    std::env::var("SLUICE_LOAD_STRICT").is_ok_and(|v| v == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_then_soak_against_the_real_engine() {
    let _engine = crate::engine::exclusive().await;
    let policy = Policy::default();
    let active = policy.admission.active_max;
    let (sup, gw) = crate::engine::start(policy, Duration::from_secs(120)).await;
    if let Ok(n) = std::env::var("SLUICE_ENGINE_NICE") {
        crate::process::renice_engine(&sup, n.parse().unwrap_or(10));
    }
    let base = overload::baseline(&gw, active).await;
    overload::burst(&gw, &base, secs("SLUICE_OVERLOAD_SECS", 10)).await;
    assert!(
        crate::process::kv_drained(&sup, Duration::from_secs(10)).await,
        "KV blocks still held after the burst: {:?}",
        sup.ranks()
    );
    soak::run_soak(&gw, &sup, active, secs("SLUICE_SOAK_SECS", 60)).await;
    gw.assert_accounted().await;
    crate::engine::stop(sup, gw).await;
}
