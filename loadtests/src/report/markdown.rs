//! `docs/capacity.md`: the matrix in the deployment report's layout (one block of rows per
//! scenario, one row per target, side by side), the run's conditions, and the notes a person
//! wrote, kept across reruns.

use super::{load, outcomes, secs, Entry};

/// Where hand-written notes start and end in the document; a rerun keeps what is between.
pub const NOTES_BEGIN: &str = "<!-- notes: kept when sluice-load matrix rewrites this file -->";
pub const NOTES_END: &str = "<!-- end of notes -->";

/// The run's conditions, printed above the table.
#[derive(Debug, Clone, Default)]
pub struct DocInfo {
    /// `2026-11-30 04:10–04:32 UTC`.
    pub when: String,
    /// `2 cores, 23 GiB`, and the load average before and after.
    pub machine: String,
    pub load_before: String,
    pub load_after: String,
    pub scale: f64,
    /// The command line that produced the document.
    pub command: String,
    /// `name → URL` of each target.
    pub targets: Vec<(String, String)>,
    /// The chart and the JSON, relative to the document.
    pub svg: Option<String>,
    pub json: Option<String>,
}

fn pair(a: Option<f64>, b: Option<f64>) -> String {
    format!("{} / {}", secs(a), secs(b))
}

/// The matrix: one row per (scenario, target), scenarios in the order they ran.
pub fn matrix_table(entries: &[Entry]) -> String {
    let mut out = String::from(
        "| scenario | target | load | success | out tok/s | TTFT p50 / p95 | E2E p50 / p95 \
         | arrival→end / sent→end p95 | queue p95 | score | outcomes |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    let mut ids: Vec<&str> = Vec::new();
    for e in entries {
        if !ids.contains(&e.id.as_str()) {
            ids.push(&e.id);
        }
    }
    for id in ids {
        for (i, e) in entries.iter().filter(|e| e.id == id).enumerate() {
            let s = &e.stats;
            let title = if i == 0 {
                format!("**{}** ({})", e.title, e.id)
            } else {
                String::new()
            };
            let score = s
                .score
                .map_or_else(|| "–".into(), |sc| format!("{}/{}", sc.passed, sc.checked));
            out.push_str(&format!(
                "| {title} | {} | {} | {}/{} | {:.1} | {} | {} | {} | {} | {score} | {} |\n",
                e.target,
                load(&e.workload),
                s.succeeded,
                s.total,
                s.output_tok_per_s(),
                pair(s.ttft.p50, s.ttft.p95),
                pair(s.e2e.p50, s.e2e.p95),
                pair(s.arrival_to_end.p95, s.e2e.p95),
                secs(s.queue.p95),
                outcomes(s).replace('|', "\\|"),
            ));
        }
    }
    out
}

/// Scores by kind (needle depth) and the first message of each kind of failure.
fn details(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries {
        let s = &e.stats;
        let mut parts: Vec<String> = s
            .score_by_kind
            .iter()
            .filter(|_| s.score_by_kind.len() > 1)
            .map(|(k, sc)| format!("{k} {}/{}", sc.passed, sc.checked))
            .collect();
        parts.extend(
            s.failure_examples
                .iter()
                .map(|(label, msg)| format!("`{label}`: {}", msg.replace('\n', " "))),
        );
        if !parts.is_empty() {
            out.push_str(&format!(
                "- {} on {}: {}\n",
                e.id,
                e.target,
                parts.join("; ")
            ));
        }
    }
    out
}

/// The whole document; `notes` is the hand-written part of the previous version, if any.
pub fn capacity_doc(info: &DocInfo, entries: &[Entry], previous: Option<&str>) -> String {
    let notes = previous
        .and_then(|doc| {
            let start = doc.find(NOTES_BEGIN)? + NOTES_BEGIN.len();
            let end = doc[start..].find(NOTES_END)? + start;
            Some(doc[start..end].trim().to_owned())
        })
        .unwrap_or_else(|| "(No notes yet.)".into());
    let targets: Vec<String> = info
        .targets
        .iter()
        .map(|(name, url)| format!("`{name}` = {url}"))
        .collect();
    let mut doc = format!(
        "# Capacity on this machine\n\n\
         The deployment's capacity matrix, measured by `sluice-load matrix` against each target in \
         turn, scenario by scenario (so every row block compares targets under the same machine \
         conditions). Latencies in seconds, over successful requests; TTFT is send → first \
         token; arrival→end counts the wait for a client-side slot (open loop), sent→end does \
         not; queue is the gateway's `x-sluice-queue-ms`. Request counts are the deployment's \
         × scale (at least one).\n\n\
         - When: {}\n- Machine: {}; load average before {}, after {}\n- Scale: {}\n\
         - Targets: {}\n- Command: `{}`\n",
        info.when,
        info.machine,
        info.load_before,
        info.load_after,
        info.scale,
        targets.join(", "),
        info.command,
    );
    if let Some(json) = &info.json {
        doc.push_str(&format!("- Every sample: [{json}]({json})\n"));
    }
    doc.push_str(&format!(
        "\n{NOTES_BEGIN}\n{notes}\n{NOTES_END}\n\n## The matrix\n\n"
    ));
    doc.push_str(&matrix_table(entries));
    if let Some(svg) = &info.svg {
        doc.push_str(&format!(
            "\n![TTFT p95 and output tok/s against concurrency and arrival rate]({svg})\n"
        ));
    }
    let details = details(entries);
    if !details.is_empty() {
        doc.push_str("\n## Scores by kind and failures\n\n");
        doc.push_str(&details);
    }
    doc
}
