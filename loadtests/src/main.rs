//! `sluice-load`: the capacity matrix against any OpenAI-compatible endpoint.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use sluice_loadtests::client::{Connection, Endpoint};
use sluice_loadtests::prompts::{PromptBuilder, Shape};
use sluice_loadtests::{report, run};

/// Load generator for OpenAI-compatible endpoints.
#[derive(Parser, Debug)]
#[command(name = "sluice-load", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Closed-loop benchmark: at each concurrency level in turn, C workers send streaming
    /// `/v1/completions` requests back to back until N have finished.
    Bench(BenchArgs),
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// The server: http://host:port (or its /v1, or the full /v1/completions URL).
    #[arg(long)]
    url: String,
    /// Concurrency levels, run one after another.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    concurrency: Vec<usize>,
    /// Request shapes, INPUT:OUTPUT tokens (256:128, 1k:256) or INPUT alone (4k, 8k, 12k, 16k;
    /// 64 output tokens); k = 1000. Several shapes run one after another.
    #[arg(long, value_delimiter = ',', default_value = "256:128")]
    shape: Vec<Shape>,
    /// Requests per level [default: 2 × concurrency, at least 8].
    #[arg(long)]
    requests: Option<usize>,
    /// The requests' `model` field [default: the first model the server's /v1/models lists].
    #[arg(long)]
    model_name: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// The GGUF whose tokenizer sizes the prompts [default: the bundled SmolLM2 model].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Per-request timeout (300s, 5m, 1500ms).
    #[arg(long, default_value = "300s", value_parser = run::parse_duration)]
    timeout: Duration,
    /// Seed of the prompt text [default: from the clock, so a rerun misses any prefix cache].
    #[arg(long)]
    seed: Option<u64>,
    /// One JSON object per level on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let Command::Bench(args) = Cli::parse().command;
    // One thread: the generator should take as little CPU from the server under test as it can.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let any_ok = rt.block_on(bench(args))?;
    if !any_ok {
        std::process::exit(1);
    }
    Ok(())
}

/// Runs the benchmark; `false` when not one request succeeded.
async fn bench(args: BenchArgs) -> Result<bool> {
    let endpoint = Arc::new(Endpoint::parse(&args.url, args.api_key.as_deref())?);
    let model_name = match args.model_name {
        Some(name) => name,
        None => Connection::new(endpoint.clone())
            .first_model_id(args.timeout.min(Duration::from_secs(10)))
            .await
            .context("no --model-name given, and the server did not name one")?,
    };
    let seed = args.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let model_path = args
        .model
        .unwrap_or_else(sluice_engine::model::default_model_path);
    let prompts = Arc::new(PromptBuilder::from_model(&model_path, seed)?);
    eprintln!(
        "sluice-load: POST {}, model {model_name:?}, prompt seed {seed}, timeout {:?}",
        endpoint.completions_url(),
        args.timeout
    );
    let cfg = run::BenchConfig {
        endpoint,
        model_name: model_name.clone(),
        shapes: args.shape,
        concurrency: args.concurrency,
        requests: args.requests,
        timeout: args.timeout,
        progress: true,
    };
    let levels = run::bench(&cfg, prompts, |level| {
        let ttft = level
            .ttft_ms
            .p50
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0} ms"));
        eprintln!(
            "  done: {}/{} ok, {:.1} output tok/s, TTFT p50 {ttft}",
            level.succeeded,
            level.total,
            level.output_tok_per_s(),
        );
        if args.json {
            println!("{}", report::level_json(level, &args.url, &model_name));
        }
    })
    .await?;
    if !args.json {
        println!("{}", report::table_header());
        for level in &levels {
            println!("{}", report::table_row(level));
        }
        println!(
            "(ms; TTFT: send → first content chunk; TPOT: (E2E − TTFT) / (tokens − 1); \
             latencies over successful requests)"
        );
    }
    Ok(levels.iter().any(|l| l.succeeded > 0))
}
