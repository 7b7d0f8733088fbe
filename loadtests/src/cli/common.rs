//! Flags every subcommand shares, and connecting to a target.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_loadtests::client::{ClientOptions, Connection, Endpoint};
use sluice_loadtests::prompts::PromptBuilder;
use sluice_loadtests::scenario::JobContext;
use sluice_loadtests::workload::Target;

/// How to reach the server(s).
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// PEM CA that signs the server's certificate (https), e.g. certs/sluice-dev-ca.pem
    /// [default: the system's CA bundle].
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Accept any certificate (https).
    #[arg(long)]
    pub insecure: bool,
    /// The requests' `model` field [default: the first model the server's /v1/models lists].
    #[arg(long)]
    pub model_name: Option<String>,
    /// Per-request timeout, send to last byte (300s, 5m, 1500ms).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Send a request refused with 429 or 503 and a `Retry-After` again after that long (at
    /// most 60 s), up to this many times, as the OpenAI SDKs do (they retry twice); its times
    /// count from the first send. 0: the refusal is its outcome.
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
}

/// Where prompts come from.
#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    /// The GGUF whose tokenizer sizes the prompts [default: the bundled SmolLM2 model].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Seed of the prompt text and arrivals [default: from the clock, so a rerun misses any
    /// prefix cache].
    #[arg(long)]
    pub seed: Option<u64>,
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

/// A target ready for requests, with the model name its requests carry.
pub async fn target(url: &str, args: &ClientArgs) -> Result<(Target, String)> {
    let opts = ClientOptions {
        api_key: args.api_key.clone(),
        ca: args.ca.clone(),
        insecure: args.insecure,
    };
    let endpoint = Arc::new(Endpoint::parse(url, &opts)?);
    let model = match &args.model_name {
        Some(name) => name.clone(),
        None => Connection::new(endpoint.clone())
            .first_model_id(args.timeout.min(Duration::from_secs(10)))
            .await
            .with_context(|| format!("{url}: no --model-name given, and the server named none"))?,
    };
    let target = Target {
        endpoint,
        timeout: args.timeout,
        retries: args.retries,
    };
    Ok((target, model))
}

/// The prompt builder and the run's seed.
pub fn prompts(args: &PromptArgs) -> Result<(Arc<PromptBuilder>, u64)> {
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let path = args
        .model
        .clone()
        .unwrap_or_else(sluice_engine::model::default_model_path);
    Ok((Arc::new(PromptBuilder::from_model(&path, seed)?), seed))
}

/// The jobs' shared context for one target.
pub fn context(prompts: &Arc<PromptBuilder>, model: String, seed: u64) -> JobContext {
    JobContext {
        prompts: prompts.clone(),
        model,
        seed,
    }
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
}
