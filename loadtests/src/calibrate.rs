//! The deployment's manual tuning loop, automated: from a concurrency sweep and an arrival-rate
//! sweep, the admission policy (`active_max`, `queue_depth`, `queue_wait_max`) that keeps TTFT
//! p95 under a target.
//!
//! - `active_max`: the knee of the closed-loop sweep among the levels whose TTFT p95 meets the
//!   target — the smallest concurrency reaching 95% of the best throughput. More slots past the
//!   knee only lengthen everyone's TTFT ("at 8 active, TTFT p95 went from 4.9 s to 25 s for no
//!   gain").
//! - `queue_wait_max`: the target minus the TTFT p95 at `active_max`: a waiter that has not
//!   started by then would miss the target anyway, so it is better shed (503) than served late.
//! - `queue_depth`: how many waiters drain within that wait at the measured service rate
//!   (Little's law: rate × wait); a deeper queue only holds requests that will time out.
//! - The rate sweep (arrivals with the client held to `active_max`, as the gateway would) finds
//!   the highest arrival rate whose arrival → first token p95 still meets the target: the load
//!   the policy can carry without shedding.

use std::time::Duration;

use crate::stats::ScenarioStats;

/// One closed-loop level of the sweep.
#[derive(Debug, Clone)]
pub struct Level {
    pub concurrency: usize,
    pub stats: ScenarioStats,
}

/// One open-loop rate of the sweep.
#[derive(Debug, Clone)]
pub struct RatePoint {
    pub rate: f64,
    pub stats: ScenarioStats,
}

/// The policy the sweeps support, and the figures behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// TTFT p95 target, s.
    pub target: f64,
    pub active_max: usize,
    pub queue_depth: usize,
    pub queue_wait_max: Duration,
    /// TTFT p95 at `active_max`, s.
    pub ttft_p95: f64,
    /// Successful requests per second at `active_max`.
    pub service_rate: f64,
    pub output_tok_s: f64,
    /// The highest swept arrival rate meeting the target, if any did.
    pub max_rate: Option<f64>,
    /// False when no level met the target: the policy is then the safest one measured.
    pub met: bool,
}

/// Whether a level counts: every request succeeded and its TTFT p95 is at most `target`.
fn meets(stats: &ScenarioStats, target: f64, ttft: Option<f64>) -> bool {
    stats.total > 0 && stats.succeeded == stats.total && ttft.is_some_and(|t| t <= target)
}

/// The calibration for `target` seconds of TTFT p95; `None` without any successful level.
pub fn calibrate(levels: &[Level], rates: &[RatePoint], target: f64) -> Option<Calibration> {
    let ok: Vec<&Level> = levels
        .iter()
        .filter(|l| meets(&l.stats, target, l.stats.ttft.p95))
        .collect();
    let met = !ok.is_empty();
    let chosen = if met {
        let best = ok
            .iter()
            .map(|l| l.stats.goodput_per_s())
            .fold(0.0, f64::max);
        ok.iter()
            .filter(|l| l.stats.goodput_per_s() >= 0.95 * best)
            .min_by_key(|l| l.concurrency)
            .copied()?
    } else {
        // Nothing met it: the level with the lowest TTFT p95 that answered at all.
        levels
            .iter()
            .filter(|l| l.stats.ttft.p95.is_some())
            .min_by(|a, b| {
                a.stats
                    .ttft
                    .p95
                    .unwrap_or(f64::MAX)
                    .total_cmp(&b.stats.ttft.p95.unwrap_or(f64::MAX))
            })?
    };
    let ttft_p95 = chosen.stats.ttft.p95?;
    let service_rate = chosen.stats.goodput_per_s();
    // Whole tenths of a second, at least one tenth: the schema wants a positive duration.
    // Rounded to whole milliseconds first: 3.0 − 2.7 is 0.2999… in f64, and is 300 ms.
    let budget_ms = ((target - ttft_p95).max(0.0) * 1000.0).round() as u64;
    let wait = (budget_ms / 100).max(1) as f64 / 10.0;
    let max_rate = rates
        .iter()
        .filter(|r| meets(&r.stats, target, r.stats.arrival_to_first.p95))
        .map(|r| r.rate)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    Some(Calibration {
        target,
        active_max: chosen.concurrency,
        queue_depth: if met {
            (service_rate * wait).floor() as usize
        } else {
            0
        },
        queue_wait_max: Duration::from_secs_f64(wait),
        ttft_p95,
        service_rate,
        output_tok_s: chosen.stats.output_tok_per_s(),
        max_rate,
        met,
    })
}

/// The cost model `sluice-load calibrate` proposes (`[admission.cost]`, milliseconds; the
/// gateway's model in `docs/policy.md`), and the prefill-token budget that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct CostFit {
    pub prefill_base_ms: f64,
    pub prefill_ms_per_1k: f64,
    pub prefill_ms_per_1k_squared: f64,
    pub decode_base_ms: f64,
    pub decode_ms_per_seq: f64,
    /// What a prefill costs more beside a decoding request, per 1K tokens and per 1K² tokens
    /// (0 unprobed).
    pub prefill_ms_per_1k_beside_decodes: f64,
    pub prefill_ms_per_1k_squared_beside_decodes: f64,
    /// Prompt tokens whose prefill takes half the TTFT target: a short request arriving behind
    /// that much prefill still meets the target.
    pub prefill_tokens_max: usize,
    /// The probes behind it: (prompt tokens, TTFT p50 s alone) and (running, s per token).
    pub probes: Vec<(usize, f64)>,
    pub steps: Vec<(usize, f64)>,
    /// (prompt tokens, TTFT p50 s) of the probes beside a decoding request.
    pub beside: Vec<(usize, f64)>,
}

/// Least squares of `y` on the features in `terms` (indices), others 0; `None` when the
/// points cannot tell those terms apart (fewer points than terms, or collinear features).
fn least_squares_on(rows: &[(Vec<f64>, f64)], terms: &[usize], n: usize) -> Option<Vec<f64>> {
    let m = terms.len();
    if rows.len() < m {
        return None;
    }
    // Normal equations, solved by Gaussian elimination with partial pivoting.
    let mut a = vec![vec![0.0; m + 1]; m];
    for (x, y) in rows {
        for (i, &ti) in terms.iter().enumerate() {
            for (j, &tj) in terms.iter().enumerate() {
                a[i][j] += x[ti] * x[tj];
            }
            a[i][m] += x[ti] * y;
        }
    }
    for col in 0..m {
        let pivot = (col..m).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        a.swap(col, pivot);
        if a[col][col].abs() < 1e-12 {
            return None;
        }
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (v, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    let mut theta = vec![0.0; n];
    for (i, &t) in terms.iter().enumerate() {
        theta[t] = a[i][m] / a[i][i];
    }
    Some(theta)
}

/// Non-negative least squares of `y` on the features (every term is a cost; a negative base
/// must not cost the per-token term): of the least-squares fits on each subset of the terms,
/// the one with the least residual among those whose coefficients are all ≥ 0. Exact for these
/// 2–3 term models, since the optimum is the plain fit on its own positive terms. Exact ties
/// (two probes fit by any two terms) go to the larger subset, then the leading terms: the base
/// and the per-token cost. `None` without a point.
fn least_squares(rows: &[(Vec<f64>, f64)]) -> Option<Vec<f64>> {
    let n = rows.first()?.0.len();
    let residual = |theta: &[f64]| -> f64 {
        rows.iter()
            .map(|(x, y)| y - x.iter().zip(theta).map(|(a, b)| a * b).sum::<f64>())
            .map(|e| e * e)
            .sum()
    };
    // Closer than this is float noise between fits that both go through every point.
    let tie = 1e-12 * rows.iter().map(|(_, y)| y * y).sum::<f64>();
    let mut subsets: Vec<u32> = (0..1u32 << n).collect();
    subsets.sort_by_key(|s| (std::cmp::Reverse(s.count_ones()), *s));
    let mut best: Option<(f64, Vec<f64>)> = None;
    for s in subsets {
        let terms: Vec<usize> = (0..n).filter(|i| s >> i & 1 == 1).collect();
        let Some(theta) = least_squares_on(rows, &terms, n) else {
            continue;
        };
        if theta.iter().any(|t| *t < 0.0) {
            continue;
        }
        let r = residual(&theta);
        if best.as_ref().is_none_or(|(b, _)| r < b - tie) {
            best = Some((r, theta));
        }
    }
    best.map(|(_, theta)| theta)
}

/// The cost model from prefill probes (prompt tokens, TTFT p50 alone, s), decode levels
/// (requests running, mean time per output token, s) and probes beside a decoding request
/// (prompt tokens, TTFT p50, s), for a TTFT target of `target` s. What the probes beside took
/// over the prefill curve's time alone (the whole probe ran beside the decode: share 1) is
/// fitted, non-negatively, as `d·k + e·k²`: the decodes run in each of the prompt's smaller
/// chunks' steps (per token), and each chunk reads the context before it again (per token
/// squared). One probe gives the square alone (`e`), as before both terms were fitted.
pub fn fit_cost(
    probes: &[(usize, f64)],
    steps: &[(usize, f64)],
    beside: &[(usize, f64)],
    target: f64,
) -> Option<CostFit> {
    let prefill_rows: Vec<(Vec<f64>, f64)> = probes
        .iter()
        .map(|&(p, t)| {
            let k = p as f64 / 1000.0;
            (vec![1.0, k, k * k], t)
        })
        .collect();
    // One probe cannot tell a base from a per-token cost: the per-token term alone.
    let pre = (prefill_rows.len() >= 2)
        .then(|| least_squares(&prefill_rows))
        .flatten()
        .or_else(|| {
            let rows: Vec<(Vec<f64>, f64)> =
                prefill_rows.iter().map(|(x, y)| (vec![x[1]], *y)).collect();
            least_squares(&rows).map(|t| vec![0.0, t[0], 0.0])
        })?;
    let step_rows: Vec<(Vec<f64>, f64)> = steps
        .iter()
        .map(|&(n, s)| (vec![1.0, n as f64], s))
        .collect();
    let dec = least_squares(&step_rows).unwrap_or_else(|| vec![0.01, 0.0]);
    // The largest prompt whose prefill fits half the target, in whole 256-token blocks.
    let prefill_s = |tokens: usize| {
        let k = tokens as f64 / 1000.0;
        pre[0] + pre[1] * k + pre[2] * k * k
    };
    let extra_rows: Vec<(Vec<f64>, f64)> = beside
        .iter()
        .map(|&(p, t)| {
            let k = p as f64 / 1000.0;
            (vec![k, k * k], (t - prefill_s(p)).max(0.0))
        })
        .collect();
    let (per_1k_beside, per_1k_squared_beside) = match extra_rows.len() {
        0 => (0.0, 0.0),
        1 => (0.0, extra_rows[0].1 / extra_rows[0].0[1]),
        _ => least_squares(&extra_rows).map_or((0.0, 0.0), |t| (t[0], t[1])),
    };
    let mut budget = 256;
    while budget < 65_536 && prefill_s(budget + 256) <= target / 2.0 {
        budget += 256;
    }
    let ms = |s: f64| (s * 1000.0 * 100.0).round() / 100.0;
    Some(CostFit {
        prefill_base_ms: ms(pre[0]),
        prefill_ms_per_1k: ms(pre[1]),
        prefill_ms_per_1k_squared: ms(pre[2]),
        decode_base_ms: ms(dec[0]),
        decode_ms_per_seq: ms(dec[1]),
        prefill_ms_per_1k_beside_decodes: ms(per_1k_beside),
        prefill_ms_per_1k_squared_beside_decodes: ms(per_1k_squared_beside),
        prefill_tokens_max: budget,
        probes: probes.to_vec(),
        steps: steps.to_vec(),
        beside: beside.to_vec(),
    })
}

/// The `[admission.cost]` section and the `prefill_tokens_max` line.
fn cost_lines(c: &CostFit) -> (String, String) {
    // Probes alone and beside a decode alike: "256 tok 0.13 s, 1024 tok 0.55 s".
    let timed = |probes: &[(usize, f64)]| {
        let each: Vec<String> = probes
            .iter()
            .map(|(p, t)| format!("{p} tok {t:.2} s"))
            .collect();
        each.join(", ")
    };
    let steps: Vec<String> = c
        .steps
        .iter()
        .map(|(n, s)| format!("{n} running {:.1} ms", s * 1000.0))
        .collect();
    let beside = if c.beside.is_empty() {
        "not probed".to_owned()
    } else {
        timed(&c.beside)
    };
    (
        format!(
            "# Prefill of half the TTFT target's time: a short request behind it still meets the target.\nprefill_tokens_max = {}",
            c.prefill_tokens_max
        ),
        format!(
            "[admission.cost]\n# Calibrated: TTFT alone {}; beside a decoding request {}; time per output token {}.\nprefill_base_ms = {}\nprefill_ms_per_1k = {}\nprefill_ms_per_1k_squared = {}\nprefill_ms_per_1k_beside_decodes = {}\nprefill_ms_per_1k_squared_beside_decodes = {}\ndecode_base_ms = {}\ndecode_ms_per_seq = {}\n",
            timed(&c.probes),
            beside,
            steps.join(", "),
            c.prefill_base_ms,
            c.prefill_ms_per_1k,
            c.prefill_ms_per_1k_squared,
            c.prefill_ms_per_1k_beside_decodes,
            c.prefill_ms_per_1k_squared_beside_decodes,
            c.decode_base_ms,
            c.decode_ms_per_seq
        ),
    )
}

/// `toml` with its `[admission.cost]` section (if any) replaced by the fitted one and
/// `prefill_tokens_max` set in `[admission]`.
pub fn with_cost(toml: &str, c: &CostFit) -> String {
    let (budget, section) = cost_lines(c);
    let mut out = String::new();
    let mut current = String::new();
    let mut budget_written = false;
    for line in toml.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            if current == "admission" && !budget_written {
                out.push_str(&budget);
                out.push('\n');
                budget_written = true;
            }
            current = trimmed.trim_matches(['[', ']']).trim().to_owned();
        }
        if current == "admission.cost" {
            continue;
        }
        let key = trimmed.split('=').next().unwrap_or("").trim();
        if current == "admission" && key == "prefill_tokens_max" {
            out.push_str(&budget);
            out.push('\n');
            budget_written = true;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if current == "admission" && !budget_written {
        out.push_str(&budget);
        out.push('\n');
    }
    out.push('\n');
    out.push_str(&section);
    out
}

/// The `[admission]` lines, each with the measurement behind it.
fn admission_lines(c: &Calibration) -> [String; 3] {
    [
        format!(
            "# Calibrated: TTFT p95 {:.2} s at {} active ({:.2} req/s, {:.1} output tok/s); target {:.2} s{}.\nactive_max = {}",
            c.ttft_p95,
            c.active_max,
            c.service_rate,
            c.output_tok_s,
            c.target,
            if c.met { "" } else { " NOT MET at any level: the safest level measured" },
            c.active_max
        ),
        format!(
            "# Waiters drained within queue_wait_max at {:.2} req/s.\nqueue_depth = {}",
            c.service_rate, c.queue_depth
        ),
        format!(
            "# The TTFT budget left after TTFT p95 at active_max: later, the target is missed anyway.\nqueue_wait_max = \"{}ms\"",
            c.queue_wait_max.as_millis()
        ),
    ]
}

/// A policy file: `base` (a policy's TOML text) with its three admission keys replaced, or a
/// file of just the `[admission]` section (every other key keeps its default).
pub fn policy_toml(c: &Calibration, base: Option<&str>) -> String {
    let lines = admission_lines(c);
    let header = format!(
        "# Written by `sluice-load calibrate --ttft-p95 {}`{}.\n",
        c.target,
        c.max_rate.map_or_else(
            || ", no swept arrival rate met the target".into(),
            |r| format!("; arrivals up to {r:.2} req/s met the target")
        )
    );
    let Some(base) = base else {
        return format!("{header}\n[admission]\n{}\n", lines.join("\n"));
    };
    let keys = ["active_max", "queue_depth", "queue_wait_max"];
    let mut out = header;
    let mut section = String::new();
    let mut written = [false; 3];
    for line in base.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            if section == "admission" {
                append_missing(&mut out, &lines, &mut written);
            }
            section = trimmed.trim_matches(['[', ']']).trim().to_owned();
        }
        let key = trimmed.split('=').next().unwrap_or("").trim();
        match keys
            .iter()
            .position(|k| section == "admission" && *k == key)
        {
            Some(i) => {
                out.push_str(&lines[i]);
                out.push('\n');
                written[i] = true;
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if section == "admission" {
        append_missing(&mut out, &lines, &mut written);
    } else if !written.iter().any(|&w| w) {
        out.push_str(&format!("\n[admission]\n{}\n", lines.join("\n")));
    }
    out
}

fn append_missing(out: &mut String, lines: &[String; 3], written: &mut [bool; 3]) {
    for (line, done) in lines.iter().zip(written.iter_mut()) {
        if !*done {
            out.push_str(line);
            out.push('\n');
            *done = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Summary;

    fn stats(ok: usize, total: usize, wall_s: u64, ttft_p95: f64) -> ScenarioStats {
        let s = Summary {
            count: ok,
            p50: Some(ttft_p95 / 2.0),
            p95: Some(ttft_p95),
            mean: None,
        };
        ScenarioStats {
            total,
            succeeded: ok,
            wall: Duration::from_secs(wall_s),
            completion_tokens: 100 * ok as u64,
            ttft: s,
            arrival_to_first: s,
            ..ScenarioStats::default()
        }
    }

    fn level(c: usize, ok: usize, wall: u64, ttft: f64) -> Level {
        Level {
            concurrency: c,
            stats: stats(ok, 16, wall, ttft),
        }
    }

    #[test]
    fn the_knee_under_the_target_sets_the_policy() {
        // Throughput: 0.8, 1.6, 1.65, 1.7 req/s; TTFT p95 0.5, 1.2, 2.5, 6 s.
        let levels = [
            level(1, 16, 20, 0.5),
            level(2, 16, 10, 1.2),
            level(4, 16, 10, 2.5),
            level(8, 16, 9, 6.0),
        ];
        let rates = [
            RatePoint {
                rate: 0.5,
                stats: stats(16, 16, 32, 1.0),
            },
            RatePoint {
                rate: 1.0,
                stats: stats(16, 16, 16, 2.9),
            },
            RatePoint {
                rate: 2.0,
                stats: stats(16, 16, 10, 9.0),
            },
        ];
        let c = calibrate(&levels, &rates, 3.0).unwrap();
        // C=4 meets 3 s but gains < 5% over C=2: the knee is 2.
        assert_eq!(c.active_max, 2);
        assert_eq!(c.ttft_p95, 1.2);
        assert_eq!(c.service_rate, 1.6);
        assert_eq!(c.queue_wait_max, Duration::from_millis(1800));
        assert_eq!(c.queue_depth, 2); // 1.6 req/s × 1.8 s
        assert_eq!(c.max_rate, Some(1.0));
        assert!(c.met);

        // A level with a failure does not count, however fast.
        let mut failing = levels.clone();
        failing[1].stats.succeeded = 15;
        assert_eq!(calibrate(&failing, &rates, 3.0).unwrap().active_max, 4);

        // Nothing meets 0.1 s: the lowest TTFT, an empty queue, flagged.
        let c = calibrate(&levels, &rates, 0.1).unwrap();
        assert_eq!(
            (c.active_max, c.queue_depth, c.met, c.max_rate),
            (1, 0, false, None)
        );
        assert!(calibrate(&[], &[], 1.0).is_none());
    }

    #[test]
    fn the_cost_model_fits_the_probes_and_sizes_the_budget() {
        // TTFT alone: 0.1 s + 0.5 s per 1K + 0.05 s per 1K²; steps 20 ms + 5 ms per request.
        let probes: Vec<(usize, f64)> = [256, 1024, 4096]
            .iter()
            .map(|&p| {
                let k = p as f64 / 1000.0;
                (p, 0.1 + 0.5 * k + 0.05 * k * k)
            })
            .collect();
        let steps = [(1, 0.025), (2, 0.030), (4, 0.040)];
        // Beside a decoding request a prompt takes 0.8 s per 1K and 0.1 s per 1K² more.
        let alone = |k: f64| 0.1 + 0.5 * k + 0.05 * k * k;
        let beside = [1024, 4096].map(|p| {
            let k = p as f64 / 1000.0;
            (p, alone(k) + 0.8 * k + 0.1 * k * k)
        });
        let c = fit_cost(&probes, &steps, &beside, 4.0).unwrap();
        assert!(
            (c.prefill_ms_per_1k_beside_decodes - 800.0).abs() < 0.5,
            "{c:?}"
        );
        assert!(
            (c.prefill_ms_per_1k_squared_beside_decodes - 100.0).abs() < 0.5,
            "{c:?}"
        );
        // One probe beside (a 4K prompt 3 s more): the square alone, 178.81 ms per 1K².
        let k4 = 4.096;
        let one_beside = fit_cost(&probes, &steps, &[(4096, alone(k4) + 3.0)], 4.0).unwrap();
        assert_eq!(one_beside.prefill_ms_per_1k_beside_decodes, 0.0);
        assert!(
            (one_beside.prefill_ms_per_1k_squared_beside_decodes - 178.81).abs() < 0.01,
            "{one_beside:?}"
        );
        assert!((c.prefill_base_ms - 100.0).abs() < 0.5, "{c:?}");
        assert!((c.prefill_ms_per_1k - 500.0).abs() < 0.5, "{c:?}");
        assert!((c.prefill_ms_per_1k_squared - 50.0).abs() < 0.5, "{c:?}");
        assert!((c.decode_base_ms - 20.0).abs() < 0.1, "{c:?}");
        assert!((c.decode_ms_per_seq - 5.0).abs() < 0.1, "{c:?}");
        // 2 s of prefill: 0.1 + 0.5k + 0.05k² = 2 → k ≈ 3.05: 2,816 tokens in 256 blocks.
        assert_eq!(c.prefill_tokens_max, 2816);
        // One probe: the per-token term alone.
        let one = fit_cost(&[(1000, 0.8)], &[], &[], 4.0).unwrap();
        assert_eq!((one.prefill_base_ms, one.prefill_ms_per_1k), (0.0, 800.0));
        // Unprobed beside decodes, or faster there than alone (noise): 0, never negative.
        assert_eq!(one.prefill_ms_per_1k_squared_beside_decodes, 0.0);
        let faster = fit_cost(&[(1000, 0.8)], &[], &[(1000, 0.7)], 4.0).unwrap();
        assert_eq!(faster.prefill_ms_per_1k_squared_beside_decodes, 0.0);
        let both_faster = fit_cost(&[(1000, 0.8)], &[], &[(1000, 0.7), (2000, 1.5)], 4.0).unwrap();
        assert_eq!(
            (
                both_faster.prefill_ms_per_1k_beside_decodes,
                both_faster.prefill_ms_per_1k_squared_beside_decodes
            ),
            (0.0, 0.0)
        );
        assert!(fit_cost(&[], &[], &[], 1.0).is_none());

        let base = "[admission]\nactive_max = 4\nprefill_tokens_max = 1\n\n[admission.cost]\n# old\nprefill_base_ms = 9\n\n[upstream]\nkind = \"bundled\"\n";
        let out = with_cost(base, &c);
        assert_eq!(out.matches("prefill_tokens_max = 2816").count(), 1, "{out}");
        assert!(
            !out.contains("prefill_base_ms = 9") && !out.contains("= 1\n"),
            "{out}"
        );
        assert_eq!(out.matches("[admission.cost]").count(), 1, "{out}");
        assert!(out.contains("[upstream]\nkind"), "{out}");
        let cost = &out[out.find("[admission.cost]").unwrap()..];
        assert!(cost.contains("\nprefill_ms_per_1k = 500\n"), "{out}");
        assert!(
            cost.contains("\nprefill_ms_per_1k_beside_decodes = 800\n")
                && cost.contains("\nprefill_ms_per_1k_squared_beside_decodes = 100\n"),
            "{out}"
        );
        let admission = &out[..out.find("[upstream]").unwrap()];
        assert!(admission.contains("prefill_tokens_max = 2816"), "{out}");
    }

    #[test]
    fn a_negative_intercept_keeps_the_per_token_and_per_sequence_terms() {
        // TTFT alone: −0.01 s + 0.2 s per 1K + 0.05 s per 1K²: the exact fit's base is
        // negative, yet the per-token cost is real. Steps: −10 ms + 20 ms per request.
        let probes: Vec<(usize, f64)> = [256, 1024, 4096]
            .iter()
            .map(|&p| {
                let k = p as f64 / 1000.0;
                (p, -0.01 + 0.2 * k + 0.05 * k * k)
            })
            .collect();
        let steps = [(1, 0.01), (2, 0.03), (4, 0.07)];
        let c = fit_cost(&probes, &steps, &[], 2.0).unwrap();
        assert!(c.prefill_base_ms >= 0.0, "{c:?}");
        assert!(c.prefill_ms_per_1k > 0.0, "{c:?}");
        assert!(c.prefill_ms_per_1k_squared >= 0.0, "{c:?}");
        // 1 s of prefill: 0.2k + 0.05k² = 1 → k ≈ 2.9, not the 65,536 cap.
        assert!((2304..=3328).contains(&c.prefill_tokens_max), "{c:?}");
        assert!(c.decode_base_ms >= 0.0, "{c:?}");
        // The best non-negative fit is through the origin: 350 / 21 ≈ 16.67 ms per request.
        assert!((c.decode_ms_per_seq - 16.67).abs() < 0.01, "{c:?}");
    }

    #[test]
    fn the_queue_wait_keeps_whole_tenths_through_float_error() {
        // 3.0 − 2.7 is 0.2999… in f64: still 300 ms.
        let c = calibrate(&[level(2, 16, 10, 2.7)], &[], 3.0).unwrap();
        assert_eq!(c.queue_wait_max, Duration::from_millis(300));
        // Below a tenth: the schema's minimum.
        let c = calibrate(&[level(2, 16, 10, 2.97)], &[], 3.0).unwrap();
        assert_eq!(c.queue_wait_max, Duration::from_millis(100));
    }

    #[test]
    fn policy_files_replace_only_the_admission_keys() {
        let c = calibrate(&[level(4, 16, 10, 1.0)], &[], 3.0).unwrap();
        let minimal = policy_toml(&c, None);
        assert!(minimal.contains("[admission]\n# Calibrated"), "{minimal}");
        assert!(minimal.contains("\nactive_max = 4\n"), "{minimal}");
        assert!(minimal.contains("\nqueue_depth = 3\n"), "{minimal}");
        assert!(
            minimal.contains("\nqueue_wait_max = \"2000ms\"\n"),
            "{minimal}"
        );

        let base = "[server]\nlisten = \"127.0.0.1:1\"\n\n[admission]\n# old\nactive_max = 9\nqueue_wait_max = \"60s\"\nheavy_active_max = 1\n\n[upstream]\nkind = \"bundled\"\n";
        let out = policy_toml(&c, Some(base));
        assert!(out.contains("listen = \"127.0.0.1:1\""));
        assert!(
            !out.contains("active_max = 9") && !out.contains("\"60s\""),
            "{out}"
        );
        assert!(out.contains("heavy_active_max = 1"));
        assert_eq!(out.matches("queue_depth = 3").count(), 1, "{out}");
        let admission = &out[out.find("[admission]").unwrap()..out.find("[upstream]").unwrap()];
        assert!(admission.contains("queue_depth = 3"), "{out}");
        let no_admission = policy_toml(&c, Some("[server]\nlisten = \"127.0.0.1:1\"\n"));
        assert!(
            no_admission.ends_with("queue_wait_max = \"2000ms\"\n"),
            "{no_admission}"
        );
    }
}
