//! `sluice-load bench`: the closed loop at each concurrency level and shape in turn.

use anyhow::Result;
use clap::Args;
use sluice_loadtests::measure::measure;
use sluice_loadtests::prompts::Shape;
use sluice_loadtests::report::{self, entry_json};
use sluice_loadtests::scenario::{Row, RowKind};
use sluice_loadtests::workload::{Bound, Workload};

use super::common::{self, ClientArgs, PromptArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The server: http(s)://host:port (or its /v1, or the full /v1/completions URL).
    #[arg(long)]
    pub url: String,
    /// Concurrency levels, run one after another.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    pub concurrency: Vec<usize>,
    /// Request shapes, INPUT:OUTPUT tokens (256:128, 1k:256) or INPUT alone (4k, 8k, 12k, 16k;
    /// 64 output tokens); k = 1000. Several shapes run one after another.
    #[arg(long, value_delimiter = ',', default_value = "256:128")]
    pub shape: Vec<Shape>,
    /// Requests per level [default: 2 × concurrency, at least 8].
    #[arg(long)]
    pub requests: Option<usize>,
    /// One JSON object per level on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub prompts: PromptArgs,
}

/// Requests per level when not given: two per worker, at least 8.
pub fn default_requests(concurrency: usize) -> usize {
    (2 * concurrency).max(8)
}

pub async fn main(args: BenchArgs) -> Result<bool> {
    let (target, model) = common::target(&args.url, &args.client).await?;
    let (prompts, seed) = common::prompts(&args.prompts)?;
    let ctx = common::context(&prompts, model.clone(), seed);
    eprintln!("sluice-load: {}, model {model:?}, seed {seed}", args.url);
    if !args.json {
        outln!("{}", report::table_header())?;
    }
    let mut any_ok = false;
    let mut base = 0;
    for shape in &args.shape {
        for &concurrency in &args.concurrency {
            let requests = args
                .requests
                .unwrap_or_else(|| default_requests(concurrency));
            let row = Row {
                id: shape.label.clone(),
                title: format!("{} C={concurrency}", shape.label),
                series: shape.label.clone(),
                kind: RowKind::Shape(shape.clone()),
                workload: Workload::Closed { concurrency },
                bound: Bound {
                    requests: Some(requests),
                    duration: None,
                },
            };
            let entry = measure(&row, &args.url, &target, &ctx, base, !args.json).await?;
            base += requests as u64;
            any_ok |= entry.stats.succeeded > 0;
            if args.json {
                let mut v = entry_json(&entry, false);
                v["url"] = args.url.clone().into();
                v["model"] = model.clone().into();
                outln!("{v}")?;
            } else {
                outln!("{}", report::table_row(&entry))?;
            }
        }
    }
    if !args.json {
        outln!(
            "(s; TTFT: send → first token; arr→end: arrival → last byte; latencies over \
             successful requests)"
        )?;
    }
    Ok(any_ok)
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_request_counts() {
        use super::default_requests;
        assert_eq!(default_requests(1), 8);
        assert_eq!(default_requests(4), 8);
        assert_eq!(default_requests(8), 16);
        assert_eq!(default_requests(32), 64);
    }
}
