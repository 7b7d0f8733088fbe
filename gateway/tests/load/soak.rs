//! A mixed soak: streams, plain completions, tool calls, clients that hang up after the first
//! token, and prompts over the input cap, from `active_max + 2` clients for the whole run.
//! Read in six windows: memory does not grow, latency does not drift, and at the end no KV
//! block is held and every request is accounted for.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_gateway::bundled::Supervisor;
use tokio::task::JoinSet;

use super::sample::{cancel_after_first_token, connect, ms, percentile, run};
use super::{short_stream, strict};
use crate::common::Gateway;
use crate::process::{kv_drained, rss_bytes};

const WINDOWS: usize = 6;

/// The `i`-th request of the mix: path, body, and what it must get.
fn mixed(i: usize) -> (&'static str, Value, u16) {
    let chat = "/v1/chat/completions";
    match i % 5 {
        0 | 2 => (chat, short_stream(i), 200),
        1 => (
            "/v1/completions",
            json!({"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}),
            200,
        ),
        3 => (
            chat,
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 8,
                   "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}),
            200,
        ),
        _ => (
            "/v1/completions",
            json!({"prompt": (0..9000).map(|i| 1000 + i % 30000).collect::<Vec<_>>(), "max_tokens": 1}),
            400,
        ),
    }
}

/// One window's readings.
#[derive(Debug, Default)]
struct Window {
    ttfts: Vec<Duration>,
    rss: u64,
    done: usize,
}

pub async fn run_soak(gw: &Gateway, sup: &Supervisor, active: usize, length: Duration) {
    let send = connect(gw).await;
    let started = Instant::now();
    let window = length / WINDOWS as u32;
    let windows: Arc<std::sync::Mutex<Vec<Window>>> = Arc::new(std::sync::Mutex::new(
        (0..WINDOWS).map(|_| Window::default()).collect(),
    ));
    let counter = Arc::new(AtomicUsize::new(0));
    let mut clients = JoinSet::new();
    for _ in 0..active + 2 {
        let (send, windows, counter) = (send.clone(), windows.clone(), counter.clone());
        clients.spawn(async move {
            while started.elapsed() < length {
                let i = counter.fetch_add(1, Ordering::Relaxed);
                let (path, body, want) = mixed(i);
                let ttft = if i % 10 == 2 {
                    assert_eq!(cancel_after_first_token(send.clone(), &body).await, 200);
                    None
                } else {
                    let s = run(send.clone(), path, &body).await;
                    assert_eq!(s.status, want, "{path} {s:?}");
                    assert!(s.code.is_none() || want != 200, "{s:?}");
                    (i % 5 == 0).then_some(s.admitted_ttft()).flatten()
                };
                let w = (started.elapsed().as_nanos() / window.as_nanos().max(1)) as usize;
                let mut ws = windows.lock().expect("windows");
                if let Some(w) = ws.get_mut(w) {
                    w.ttfts.extend(ttft);
                    w.done += 1;
                    w.rss = w.rss.max(rss_bytes());
                }
            }
        });
    }
    clients.join_all().await;
    let kv_ok = kv_drained(sup, Duration::from_secs(10)).await;
    let ws = std::mem::take(&mut *windows.lock().expect("windows"));
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    for (k, w) in ws.iter().enumerate() {
        eprintln!(
            "SOAK window {k}: {} requests, TTFT p50 {:.0} ms p95 {:.0} ms, RSS {:.1} MB",
            w.done,
            ms(percentile(&w.ttfts, 50.0)),
            ms(percentile(&w.ttfts, 95.0)),
            mb(w.rss)
        );
    }
    eprintln!(
        "SOAK: {} requests in {length:?}; KV drained: {kv_ok}; {:?}",
        counter.load(Ordering::Relaxed),
        sup.ranks()
    );
    assert!(
        kv_ok,
        "KV blocks still held after the soak: {:?}",
        sup.ranks()
    );
    // The first window warms up; compare the second with the last.
    let (first, last) = (&ws[1], &ws[WINDOWS - 1]);
    let growth = last.rss.saturating_sub(first.rss);
    assert!(growth < 20 << 20, "RSS grew {:.1} MB", mb(growth));
    let drift = if strict() { 1.5 } else { 2.5 };
    let (p1, p2) = (
        percentile(&first.ttfts, 50.0),
        percentile(&last.ttfts, 50.0),
    );
    assert!(
        p2 <= p1.mul_f64(drift),
        "TTFT p50 drifted from {p1:?} to {p2:?}"
    );
}
