//! `sluice-load run`: one scenario, one table row or one JSON object.

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use sluice_loadtests::measure::measure;
use sluice_loadtests::prompts::Shape;
use sluice_loadtests::report::{self, entry_json};
use sluice_loadtests::scenario::{Row, RowKind};
use sluice_loadtests::workload::{Arrivals, Bound, Workload};

use super::common::{self, parse_duration, ClientArgs, PromptArgs};

/// Client concurrency of an open loop when not given: enough never to queue in the client at
/// the rates an LLM server sustains.
const OPEN_CONCURRENCY: usize = 64;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Fresh prompts of --shape (`/v1/completions`, exact output length).
    Shape,
    /// One prompt of --shape, sent every time.
    Repeat,
    /// A code hidden at --depths of a --shape-input-token haystack, scored (chat).
    Needle,
    /// A required function call after --shape-input tokens of context, checked (chat).
    Tools,
    /// Short requests with `response_format: json_schema`, ten schemas in turn, each answer
    /// parsed and validated (chat; --shape is not used).
    Json,
    /// The soak's mix: 60% 256:128, 30% 1k:256, 10% 4k.
    Soak,
    /// The seed's mix: 90% 256:128, 5% 4k:128, 5% 8k:128.
    SeedMix,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The server: http(s)://host:port (or its /v1, or a full endpoint URL).
    #[arg(long)]
    pub url: String,
    #[arg(long, value_enum, default_value = "shape")]
    pub workload: Kind,
    /// INPUT:OUTPUT tokens (256:128, 1k:256) or INPUT alone (4k: 64 output tokens); k = 1000.
    #[arg(long, default_value = "256:128")]
    pub shape: Shape,
    /// Closed loop: workers; open loop: most requests in flight (the rest wait in the client)
    /// [default: 1 closed, 64 open].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Stop after this many requests [default: 2 × concurrency, at least 8, unless --duration].
    #[arg(long)]
    pub requests: Option<usize>,
    /// Stop starting requests after this long (30s, 10m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Open loop: arrivals per second (fixed gaps; --poisson for exponential ones).
    #[arg(long)]
    pub rate: Option<f64>,
    #[arg(long, requires = "rate")]
    pub poisson: bool,
    /// Needle depths, 0 (start) to 1 (end).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,0.9")]
    pub depths: Vec<f64>,
    /// Tools and json: the same prompts without `tools` or `response_format` (the rates
    /// without a grammar).
    #[arg(long)]
    pub unconstrained: bool,
    /// One JSON object (aggregate in seconds, and every sample) on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub prompts: PromptArgs,
}

fn row(args: &RunArgs) -> Result<Row> {
    let workload = match args.rate {
        Some(rate) => Workload::Open {
            arrivals: if args.poisson {
                Arrivals::Poisson(rate)
            } else {
                Arrivals::Fixed(rate)
            },
            concurrency: args.concurrency.unwrap_or(OPEN_CONCURRENCY),
        },
        None => Workload::Closed {
            concurrency: args.concurrency.unwrap_or(1),
        },
    };
    if args.depths.iter().any(|d| !(0.0..=1.0).contains(d)) {
        bail!("--depths are fractions from 0 to 1");
    }
    let requests = match (args.requests, args.duration) {
        (None, None) => Some((2 * workload.concurrency()).clamp(8, 2 * OPEN_CONCURRENCY)),
        (r, _) => r,
    };
    if args.unconstrained && !matches!(args.workload, Kind::Tools | Kind::Json) {
        bail!("--unconstrained is for the tools and json workloads");
    }
    let shape = args.shape.clone();
    let (kind, series) = match args.workload {
        Kind::Shape => (RowKind::Shape(shape.clone()), shape.label.clone()),
        Kind::Repeat => (RowKind::Repeat(shape.clone()), shape.label.clone()),
        Kind::Needle => (
            RowKind::Needle {
                haystack: shape.input,
                depths: args.depths.clone(),
            },
            "needle".into(),
        ),
        Kind::Tools => (
            RowKind::Tools {
                context: shape.input,
                constrained: !args.unconstrained,
            },
            "tools".into(),
        ),
        Kind::Json => (
            RowKind::Json {
                constrained: !args.unconstrained,
            },
            "json".into(),
        ),
        Kind::Soak => (RowKind::Soak, "soak".into()),
        Kind::SeedMix => (RowKind::SeedMix, "seed-mix".into()),
    };
    Ok(Row {
        id: format!(
            "{:?}{}",
            args.workload,
            if args.unconstrained { "-free" } else { "" }
        )
        .to_lowercase(),
        title: format!("{:?} {}", args.workload, shape.label),
        series,
        kind,
        workload,
        bound: Bound {
            requests,
            duration: args.duration,
        },
    })
}

pub async fn main(args: RunArgs) -> Result<bool> {
    let row = row(&args)?;
    let (target, model) = common::target(&args.url, &args.client).await?;
    let (prompts, seed) = common::prompts(&args.prompts)?;
    let ctx = common::context(&prompts, model.clone(), seed);
    eprintln!(
        "sluice-load: {} on {}, model {model:?}, seed {seed}",
        row.title, args.url
    );
    let entry = measure(&row, &args.url, &target, &ctx, 0, !args.json).await?;
    if args.json {
        let mut v = entry_json(&entry, true);
        v["url"] = args.url.clone().into();
        v["model"] = model.into();
        v["seed"] = seed.into();
        outln!("{v}")?;
    } else {
        outln!("{}\n{}", report::table_header(), report::table_row(&entry))?;
    }
    Ok(entry.stats.succeeded > 0)
}
