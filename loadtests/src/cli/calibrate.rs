//! `sluice-load calibrate`: sweep concurrency, then arrival rate, probe prefill at a few prompt
//! lengths, and write the admission policy that keeps TTFT p95 under the target, with the cost
//! model (`[admission.cost]`) and prefill-token budget predictive admission starts from.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_loadtests::calibrate::{calibrate, fit_cost, policy_toml, with_cost, Level, RatePoint};
use sluice_loadtests::client::{Api, Connection};
use sluice_loadtests::measure::measure;
use sluice_loadtests::prompts::Shape;
use sluice_loadtests::report;
use sluice_loadtests::request::completion;
use sluice_loadtests::scenario::{JobContext, Row, RowKind};
use sluice_loadtests::workload::{Arrivals, Bound, Target, Workload};

use super::common::{self, ClientArgs, PromptArgs};

/// Arrival rates tried when not given, as fractions of the service rate at the chosen
/// concurrency: below it, at it, and past it (where the client-side queue must grow).
const RATE_FRACTIONS: [f64; 4] = [0.5, 0.75, 1.0, 1.25];

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// The server to calibrate for (the engine itself, not the gateway: the policy is what
    /// the gateway will enforce in front of it).
    #[arg(long)]
    pub url: String,
    /// The TTFT p95 to stay under, seconds.
    #[arg(long)]
    pub ttft_p95: f64,
    /// The request shape the policy is sized for.
    #[arg(long, default_value = "256:128")]
    pub shape: Shape,
    /// Concurrency levels swept, in order; the sweep stops at the first one over the target.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub concurrency: Vec<usize>,
    /// Requests per level and per rate [default: 2 × concurrency, at least 8].
    #[arg(long)]
    pub requests: Option<usize>,
    /// Arrival rates swept (req/s) [default: 0.5, 0.75, 1 and 1.25 × the measured service rate].
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Prompt lengths probed alone (8 output tokens, 2 requests each) for the cost model's
    /// prefill curve; empty: no `[admission.cost]` written.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    pub prefill_probe: Vec<usize>,
    /// Prompt lengths probed (8 output tokens, 2 requests each) while another request decodes
    /// throughout: what a prefill costs more beside decodes, per token and per token squared
    /// (`prefill_ms_per_1k_beside_decodes`, `prefill_ms_per_1k_squared_beside_decodes`: two
    /// lengths tell them apart, one gives the square alone). 0 or empty: not probed.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    pub beside_probe: Vec<usize>,
    /// The policy file written.
    #[arg(long, default_value = "calibrated-policy.toml")]
    pub out: PathBuf,
    /// A policy whose other keys (and comments) the output keeps [default: only [admission]].
    #[arg(long)]
    pub base: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub prompts: PromptArgs,
}

fn row(shape: &Shape, workload: Workload, requests: usize) -> Row {
    Row {
        id: "calibrate".into(),
        title: format!("{} {}", shape.label, report_load(&workload)),
        series: shape.label.clone(),
        kind: RowKind::Shape(shape.clone()),
        workload,
        bound: Bound {
            requests: Some(requests),
            duration: None,
        },
    }
}

fn report_load(w: &Workload) -> String {
    match w.rate() {
        Some(r) => format!("{r:.2}/s"),
        None => format!("C={}", w.concurrency()),
    }
}

pub async fn main(args: CalibrateArgs) -> Result<bool> {
    if !(args.ttft_p95.is_finite() && args.ttft_p95 > 0.0) {
        bail!("--ttft-p95 must be positive");
    }
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        bail!("--concurrency needs levels of at least 1");
    }
    let base_policy = match &args.base {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| p.display().to_string())?),
        None => None,
    };
    let (target, model) = common::target(&args.url, &args.client).await?;
    let (prompts, seed) = common::prompts(&args.prompts)?;
    let ctx = common::context(&prompts, model, seed);
    let count = |c: usize| args.requests.unwrap_or((2 * c).max(8));
    let mut next_base = 0u64;
    outln!("{}", report::table_header())?;

    let mut levels = Vec::new();
    for &c in &args.concurrency {
        let r = row(&args.shape, Workload::Closed { concurrency: c }, count(c));
        let entry = measure(&r, &args.url, &target, &ctx, next_base, true).await?;
        next_base += count(c) as u64;
        outln!("{}", report::table_row(&entry))?;
        let over = entry.stats.ttft.p95.is_none_or(|t| t > args.ttft_p95);
        levels.push(Level {
            concurrency: c,
            stats: entry.stats,
        });
        if over {
            break;
        }
    }
    let first = calibrate(&levels, &[], args.ttft_p95)
        .context("no level had a successful request: nothing to calibrate from")?;
    let rates = if args.rates.is_empty() {
        RATE_FRACTIONS
            .iter()
            .map(|f| (f * first.service_rate * 100.0).round() / 100.0)
            .filter(|r| *r > 0.0)
            .collect()
    } else {
        args.rates.clone()
    };
    let mut points = Vec::new();
    for rate in rates {
        let workload = Workload::Open {
            arrivals: Arrivals::Poisson(rate),
            concurrency: first.active_max,
        };
        let n = count(first.active_max);
        let entry = measure(
            &row(&args.shape, workload, n),
            &args.url,
            &target,
            &ctx,
            next_base,
            true,
        )
        .await?;
        next_base += n as u64;
        outln!("{}", report::table_row(&entry))?;
        points.push(RatePoint {
            rate,
            stats: entry.stats,
        });
    }
    let cal = calibrate(&levels, &points, args.ttft_p95)
        .context("no level had a successful request: nothing to calibrate from")?;
    let mut probes = Vec::new();
    for &p in &args.prefill_probe {
        let shape = Shape {
            label: format!("{p}:8"),
            input: p,
            output: 8,
        };
        let r = row(&shape, Workload::Closed { concurrency: 1 }, 2);
        let entry = measure(&r, &args.url, &target, &ctx, next_base, true).await?;
        next_base += 2;
        outln!("{}", report::table_row(&entry))?;
        if let Some(t) = entry.stats.ttft.p50 {
            probes.push((p, t));
        }
    }
    let shortest = probes.iter().min_by_key(|(p, _)| *p).map(|(_, t)| *t);
    let mut beside = Vec::new();
    for &p in args.beside_probe.iter().filter(|&&p| p > 0) {
        let probe = probe_beside_decode(p, shortest, &args.url, &target, &ctx, next_base).await?;
        next_base += 3;
        beside.extend(probe);
    }
    let steps: Vec<(usize, f64)> = levels
        .iter()
        .filter_map(|l| l.stats.tpot.mean.map(|t| (l.concurrency, t)))
        .collect();
    let mut toml = policy_toml(&cal, base_policy.as_deref());
    if let Some(cost) = fit_cost(&probes, &steps, &beside, args.ttft_p95) {
        outln!(
            "cost model: prefill {} ms + {} ms/1K + {} ms/1K² (+ {} ms/1K + {} ms/1K² beside \
             decodes); decode step {} ms + {} ms per request; prefill_tokens_max = {}",
            cost.prefill_base_ms,
            cost.prefill_ms_per_1k,
            cost.prefill_ms_per_1k_squared,
            cost.prefill_ms_per_1k_beside_decodes,
            cost.prefill_ms_per_1k_squared_beside_decodes,
            cost.decode_base_ms,
            cost.decode_ms_per_seq,
            cost.prefill_tokens_max
        )?;
        toml = with_cost(&toml, &cost);
    }
    std::fs::write(&args.out, &toml).with_context(|| args.out.display().to_string())?;
    outln!(
        "\nTTFT p95 target {:.2} s{}: active_max = {}, queue_depth = {}, queue_wait_max = {} ms \
         (TTFT p95 {:.2} s at {:.2} req/s; arrivals up to {} met the target) → {}",
        cal.target,
        if cal.met { "" } else { " NOT MET" },
        cal.active_max,
        cal.queue_depth,
        cal.queue_wait_max.as_millis(),
        cal.ttft_p95,
        cal.service_rate,
        cal.max_rate
            .map_or_else(|| "none".into(), |r| format!("{r:.2} req/s")),
        args.out.display()
    )?;
    Ok(cal.met)
}

/// Output tokens the decoding request beside the probe asks for (`ignore_eos`): more than it
/// can produce while two probes run; it is cancelled once they are done.
const BESIDE_DECODE_TOKENS: usize = 4096;

/// The TTFT p50 of two `prompt`:8 requests sent while a 256-token request decodes beside them
/// throughout; `None` when none succeeded. The decoding request is sent first and given
/// three times the shortest probe's time alone (`shortest`, at least a second) to reach its
/// first token.
async fn probe_beside_decode(
    prompt: usize,
    shortest: Option<f64>,
    url: &str,
    target: &Target,
    ctx: &JobContext,
    base: u64,
) -> Result<Option<(usize, f64)>> {
    let text = ctx.prompts.prompt(256, base + 2)?;
    let body = completion(&ctx.model, &text, BESIDE_DECODE_TOKENS);
    let mut conn = Connection::new(target.endpoint.clone());
    let timeout = target.timeout;
    let decoding = tokio::spawn(async move { conn.send(Api::Completions, body, timeout).await });
    let settle = (3.0 * shortest.unwrap_or(0.0)).max(1.0);
    tokio::time::sleep(Duration::from_secs_f64(settle)).await;
    let shape = Shape {
        label: format!("{prompt}:8 beside a decode"),
        input: prompt,
        output: 8,
    };
    let r = row(&shape, Workload::Closed { concurrency: 1 }, 2);
    let entry = measure(&r, url, target, ctx, base, true).await;
    decoding.abort();
    let entry = entry?;
    outln!("{}", report::table_row(&entry))?;
    Ok(entry.stats.ttft.p50.map(|t| (prompt, t)))
}
