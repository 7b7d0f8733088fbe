//! `sluice policy replay-cost LOG [--policy FILE]`: the prefill fit replayed from a gateway's
//! log ([`sluice_gateway::predict::replay`]), seeded from the policy's `[admission.cost]` (the
//! shipped one without `--policy`).

use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::Path;

use anyhow::{bail, Context as _};
use sluice_gateway::policy::{load::LoadedPolicy, Policy};
use sluice_gateway::predict::replay::{self, Errors, Observation};
use sluice_gateway::predict::{Beside, CostModel, PREFILL_TERMS};

/// The report: how many prefills, the errors by length, the terms the fit ends at and what it
/// then predicts for a prompt alone.
pub fn run(log: &Path, policy: Option<&Path>) -> anyhow::Result<String> {
    let policy = match policy {
        Some(p) => LoadedPolicy::from_file(p)?.policy,
        None => Policy::default(),
    };
    let file = std::fs::File::open(log).with_context(|| format!("{}", log.display()))?;
    let mut observations = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.with_context(|| format!("{}", log.display()))?;
        observations.extend(Observation::parse(&line));
    }
    if observations.is_empty() {
        bail!(
            "{}: no \"{}\" lines (the gateway logs them with RUST_LOG=info,sluice::predict=debug)",
            log.display(),
            replay::MESSAGE
        );
    }
    let mut model = CostModel::new(&policy.admission.cost);
    let r = replay::replay(&mut model, observations);
    let mut out = format!("{} prefills replayed\n", r.observations);
    let errors = |e: Option<Errors>| match e {
        None => "none".to_owned(),
        Some(e) => format!(
            "{} prefills, median error {:+.0}%, median |error| {:.0}%",
            e.count,
            100.0 * e.median,
            100.0 * e.median_abs
        ),
    };
    let long = replay::LONG_PROMPT;
    let _ = writeln!(out, "under {long} tokens: {}", errors(r.short));
    let _ = writeln!(out, "{long} tokens and more: {}", errors(r.long));
    let terms: Vec<String> = PREFILL_TERMS
        .iter()
        .zip(r.parameters.prefill)
        .map(|(t, v)| format!("{t} {v:.4}"))
        .collect();
    let _ = writeln!(out, "prefill terms (s): {}", terms.join(", "));
    let alone: Vec<String> = [1024, 4096, 8192]
        .iter()
        .map(|&p| format!("{p} tokens {:.2} s", model.prefill(p, Beside::IDLE)))
        .collect();
    let _ = writeln!(out, "then alone: {}", alone.join(", "));
    Ok(out)
}
