//! The SVG chart: TTFT p95 and output tok/s against concurrency (closed loops), arrival →
//! first token p95 and output tok/s against arrival rate (open loops), one line per target
//! and shape. Written by hand: four line charts do not need a plotting library.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::Entry;
use crate::workload::Workload;

const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const W: f64 = 460.0;
const H: f64 = 280.0;
const MARGIN: (f64, f64, f64, f64) = (56.0, 16.0, 34.0, 44.0); // left, right, top, bottom

type Series = BTreeMap<String, Vec<(f64, f64)>>;

/// The smallest 1, 2 or 5 × 10^k at or above `v`.
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let k = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * k)
        .find(|&c| c >= v * (1.0 - 1e-9))
        .unwrap_or(10.0 * k)
}

/// A tick label with four significant digits, trailing zeros dropped: enough for every
/// quarter of a 1, 2 or 5 × 10^k axis (0.0125, 0.0375, 12.5), which a fixed two decimals
/// rounds away on a small axis (0.0125 as "0.01").
fn tick(v: f64) -> String {
    if v == v.round() {
        return format!("{v:.0}");
    }
    let decimals = (3 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.decimals$}")
        .trim_end_matches('0')
        .trim_end_matches('.')
        .to_owned()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One panel at `(ox, oy)`; `colors` maps series names to palette entries.
fn panel(
    out: &mut String,
    (ox, oy): (f64, f64),
    (title, xlabel): (&str, &str),
    series: &Series,
    colors: &BTreeMap<String, &str>,
) {
    let (l, r, t, b) = MARGIN;
    let (pw, ph) = (W - l - r, H - t - b);
    let points = series.values().flatten();
    let xmax = nice_ceiling(points.clone().map(|p| p.0).fold(0.0, f64::max));
    let ymax = nice_ceiling(points.map(|p| p.1).fold(0.0, f64::max));
    let x = |v: f64| ox + l + v / xmax * pw;
    let y = |v: f64| oy + t + ph - v / ymax * ph;
    let _ = write!(
        out,
        r#"<g><text x="{:.1}" y="{:.1}" font-size="13" font-weight="bold">{}</text>"#,
        ox + l,
        oy + 20.0,
        escape(title)
    );
    let _ = write!(
        out,
        r##"<rect x="{:.1}" y="{:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#999"/>"##,
        ox + l,
        oy + t
    );
    for i in 0..=4 {
        let (xv, yv) = (xmax * f64::from(i) / 4.0, ymax * f64::from(i) / 4.0);
        let _ = write!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"##,
            ox + l,
            y(yv),
            ox + l + pw,
            y(yv),
            ox + l - 4.0,
            y(yv) + 3.0,
            tick(yv),
            x(xv),
            oy + t + ph + 14.0,
            tick(xv)
        );
    }
    let _ = write!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"#,
        ox + l + pw / 2.0,
        oy + H - 10.0,
        escape(xlabel)
    );
    if series.is_empty() {
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" fill="#999" text-anchor="middle">no data</text>"##,
            ox + l + pw / 2.0,
            oy + t + ph / 2.0
        );
    }
    for (name, pts) in series {
        let color = colors.get(name).copied().unwrap_or("#000");
        let path: Vec<String> = pts
            .iter()
            .map(|&(px, py)| format!("{:.1},{:.1}", x(px), y(py)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(px, py) in pts {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(px),
                y(py)
            );
        }
    }
    out.push_str("</g>");
}

/// Points `(x, y)` per `target shape` line, from the entries `pick` accepts; lines of a single
/// point are dropped (a trend needs two).
fn collect(
    entries: &[Entry],
    pick: impl Fn(&Entry) -> Option<f64>,
    value: impl Fn(&Entry) -> Option<f64>,
) -> Series {
    let mut series = Series::new();
    for e in entries {
        if let (Some(px), Some(py)) = (pick(e), value(e)) {
            series
                .entry(format!("{} {}", e.target, e.series))
                .or_default()
                .push((px, py));
        }
    }
    series.retain(|_, pts| pts.len() > 1);
    for pts in series.values_mut() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// The four panels: (title, x label, lines).
fn panels(entries: &[Entry]) -> [(&'static str, &'static str, Series); 4] {
    let closed = |e: &Entry| match e.workload {
        Workload::Closed { concurrency } => Some(concurrency as f64),
        Workload::Open { .. } => None,
    };
    let rate = |e: &Entry| e.workload.rate();
    let ttft = |e: &Entry| e.stats.ttft.p95;
    // An open loop's requests may wait in the client before they are sent: what its users saw
    // runs from the arrival, or the client-side queue would hide behind a flat line.
    let arrival_ttft = |e: &Entry| e.stats.arrival_to_first.p95;
    let tok = |e: &Entry| (e.stats.succeeded > 0).then(|| e.stats.output_tok_per_s());
    [
        (
            "TTFT p95 (s) vs concurrency",
            "concurrency",
            collect(entries, closed, ttft),
        ),
        (
            "output tok/s vs concurrency",
            "concurrency",
            collect(entries, closed, tok),
        ),
        (
            "arrival → first token p95 (s) vs arrival rate",
            "arrivals (req/s)",
            collect(entries, rate, arrival_ttft),
        ),
        (
            "output tok/s vs arrival rate",
            "arrivals (req/s)",
            collect(entries, rate, tok),
        ),
    ]
}

/// The four panels and a legend, as one SVG document.
pub fn chart(entries: &[Entry]) -> String {
    let panels = panels(entries);
    let mut colors = BTreeMap::new();
    for (_, _, series) in &panels {
        for name in series.keys() {
            let next = PALETTE[colors.len() % PALETTE.len()];
            colors.entry(name.clone()).or_insert(next);
        }
    }
    let legend_h = 20.0 * colors.len().div_ceil(3) as f64 + 16.0;
    let (width, height) = (2.0 * W, 2.0 * H + legend_h);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#
    );
    for (i, (title, xlabel, series)) in panels.iter().enumerate() {
        let origin = ((i % 2) as f64 * W, (i / 2) as f64 * H);
        panel(&mut out, origin, (title, xlabel), series, &colors);
    }
    for (i, (name, color)) in colors.iter().enumerate() {
        let (lx, ly) = (
            MARGIN.0 + (i % 3) as f64 * 290.0,
            2.0 * H + 16.0 + (i / 3) as f64 * 20.0,
        );
        let _ = write!(
            out,
            r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="4" fill="{color}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            ly - 4.0,
            lx + 20.0,
            ly,
            escape(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::stats::{ScenarioStats, Summary};
    use crate::workload::{Arrivals, Run};

    #[test]
    fn ceilings_and_ticks() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(5.0), 5.0);
        assert_eq!(nice_ceiling(17.0), 20.0);
        assert_eq!(nice_ceiling(0.07), 0.1);
        assert_eq!(nice_ceiling(120.0), 200.0);
        assert_eq!(
            (tick(2.0), tick(0.25), tick(1.5)),
            ("2".into(), "0.25".into(), "1.5".into())
        );
    }

    #[test]
    fn ticks_keep_the_digits_their_step_needs() {
        // A 0.05 axis in quarters: 0.0125, 0.025, 0.0375.
        assert_eq!(tick(0.0125), "0.0125");
        assert_eq!(tick(0.05 * 3.0 / 4.0), "0.0375");
        assert_eq!(tick(0.1 * 3.0 / 4.0), "0.075");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(1250.0), "1250");
        assert_eq!(tick(0.0), "0");
    }

    fn open_entry(rate: f64, ttft_p95: f64, arrival_to_first_p95: f64) -> Entry {
        let p95 = |v| Summary {
            count: 1,
            p50: Some(v),
            p95: Some(v),
            mean: Some(v),
        };
        Entry {
            target: "gateway".into(),
            id: "open".into(),
            title: "open".into(),
            series: "256:128".into(),
            workload: Workload::Open {
                arrivals: Arrivals::Poisson(rate),
                concurrency: 4,
            },
            stats: ScenarioStats {
                total: 1,
                succeeded: 1,
                ttft: p95(ttft_p95),
                arrival_to_first: p95(arrival_to_first_p95),
                ..ScenarioStats::default()
            },
            run: Run {
                records: Vec::new(),
                wall: Duration::from_secs(1),
                duration: None,
            },
        }
    }

    #[test]
    fn open_loops_plot_the_wait_in_the_client_too() {
        // Sent → first token 1 s, but 29 s of it queued in the client: a user saw 30 s.
        let entries = [open_entry(0.5, 1.0, 30.0), open_entry(1.0, 1.0, 30.0)];
        let (title, _, series) = &panels(&entries)[2];
        assert!(title.contains("arrival → first token"), "{title}");
        assert_eq!(series["gateway 256:128"], [(0.5, 30.0), (1.0, 30.0)]);
    }
}
