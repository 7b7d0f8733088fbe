//! The closed loop: for each shape and each concurrency level in turn, C workers send
//! streaming requests back to back until the level's N requests have finished.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use tokio::task::JoinSet;

use crate::client::{Connection, Endpoint};
use crate::prompts::{PromptSource, Shape};
use crate::stats::LevelStats;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub endpoint: Arc<Endpoint>,
    /// The requests' `model` field.
    pub model_name: String,
    pub shapes: Vec<Shape>,
    pub concurrency: Vec<usize>,
    /// Requests per level; `None`: [`default_requests`].
    pub requests: Option<usize>,
    pub timeout: Duration,
    /// Progress lines on stderr.
    pub progress: bool,
}

/// Requests per level when not given: two per worker, at least 8.
pub fn default_requests(concurrency: usize) -> usize {
    (2 * concurrency).max(8)
}

/// The JSON of one streaming `/v1/completions` request.
pub fn request_body(model: &str, prompt: &str, max_tokens: usize) -> Bytes {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    Bytes::from(body.to_string())
}

/// `300s`, `5m`, `1500ms`, `1h`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .with_context(|| format!("{s:?} is not a duration (e.g. 300s, 5m, 1500ms)"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        other => bail!("{s:?}: unknown unit {other:?} (ms, s, m, h)"),
    };
    if !(secs.is_finite() && secs > 0.0) {
        bail!("{s:?}: a duration must be positive");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Runs every (shape, concurrency) level in turn; `on_level` sees each one as it finishes.
/// Request numbers (and so prompts) are unique across the whole run.
pub async fn bench(
    cfg: &BenchConfig,
    prompts: Arc<dyn PromptSource>,
    mut on_level: impl FnMut(&LevelStats),
) -> Result<Vec<LevelStats>> {
    if let Some(c) = cfg.concurrency.iter().find(|&&c| c == 0) {
        bail!("concurrency {c}: every level needs at least one worker");
    }
    if cfg.requests == Some(0) {
        bail!("--requests must be at least 1");
    }
    let mut next_request = 0u64;
    let mut levels = Vec::new();
    for shape in &cfg.shapes {
        for &concurrency in &cfg.concurrency {
            let n = cfg
                .requests
                .unwrap_or_else(|| default_requests(concurrency));
            if cfg.progress {
                eprintln!(
                    "shape {} (prompt {} tokens, {} out), concurrency {concurrency}: building {n} prompts",
                    shape.label, shape.input, shape.output
                );
            }
            let bodies = build_bodies(&prompts, &cfg.model_name, shape, next_request, n).await?;
            next_request += n as u64;
            if cfg.progress {
                eprintln!("  sending {n} requests");
            }
            let level = run_level(cfg, shape, concurrency, bodies).await?;
            on_level(&level);
            levels.push(level);
        }
    }
    Ok(levels)
}

/// The level's request bodies, built before its clock starts (tokenizing is not free).
async fn build_bodies(
    prompts: &Arc<dyn PromptSource>,
    model: &str,
    shape: &Shape,
    first: u64,
    n: usize,
) -> Result<Arc<Vec<Bytes>>> {
    let (prompts, model, shape) = (prompts.clone(), model.to_owned(), shape.clone());
    let bodies = tokio::task::spawn_blocking(move || {
        (first..first + n as u64)
            .map(|request| {
                let prompt = prompts.prompt(shape.input, request)?;
                Ok(request_body(&model, &prompt, shape.output))
            })
            .collect::<Result<Vec<_>>>()
    })
    .await
    .context("building prompts")??;
    Ok(Arc::new(bodies))
}

async fn run_level(
    cfg: &BenchConfig,
    shape: &Shape,
    concurrency: usize,
    bodies: Arc<Vec<Bytes>>,
) -> Result<LevelStats> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    let start = Instant::now();
    for _ in 0..concurrency.min(bodies.len()) {
        let (bodies, next) = (bodies.clone(), next.clone());
        let mut conn = Connection::new(cfg.endpoint.clone());
        let timeout = cfg.timeout;
        workers.spawn(async move {
            let mut samples = Vec::new();
            while let Some(body) = bodies.get(next.fetch_add(1, Ordering::Relaxed)) {
                samples.push(conn.complete(body.clone(), timeout).await);
            }
            samples
        });
    }
    let mut samples = Vec::with_capacity(bodies.len());
    while let Some(done) = workers.join_next().await {
        samples.extend(done.context("a worker failed")?);
    }
    let wall = start.elapsed();
    Ok(LevelStats::from_samples(shape, concurrency, &samples, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("300s").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["", "s", "0s", "5 parsecs", "-1s", "1e3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_request_counts() {
        assert_eq!(default_requests(1), 8);
        assert_eq!(default_requests(4), 8);
        assert_eq!(default_requests(8), 16);
        assert_eq!(default_requests(32), 64);
    }

    #[test]
    fn request_bodies() {
        let v: serde_json::Value =
            serde_json::from_slice(&request_body("m", "hi \"there\"", 128)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model": "m", "prompt": "hi \"there\"", "max_tokens": 128,
                "temperature": 0, "ignore_eos": true, "stream": true,
                "stream_options": {"include_usage": true}})
        );
    }
}
