//! The Prometheus and Grafana assets in `deploy/` name only metrics that Sluice really exports,
//! and promtool accepts the configuration, the rules and the rules' unit tests.
//!
//! The exported names are taken from the exporters' sources (the string literals that start
//! with `sluice_` or `vllm:` in `gateway/src/telemetry/*.rs`, `engine/src/server/metrics.rs`
//! and `engine/src/prom.rs`), so renaming a metric there without updating `deploy/` fails here.
//! The promtool checks run when `promtool` is on `PATH` (Debian: `apt-get install prometheus`);
//! with `SLUICE_REQUIRE_PROMTOOL` set they must run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The alerts `deploy/prometheus/rules/sluice.rules.yml` must define, each with a unit test that
/// sees it fire and one that sees it stay quiet.
const REQUIRED_ALERTS: [&str; 7] = [
    "LoadShedding",
    "QueueWaitHigh",
    "TimeToFirstTokenHigh",
    "EngineRankDown",
    "KvPoolNearFull",
    "PolicyReloadFailed",
    "SharedStateUnavailable",
];

/// Series Prometheus makes itself for every target, not exported by Sluice.
const SYNTHETIC: [&str; 1] = ["up"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

const RULES: &str = "deploy/prometheus/rules/sluice.rules.yml";
const RULES_TEST: &str = "deploy/prometheus/rules/sluice.rules.test.yml";
const PROMETHEUS_YML: &str = "deploy/prometheus/prometheus.yml";
const DASHBOARD: &str = "deploy/grafana/sluice-dashboard.json";

// ---------------------------------------------------------------------------------------------
// What the exporters export.

/// The exporters' sources, without their inline `#[cfg(test)]` modules.
fn exporter_sources() -> Vec<(PathBuf, String)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("gateway/src/telemetry"))
        .expect("gateway/src/telemetry")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    // The stages that write their own lines beside the registry's.
    files.push(root().join("gateway/src/alerts/mod.rs"));
    files.push(root().join("gateway/src/forward/replicas/mod.rs"));
    files.push(root().join("engine/src/server/metrics.rs"));
    files.push(root().join("engine/src/prom.rs"));
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            // An inline test module (a `mod tests;` declaration is only its line).
            let text = match text.find("#[cfg(test)]\nmod tests {") {
                Some(i) => text[..i].to_owned(),
                None => text,
            };
            (p, text)
        })
        .collect()
}

/// Metric names at the start of a string literal: `"sluice_..."` or `"vllm:..."`.
fn names_in_source(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["\"sluice_", "\"vllm:"] {
        let mut rest = text;
        while let Some(i) = rest.find(prefix) {
            let start = &rest[i + 1..];
            let len = start
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(start.len());
            let name = &start[..len];
            // `format!("sluice_{x}")`-style prefixes are not names.
            if !name.ends_with('_') && !name.ends_with(':') {
                names.insert(name.to_owned());
            }
            rest = &start[len..];
        }
    }
    names
}

fn exported_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, text) in exporter_sources() {
        names.extend(names_in_source(&text));
    }
    names
}

/// Whether `name` (possibly a histogram's `_bucket`, `_sum` or `_count`) is in `known`.
fn is_known(name: &str, known: &BTreeSet<String>) -> bool {
    known.contains(name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| known.contains(base))
        })
}

// ---------------------------------------------------------------------------------------------
// What the assets reference.

/// The metric names a PromQL expression selects: identifiers that are not functions, keywords,
/// label names (in `{...}`, `by (...)`, `on (...)`, ...), strings, numbers, durations or
/// Grafana variables.
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 8] = [
        "and", "or", "unless", "bool", "offset", "inf", "nan", "atan2",
    ];
    // Aggregations may put `by (...)` before their argument: `sum by (le) (x)`.
    const AGGREGATIONS: [&str; 14] = [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_ws = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    // Index just past the bracket matching the one at `j`, skipping string literals.
    let skip_group = |j: usize, open: char, close: char| {
        let mut depth = 0usize;
        let mut k = j;
        while k < chars.len() {
            match chars[k] {
                '"' | '\'' | '`' => {
                    let q = chars[k];
                    k += 1;
                    while k < chars.len() && chars[k] != q {
                        if chars[k] == '\\' {
                            k += 1;
                        }
                        k += 1;
                    }
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return k + 1;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        chars.len()
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' => i = skip_group(i, '{', '}'),
            '[' => i = skip_group(i, '[', ']'),
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            // Numbers and durations (0.95, 1e9, 0x1f, 5m, 1h30m).
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len() && (is_ident(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            // Grafana variables ($__rate_interval, ${DS_PROMETHEUS}).
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    i = skip_group(i, '{', '}');
                } else {
                    while i < chars.len() && is_ident(chars[i]) {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = skip_ws(i);
                if LABEL_LISTS.contains(&word.as_str()) {
                    if chars.get(next) == Some(&'(') {
                        i = skip_group(next, '(', ')');
                    }
                } else if KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
                    || AGGREGATIONS.contains(&word.as_str())
                {
                    // An operator, a literal or an aggregation.
                } else if chars.get(next) == Some(&'(') {
                    // A function or an aggregation.
                } else {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// The value of every `key:` in crude YAML: a scalar on the same line (quotes removed), or the
/// indented block after `key: |` / `key: >`.
fn yaml_values(text: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut values = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start().trim_start_matches("- ");
        i += 1;
        let Some(rest) = trimmed.strip_prefix(key).and_then(|r| r.strip_prefix(':')) else {
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with('|') || rest.starts_with('>') {
            let indent = line.len() - line.trim_start().len();
            let mut block = String::new();
            while i < lines.len()
                && (lines[i].trim().is_empty()
                    || lines[i].len() - lines[i].trim_start().len() > indent)
            {
                block.push_str(lines[i].trim());
                block.push('\n');
                i += 1;
            }
            values.push(block);
        } else {
            let unquoted = rest
                .strip_prefix('\'')
                .and_then(|r| r.strip_suffix('\''))
                .or_else(|| rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
                .unwrap_or(rest);
            values.push(unquoted.to_owned());
        }
    }
    values
}

/// Every Prometheus query in the dashboard, with the title of its panel.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push((title.clone(), expr.to_owned()));
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON")
}

/// Each unknown name, with where it is used.
fn unknown_names<'a>(
    exprs: impl IntoIterator<Item = (String, &'a str)>,
    known: &BTreeSet<String>,
) -> Vec<String> {
    let mut unknown = Vec::new();
    for (at, expr) in exprs {
        for name in promql_metric_names(expr) {
            if !is_known(&name, known) && !SYNTHETIC.contains(&name.as_str()) {
                unknown.push(format!("{name} (in {at}: {})", expr.trim()));
            }
        }
    }
    unknown
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn promql_metric_names_skips_functions_labels_and_variables() {
    let expr = r#"histogram_quantile(0.95, sum by (le, class) (rate(sluice_queue_wait_seconds_bucket{class=~"a|b", job!="x"}[$__rate_interval])))
        / on (job) group_left (rank) min without (rank) (max_over_time(foo:bar[15m:15s])) > bool 1e3
        or sum(x_total offset 5m) without (instance) unless vllm:kv_cache_usage_perc{le="+Inf"}"#;
    let names: Vec<String> = promql_metric_names(expr).into_iter().collect();
    assert_eq!(
        names,
        [
            "foo:bar",
            "sluice_queue_wait_seconds_bucket",
            "vllm:kv_cache_usage_perc",
            "x_total"
        ]
    );
}

#[test]
fn exporters_name_metrics_in_string_literals() {
    let known = exported_metrics();
    // The engine's names are stable; if these are missing, the source scan is broken.
    for name in [
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "sluice_engine_rank_up",
        "sluice_engine_kv_tokens_used",
    ] {
        assert!(known.contains(name), "{name} not found in {known:?}");
    }
    assert!(
        known.iter().any(|n| n.starts_with("sluice_requests_")),
        "no gateway metric found in gateway/src/telemetry: {known:?}"
    );
}

#[test]
fn rules_name_only_exported_metrics() {
    let known = exported_metrics();
    let rules = read(RULES);
    let tests = read(RULES_TEST);
    // Recording rules defined here may be used by the other rules and by the unit tests.
    let mut allowed = known.clone();
    allowed.extend(yaml_values(&rules, "record"));
    let exprs: Vec<(String, String)> = yaml_values(&rules, "expr")
        .into_iter()
        .map(|e| (RULES.to_owned(), e))
        .chain(
            yaml_values(&tests, "expr")
                .into_iter()
                .map(|e| (RULES_TEST.to_owned(), e)),
        )
        // The unit tests' input series and expected samples are series selectors too.
        .chain(
            yaml_values(&tests, "series")
                .into_iter()
                .chain(yaml_values(&tests, "labels"))
                .map(|e| (format!("{RULES_TEST} (series)"), e)),
        )
        .collect();
    assert!(exprs.len() > 20, "too few expressions found: {exprs:#?}");
    let referenced: BTreeSet<String> = exprs
        .iter()
        .flat_map(|(_, e)| promql_metric_names(e))
        .collect();
    assert!(
        referenced.contains("sluice_requests_total"),
        "{referenced:?}"
    );
    let unknown = unknown_names(
        exprs.iter().map(|(at, e)| (at.clone(), e.as_str())),
        &allowed,
    );
    assert!(
        unknown.is_empty(),
        "the rules name metrics that the exporters (gateway/src/telemetry, engine/src/server/metrics.rs) \
         do not export:\n  {}\nexported: {known:?}",
        unknown.join("\n  ")
    );
}

#[test]
fn every_required_alert_is_defined_and_tested_both_ways() {
    let rules = read(RULES);
    let defined: BTreeSet<String> = yaml_values(&rules, "alert").into_iter().collect();
    let tests = read(RULES_TEST);
    for alert in REQUIRED_ALERTS {
        assert!(defined.contains(alert), "{RULES} lacks alert {alert}");
        // Each `alertname: X` is followed by its `exp_alerts:` (empty: `[]`, or a list).
        let mut fires = false;
        let mut quiet = false;
        let lines: Vec<&str> = tests.lines().map(str::trim).collect();
        for (i, line) in lines.iter().enumerate() {
            if line.strip_prefix("alertname:").map(str::trim) != Some(alert) {
                continue;
            }
            match lines.get(i + 1).map(|l| l.trim_end()) {
                Some("exp_alerts: []") => quiet = true,
                Some("exp_alerts:") => fires = true,
                other => panic!("alertname: {alert} followed by {other:?}"),
            }
        }
        assert!(fires, "{RULES_TEST} never expects {alert} to fire");
        assert!(quiet, "{RULES_TEST} never expects {alert} to stay quiet");
    }
}

#[test]
fn dashboard_names_only_exported_metrics() {
    let known = exported_metrics();
    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 12, "too few panel queries: {queries:#?}");
    let unknown = unknown_names(
        queries
            .iter()
            .map(|(title, e)| (format!("panel {title:?}"), e.as_str())),
        &known,
    );
    assert!(
        unknown.is_empty(),
        "the dashboard names metrics that the exporters (gateway/src/telemetry, \
         engine/src/server/metrics.rs) do not export:\n  {}\nexported: {known:?}",
        unknown.join("\n  ")
    );
}

#[test]
fn dashboard_panels_query_the_prometheus_variable() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "DS_PROMETHEUS" && v["type"] == "datasource"),
        "no DS_PROMETHEUS datasource variable"
    );
    let mut ids = BTreeSet::new();
    let mut graphs = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(panel["id"].as_u64().expect("a numeric panel id")),
            "duplicate panel id in {title:?}"
        );
        if panel["type"] == "row" {
            continue;
        }
        graphs += 1;
        assert_eq!(
            panel["datasource"]["uid"], "${DS_PROMETHEUS}",
            "panel {title:?}"
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            assert!(
                t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                "panel {title:?}: a target without expr"
            );
            assert_eq!(
                t["datasource"]["uid"], "${DS_PROMETHEUS}",
                "panel {title:?}"
            );
        }
    }
    assert!(graphs >= 12, "only {graphs} panels");
}

/// `promtool`, if installed; required when `SLUICE_REQUIRE_PROMTOOL` is set.
fn promtool() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("promtool"))
            .find(|p| p.is_file())
    });
    let required = std::env::var_os("SLUICE_REQUIRE_PROMTOOL").is_some_and(|v| !v.is_empty());
    if found.is_none() {
        assert!(
            !required,
            "SLUICE_REQUIRE_PROMTOOL is set but promtool is not on PATH (Debian: apt-get install prometheus)"
        );
        eprintln!("promtool not on PATH: skipping (Debian: apt-get install prometheus)");
    }
    found
}

fn run_promtool(promtool: &Path, args: &[&str]) {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(root())
        .output()
        .expect("running promtool");
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_checks_the_config_and_rules() {
    let Some(promtool) = promtool() else {
        return;
    };
    run_promtool(&promtool, &["check", "config", PROMETHEUS_YML]);
    run_promtool(&promtool, &["check", "rules", RULES]);
}

#[test]
fn promtool_rule_unit_tests_pass() {
    let Some(promtool) = promtool() else {
        return;
    };
    run_promtool(&promtool, &["test", "rules", RULES_TEST]);
}

/// The `sluice_*` names the documentation gives in backticks (a label set after `{` or a
/// histogram's suffix allowed) are metrics the gateway or the engine exports: an operator who
/// queries a documented name gets its series.
#[test]
fn the_docs_name_only_exported_metrics() {
    let known = exported_metrics();
    let mut unknown = Vec::new();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.push(root().join("README.md"));
    for path in docs {
        let text = std::fs::read_to_string(&path).expect("a doc");
        for quoted in text.split('`').skip(1).step_by(2) {
            let Some(name) = quoted.strip_prefix("sluice_") else {
                continue;
            };
            let name: String = name
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A Rust path (`sluice_engine::…`) names a crate, not a metric.
            if quoted[7 + name.len()..].starts_with("::") {
                continue;
            }
            let name = format!("sluice_{name}");
            if !is_known(&name, &known) {
                unknown.push(format!("{name} (in {})", path.display()));
            }
        }
    }
    assert!(unknown.is_empty(), "documented, not exported: {unknown:#?}");
}
