//! `docs/capacity.md`: the matrix in the deployment report's layout (one block of rows per
//! scenario, one row per target, side by side), the run's conditions, and what a person wrote
//! (the notes above the matrix and the sections after it), kept across reruns.

use super::{load, outcomes, secs, Entry};

/// Where hand-written notes start and end in the document; a rerun keeps what is between.
pub const NOTES_BEGIN: &str = "<!-- notes: kept when sluice-load matrix rewrites this file -->";
pub const NOTES_END: &str = "<!-- end of notes -->";
/// Where hand-written sections after the matrix start; a rerun keeps all that follows.
pub const AFTER_MATRIX: &str =
    "<!-- after the matrix: kept when sluice-load matrix rewrites this file -->";
/// The headings this module writes; any other `## ` heading after the notes of a document
/// written before [`AFTER_MATRIX`] existed starts a hand-written section.
const MATRIX_HEADING: &str = "## The matrix";
const DETAILS_HEADING: &str = "## Scores by kind and failures";
const GENERATED_HEADINGS: [&str; 2] = [MATRIX_HEADING, DETAILS_HEADING];

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

/// The hand-written sections after the matrix in `doc`: all after [`AFTER_MATRIX`], or, in a
/// document without it, all from the first heading after the notes that this module did not
/// write. Without this a rerun would drop them.
fn after_matrix(doc: &str) -> Option<&str> {
    if let Some(i) = doc.find(AFTER_MATRIX) {
        return Some(doc[i + AFTER_MATRIX.len()..].trim());
    }
    let from = doc.find(NOTES_END).map_or(0, |i| i + NOTES_END.len());
    let mut offset = from;
    for line in doc[from..].split_inclusive('\n') {
        let heading = line.trim_end();
        if heading.starts_with("## ") && !GENERATED_HEADINGS.contains(&heading) {
            return Some(doc[offset..].trim());
        }
        offset += line.len();
    }
    None
}

/// The whole document; `previous` is the file it replaces, whose hand-written parts (the notes
/// and the sections after the matrix) it keeps.
pub fn capacity_doc(info: &DocInfo, entries: &[Entry], previous: Option<&str>) -> String {
    let notes = previous
        .and_then(|doc| {
            let start = doc.find(NOTES_BEGIN)? + NOTES_BEGIN.len();
            let end = doc[start..].find(NOTES_END)? + start;
            Some(doc[start..end].trim().to_owned())
        })
        .unwrap_or_else(|| "(No notes yet.)".into());
    let after = previous.and_then(after_matrix).unwrap_or_default();
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
        "\n{NOTES_BEGIN}\n{notes}\n{NOTES_END}\n\n{MATRIX_HEADING}\n\n"
    ));
    doc.push_str(&matrix_table(entries));
    if let Some(svg) = &info.svg {
        doc.push_str(&format!(
            "\n![TTFT p95 and output tok/s against concurrency and arrival rate]({svg})\n"
        ));
    }
    let details = details(entries);
    if !details.is_empty() {
        doc.push_str(&format!("\n{DETAILS_HEADING}\n\n"));
        doc.push_str(&details);
    }
    doc.push_str(&format!("\n{AFTER_MATRIX}\n"));
    if !after.is_empty() {
        doc.push_str(&format!("\n{after}\n"));
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> DocInfo {
        DocInfo {
            when: "2026-12-05 23:50 UTC".into(),
            scale: 0.25,
            ..DocInfo::default()
        }
    }

    #[test]
    fn a_rerun_keeps_the_notes_and_every_section_after_the_matrix() {
        let first = capacity_doc(&info(), &[], None);
        assert!(first.contains("(No notes yet.)"));
        assert!(first.trim_end().ends_with(AFTER_MATRIX));
        let edited = first.replace("(No notes yet.)", "Quiet machine.")
            + "\n## Predictive admission\n\n| a | b |\n\n### Zen 3\n\ntext\n";
        let second = capacity_doc(&info(), &[], Some(&edited));
        assert!(second.contains("Quiet machine."));
        assert!(!second.contains("(No notes yet.)"));
        let tail = "## Predictive admission\n\n| a | b |\n\n### Zen 3\n\ntext\n";
        assert!(second.ends_with(&format!("{AFTER_MATRIX}\n\n{tail}")));
        // Stable: a third run writes the same document, with one marker.
        assert_eq!(capacity_doc(&info(), &[], Some(&second)), second);
        assert_eq!(second.matches(AFTER_MATRIX).count(), 1);
    }

    #[test]
    fn a_document_from_before_the_marker_keeps_its_own_sections() {
        let old = format!(
            "# Capacity on this machine\n\n{NOTES_BEGIN}\nnotes\n{NOTES_END}\n\n\
             ## The matrix\n\n| row |\n\n## Scores by kind and failures\n\n- x\n\n\
             ## Predictive admission (issue 23, item 5)\n\nresults\n"
        );
        let doc = capacity_doc(&info(), &[], Some(&old));
        assert!(doc.ends_with(&format!(
            "{AFTER_MATRIX}\n\n## Predictive admission (issue 23, item 5)\n\nresults\n"
        )));
        assert!(!doc.contains("| row |"), "the old matrix is replaced");
        // Only the generated headings: nothing to keep.
        let bare = capacity_doc(&info(), &[], None).replace(AFTER_MATRIX, "");
        assert!(after_matrix(&bare).is_none());
    }
}
