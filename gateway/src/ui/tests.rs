//! The status page: percentile math, the window with paused time, the stats JSON against a
//! metrics and admission state driven here, and the page's self-containment.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::Value;
use sluice_engine::prom::{Histogram, HistogramSnapshot};

use super::*;
use crate::bundled::RankStatus;
use crate::forward::StaticUpstream;
use crate::middleware::admission::Ticket;
use crate::policy::{Class, LoadedPolicy, Policy, PolicyStore};
use crate::telemetry::Outcome;

static BOUNDS: &[f64] = &[0.1, 0.5, 1.0, 5.0];

fn snapshot(counts: &[u64]) -> HistogramSnapshot {
    HistogramSnapshot {
        bounds: BOUNDS,
        counts: counts.to_vec(),
        sum: 0.0,
        count: counts.iter().sum(),
    }
}

fn close(got: Option<f64>, want: f64) {
    let got = got.expect("a value");
    assert!((got - want).abs() < 1e-9, "got {got}, want {want}");
}

#[test]
fn quantiles_interpolate_linearly_inside_the_bucket() {
    // 10 in (0, 0.1], 10 in (0.1, 0.5]: the median is the first bucket's upper edge, p75 half
    // way through the second.
    let h = snapshot(&[10, 10, 0, 0, 0]);
    close(quantile(&h, 0.5), 0.1);
    close(quantile(&h, 0.75), 0.3);
    close(quantile(&h, 0.25), 0.05);
    // p95 of 100 observations with 90 in (0.5, 1] and 10 in (1, 5]: rank 95 is half way
    // through the last finite bucket.
    let h = snapshot(&[0, 0, 90, 10, 0]);
    close(quantile(&h, 0.95), 3.0);
    close(quantile(&h, 0.5), 0.5 + 0.5 * 50.0 / 90.0);
}

#[test]
fn quantiles_of_nothing_are_none_and_the_inf_bucket_is_capped() {
    assert_eq!(quantile(&snapshot(&[0, 0, 0, 0, 0]), 0.5), None);
    close(quantile(&snapshot(&[0, 0, 0, 0, 3]), 0.95), 5.0);
    close(quantile(&snapshot(&[1, 0, 0, 0, 0]), 0.0), 0.0);
    // Empty buckets before the rank are skipped, not interpolated into.
    close(quantile(&snapshot(&[0, 0, 0, 4, 0]), 0.5), 3.0);
}

#[test]
fn quantiles_match_a_real_histogram() {
    let h = Histogram::new(BOUNDS);
    for ms in [20, 40, 60, 80, 300, 700, 900, 2000, 3000, 4000] {
        h.observe(Duration::from_millis(ms));
    }
    let s = h.snapshot();
    assert_eq!(s.counts, vec![4, 1, 2, 3, 0]);
    // Rank 5 is the only one in (0.1, 0.5].
    close(quantile(&s, 0.5), 0.5);
    // Rank 9.5 is half way through (1, 5]'s three: 1 + 4 × 2.5 / 3.
    close(quantile(&s, 0.95), 1.0 + 4.0 * 2.5 / 3.0);
}

fn metrics() -> Arc<Metrics> {
    Arc::default()
}

#[tokio::test(start_paused = true)]
async fn the_window_forgets_what_is_older_than_it() {
    let m = metrics();
    let sampler = Sampler::new(Duration::from_secs(5), Duration::from_secs(60));
    sampler.record(Reading::take(&m));
    // An old burst: slow waits and sheds.
    for _ in 0..10 {
        m.queue_wait.observe(Duration::from_secs(30));
        m.ended(Outcome::Shed, "overloaded", Class::Interactive);
    }
    for _ in 0..12 {
        tokio::time::advance(Duration::from_secs(5)).await;
        sampler.record(Reading::take(&m));
    }
    // 60 s later the burst is still inside the window.
    let w = sampler.window(&Reading::take(&m));
    assert_eq!(w.span, Duration::from_secs(60));
    assert_eq!((w.shed, w.ended, w.queue_wait.count), (10, 10, 10));
    assert!((w.shed_per_minute() - 10.0).abs() < 1e-9);
    let longer = Window {
        span: Duration::from_secs(120),
        ..w.clone()
    };
    assert!((longer.shed_per_minute() - 5.0).abs() < 1e-9);
    assert!((w.shed_share() - 1.0).abs() < 1e-9);

    // Then fast requests only, for another minute: the burst falls out.
    for _ in 0..12 {
        tokio::time::advance(Duration::from_secs(5)).await;
        m.queue_wait.observe(Duration::from_millis(3));
        m.ended(Outcome::Ok, "none", Class::Interactive);
        sampler.record(Reading::take(&m));
    }
    let w = sampler.window(&Reading::take(&m));
    assert_eq!(w.span, Duration::from_secs(60));
    assert_eq!((w.shed, w.ended), (0, 12));
    assert_eq!(w.shed_share(), 0.0);
    let p95 = quantile(&w.queue_wait, 0.95).expect("p95");
    assert!(p95 <= 0.005, "old 30 s waits are gone: {p95}");
    assert!(
        sampler.len() <= 14,
        "the ring is bounded: {}",
        sampler.len()
    );
}

#[tokio::test(start_paused = true)]
async fn readings_closer_than_the_interval_are_not_kept() {
    let m = metrics();
    let sampler = Sampler::new(Duration::from_secs(5), Duration::from_secs(300));
    assert!(sampler.is_empty());
    sampler.record(Reading::take(&m));
    tokio::time::advance(Duration::from_secs(2)).await;
    sampler.record(Reading::take(&m));
    assert_eq!(sampler.len(), 1);
    tokio::time::advance(Duration::from_secs(3)).await;
    sampler.record(Reading::take(&m));
    assert_eq!(sampler.len(), 2);
    // Before any reading is kept, the window is empty.
    let fresh = Sampler::default();
    let w = fresh.window(&Reading::take(&m));
    assert_eq!(
        (w.span, w.ended, w.shed_per_minute()),
        (Duration::ZERO, 0, 0.0)
    );
}

#[tokio::test(start_paused = true)]
async fn the_background_task_samples_every_five_seconds() {
    let app = app(Policy::default());
    let sampler = start(&app);
    assert!(
        Arc::ptr_eq(&sampler, &start(&app)),
        "one sampler per gateway"
    );
    let other = self::app(Policy::default());
    assert!(!Arc::ptr_eq(&sampler, &start(&other)));
    for _ in 0..3 {
        tokio::time::sleep(window::SAMPLE_EVERY).await;
    }
    assert!(sampler.len() >= 3, "kept {}", sampler.len());
}

fn app(policy: Policy) -> App {
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy = policy;
    loaded.sha256 = "3f2a9c0d1e4b5a6978877665544332211000ffeeddccbbaa9988776655443322".into();
    let upstream = Arc::new(StaticUpstream::new("http://127.0.0.1:9").expect("url"));
    App::new(PolicyStore::new(loaded), upstream, "test-model".into())
}

async fn json(resp: Response<GatewayBody>) -> Value {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&bytes).expect("json")
}

#[tokio::test(start_paused = true)]
async fn stats_show_the_admission_state_and_the_windowed_figures() {
    let mut policy = Policy::default();
    policy.admission.active_max = 1;
    policy.admission.queue_depth = 2;
    let app = app(policy);
    start(&app);
    let ticket = |class| Ticket::new(class, 10);
    let _running = app
        .admission
        .arrive(ticket(Class::Interactive))
        .expect("slot");
    let _waiting = app
        .admission
        .arrive(ticket(Class::Interactive))
        .expect("queued");
    let _batch = app.admission.arrive(ticket(Class::Batch)).expect("queued");
    let m = &app.metrics;
    for _ in 0..4 {
        m.accepted();
        m.queue_wait.observe(Duration::from_millis(40));
        m.time_to_first_token.observe(Duration::from_millis(300));
        m.ended(Outcome::Ok, "none", Class::Interactive);
    }
    m.accepted();
    m.ended(Outcome::Shed, "overloaded", Class::Interactive);
    tokio::time::advance(Duration::from_secs(30)).await;

    let resp = super::stats(&app);
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store");
    let v = json(resp).await;
    assert_eq!(v["model"], "test-model");
    assert_eq!(v["ready"], true);
    assert_eq!(
        (v["active"].as_u64(), v["active_max"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(v["queued"]["interactive"], 1);
    assert_eq!(v["queued"]["batch"], 1);
    assert_eq!(v["queue_depth"], 2);
    assert_eq!(v["ranks"], serde_json::json!([]));
    let w = &v["window"];
    assert_eq!(
        (w["ended"].as_u64(), w["shed"].as_u64()),
        (Some(5), Some(1))
    );
    assert!((w["seconds"].as_f64().unwrap_or_default() - 30.0).abs() < 1e-6);
    assert!((w["shed_per_min"].as_f64().unwrap_or_default() - 1.0).abs() < 1e-9);
    assert!((w["shed_share"].as_f64().unwrap_or_default() - 0.2).abs() < 1e-9);
    for key in ["queue_wait_p50", "queue_wait_p95", "ttft_p50", "ttft_p95"] {
        assert!(w[key].as_f64().is_some_and(|s| s > 0.0), "{key}: {w}");
    }
    let (qw50, tt50) = (w["queue_wait_p50"].as_f64(), w["ttft_p50"].as_f64());
    assert!(qw50.is_some_and(|s| (0.0..=0.1).contains(&s)), "{qw50:?}");
    assert!(tt50.is_some_and(|s| (0.1..=1.0).contains(&s)), "{tt50:?}");
    assert_eq!(v["totals"]["accepted"], 5);
    assert_eq!(v["totals"]["ok"], 4);
    assert_eq!(v["totals"]["shed"], 1);
    assert_eq!(v["policy"]["short"], "3f2a9c0d1e4b");
    assert_eq!(v["policy"]["sha256"].as_str().map(str::len), Some(64));
    assert_eq!(v["policy"]["path"], Value::Null);
}

#[tokio::test]
async fn percentiles_are_null_before_anything_is_observed() {
    let app = app(Policy::default());
    let v = json(super::stats(&app)).await;
    for key in ["queue_wait_p50", "queue_wait_p95", "ttft_p50", "ttft_p95"] {
        assert_eq!(v["window"][key], Value::Null, "{key}");
    }
    assert_eq!(v["window"]["shed_share"], 0.0);
}

#[test]
fn ranks_show_kv_use_as_a_percentage() {
    let up = RankStatus {
        rank: 1,
        up: true,
        layers: [15, 29],
        kv_tokens_total: 8192,
        kv_tokens_used: 2048,
    };
    let view = stats::RankView::from(&up);
    assert_eq!((view.rank, view.up, view.layers), (1, true, [15, 29]));
    assert!((view.kv_used_pct - 25.0).abs() < 1e-9);
    let unknown = stats::RankView::from(&RankStatus::default());
    assert_eq!(unknown.kv_used_pct, 0.0);
    assert!(!unknown.up);
}

#[test]
fn the_page_names_every_figure_and_loads_nothing_from_outside() {
    for id in [
        "active",
        "active-max",
        "queued-interactive",
        "queued-batch",
        "shed-per-min",
        "shed-share",
        "queue-wait-p50",
        "queue-wait-p95",
        "ttft-p50",
        "ttft-p95",
        "policy-hash",
        "policy-loaded",
        "ranks",
        "chat-input",
        "chat-queue-ms",
        "chat-prompt-tokens",
        "prediction-chart",
        "prediction-points",
        "prediction-median-error",
    ] {
        assert!(INDEX_HTML.contains(&format!("id=\"{id}\"")), "id {id}");
    }
    for outside in ["http://", "https://", "//cdn", "@import", "<link", "src="] {
        assert!(
            !INDEX_HTML.contains(outside),
            "the page must not load {outside}"
        );
    }
    assert!(INDEX_HTML.contains("/ui/stats") && INDEX_HTML.contains("/v1/chat/completions"));
    assert!(INDEX_HTML.contains("stream: true"));
}

#[test]
fn the_page_is_served_with_a_policy_that_keeps_it_self_contained() {
    let resp = page();
    assert_eq!(resp.status(), StatusCode::OK);
    let h = resp.headers();
    assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
    let csp = h[header::CONTENT_SECURITY_POLICY].to_str().expect("ascii");
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert!(csp.contains("connect-src 'self'"), "{csp}");
    let r = redirect();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()[header::LOCATION], "/ui");
}
