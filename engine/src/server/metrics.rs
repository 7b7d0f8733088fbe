//! `/metrics`: Prometheus text exposition (format 0.0.4) of the engine's [`MetricsSnapshot`]
//! under vLLM's names, per-rank gauges, and the latency histograms the server measures itself.

use crate::api::{MetricsSnapshot, RankHealth};
use crate::prom::{escape, header, sample, Histogram};

pub(crate) use crate::prom::CONTENT_TYPE;

/// vLLM's time-to-first-token buckets (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's end-to-end latency buckets (seconds).
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// What the server measures itself.
#[derive(Debug)]
pub(crate) struct HttpMetrics {
    /// From the request's arrival to its first generated token.
    pub ttft: Histogram,
    /// From the request's arrival to its last token.
    pub e2e: Histogram,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(TTFT_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
        }
    }
}

/// A per-rank gauge: name, help, value.
type RankGauge = (&'static str, &'static str, fn(&RankHealth) -> u64);

const RANK_GAUGES: [RankGauge; 5] = [
    (
        "sluice_engine_rank_up",
        "Whether the pipeline rank is up (1) or down (0).",
        |r| u64::from(r.up),
    ),
    (
        "sluice_engine_kv_tokens_capacity",
        "KV-cache capacity of the rank, in tokens.",
        |r| r.kv_tokens_total as u64,
    ),
    (
        "sluice_engine_kv_tokens_used",
        "KV-cache tokens in use on the rank.",
        |r| r.kv_tokens_used as u64,
    ),
    (
        "sluice_engine_weight_bytes",
        "Bytes of model weights held by the rank.",
        |r| r.weight_bytes,
    ),
    (
        "sluice_engine_kv_bytes",
        "Bytes of KV cache allocated by the rank.",
        |r| r.kv_bytes,
    ),
];

/// The whole exposition.
pub(crate) fn render(model: &str, m: &MetricsSnapshot, http: &HttpMetrics) -> String {
    let mut out = String::with_capacity(8 << 10);
    let model_label = format!("model_name=\"{}\"", escape(model));
    let l = model_label.as_str();
    let usage = if m.kv_cache_usage.is_finite() {
        m.kv_cache_usage.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (gauge, counter) = ("gauge", "counter");
    let series: [(&str, &str, &str, String); 5] = [
        (
            "vllm:num_requests_running",
            "Number of requests running (in the batch).",
            gauge,
            m.num_requests_running.to_string(),
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be scheduled.",
            gauge,
            m.num_requests_waiting.to_string(),
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage (1 means 100 percent).",
            gauge,
            usage.to_string(),
        ),
        (
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            counter,
            m.prompt_tokens_total.to_string(),
        ),
        (
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            counter,
            m.generation_tokens_total.to_string(),
        ),
    ];
    for (name, help, kind, value) in &series {
        header(&mut out, name, help, kind);
        sample(&mut out, name, l, value);
    }
    let name = "vllm:request_success_total";
    header(
        &mut out,
        name,
        "Count of successfully finished requests.",
        counter,
    );
    for (reason, n) in [
        ("stop", m.requests_finished_stop),
        ("length", m.requests_finished_length),
    ] {
        sample(
            &mut out,
            name,
            &format!("finished_reason=\"{reason}\",{l}"),
            n,
        );
    }
    let counters = [
        (
            "vllm:num_preemptions_total",
            "Cumulative number of preemptions.",
            m.preemptions_total,
        ),
        (
            "sluice_engine_requests_aborted_total",
            "Requests aborted (the client went away).",
            m.requests_aborted,
        ),
        (
            "sluice_engine_requests_failed_total",
            "Requests that failed inside the engine.",
            m.requests_failed,
        ),
    ];
    for (name, help, value) in counters {
        header(&mut out, name, help, counter);
        sample(&mut out, name, l, value);
    }
    for (name, help, value) in RANK_GAUGES {
        header(&mut out, name, help, gauge);
        for r in &m.ranks {
            sample(&mut out, name, &format!("rank=\"{}\"", r.rank), value(r));
        }
    }
    http.ttft.render(
        &mut out,
        "sluice_engine_time_to_first_token_seconds",
        "Time from the request's arrival to its first token, as the HTTP server sees it.",
        l,
    );
    http.e2e.render(
        &mut out,
        "sluice_engine_e2e_request_latency_seconds",
        "Time from the request's arrival to its last token, as the HTTP server sees it.",
        l,
    );
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn renders_vllm_names_ranks_and_histograms() {
        let snap = MetricsSnapshot {
            num_requests_running: 2,
            kv_cache_usage: 0.25,
            requests_finished_stop: 7,
            ranks: vec![RankHealth {
                rank: 0,
                layers: [0, 29],
                up: true,
                kv_tokens_total: 4096,
                kv_tokens_used: 100,
                weight_bytes: 1 << 20,
                kv_bytes: 1 << 21,
            }],
            ..MetricsSnapshot::default()
        };
        let http = HttpMetrics::default();
        http.ttft.observe(Duration::from_millis(30));
        http.ttft.observe(Duration::from_secs(5000));
        let text = render("smol\"lm", &snap, &http);
        for line in [
            "# TYPE vllm:num_requests_running gauge",
            "vllm:num_requests_running{model_name=\"smol\\\"lm\"} 2",
            "vllm:kv_cache_usage_perc{model_name=\"smol\\\"lm\"} 0.25",
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"smol\\\"lm\"} 7",
            "# TYPE vllm:prompt_tokens_total counter",
            "sluice_engine_rank_up{rank=\"0\"} 1",
            "sluice_engine_kv_bytes{rank=\"0\"} 2097152",
            "sluice_engine_time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",le=\"0.02\"} 0",
            "sluice_engine_time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",le=\"0.04\"} 1",
            "sluice_engine_time_to_first_token_seconds_bucket{model_name=\"smol\\\"lm\",le=\"+Inf\"} 2",
            "sluice_engine_time_to_first_token_seconds_count{model_name=\"smol\\\"lm\"} 2",
            "# TYPE sluice_engine_e2e_request_latency_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(text.ends_with('\n'));
    }
}
