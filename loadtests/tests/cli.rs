//! The `sluice-load` binary end to end against the scripted fake: the `run --json` interface
//! later checks rely on, `matrix` writing its document, chart and samples, and `calibrate`
//! writing a policy.
#![allow(clippy::unwrap_used)] // test scaffolding: a broken fake should fail loudly

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{model_path, Fake, Kind, FIRST_CONTENT, KEY};
use serde_json::Value;
use sluice_loadtests::prompts::PromptBuilder;

/// The binary with `args`, the key, the model and a seed.
fn command(args: &[String], model: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-load"));
    cmd.args(args)
        .args([
            "--api-key",
            KEY,
            "--seed",
            "7",
            "--timeout",
            "20s",
            "--model",
        ])
        .arg(model);
    cmd
}

/// Runs [`command`] off the async runtime.
async fn cli(args: Vec<String>, model: &Path) -> Output {
    let mut cmd = command(&args, model);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-load-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn run_json_is_one_object_with_the_interface_fields() {
    let Some(model) = model_path() else { return };
    let fake = Fake::start(|_| Kind::Ok).await;
    for extra in [vec![], vec!["--rate", "20"]] {
        let mut a = args(&["run", "--url", &fake.url(), "--concurrency", "2"]);
        a.extend(args(&["--requests", "4", "--shape", "32:5", "--json"]));
        a.extend(args(&extra));
        let out = cli(a, &model).await;
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
        let v: Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(
            (v["success"].as_u64(), v["requests"].as_u64()),
            (Some(4), Some(4))
        );
        assert!(v["output_tok_s"].as_f64().unwrap() > 0.0);
        for key in ["ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95"] {
            let secs = v[key].as_f64().unwrap_or(0.0);
            assert!(
                secs >= FIRST_CONTENT.as_secs_f64() && secs < 20.0,
                "{key}: {v}"
            );
        }
        assert_eq!(v["samples"].as_array().unwrap().len(), 4);
        assert_eq!(
            v["workload"],
            if extra.is_empty() {
                "closed"
            } else {
                "open-fixed"
            }
        );
    }
    // Real prompts of exactly the shape's tokens.
    let builder = PromptBuilder::from_model(&model, 0).unwrap();
    for p in fake.prompts() {
        assert_eq!(builder.count(&p).unwrap(), 32, "{p:?}");
    }
    assert_eq!(fake.rejected(), Vec::<String>::new());
}

#[tokio::test]
async fn matrix_writes_the_document_chart_and_samples_and_keeps_notes() {
    let Some(model) = model_path() else { return };
    let (a, b) = (
        Fake::start(|_| Kind::Ok).await,
        Fake::start(|_| Kind::Ok).await,
    );
    let dir = temp_dir("matrix");
    let doc = dir.join("capacity.md");
    let run = |rows: &str| {
        let mut list = args(&["matrix", "--engine", &a.url(), "--target"]);
        list.push(format!("other={}", b.url()));
        list.extend(args(&[
            "--scale", "0.05", "--rows", rows, "--depths", "0.2,0.8",
        ]));
        list.push("--out".into());
        list.push(doc.display().to_string());
        cli(list, &model)
    };
    let out = run("short-c4,short-c8,needle-4k,tools").await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let md = std::fs::read_to_string(&doc).unwrap();
    assert!(
        md.contains("**short agent calls 256→128, C=4** (short-c4) | engine | C=4 | 4/4"),
        "{md}"
    );
    assert!(md.contains("| other | C=8 | 8/8 |"), "{md}");
    assert!(
        md.contains("needle in a 4K haystack") && md.contains("function calls"),
        "{md}"
    );
    assert!(
        md.contains("![TTFT p95") && md.contains("](capacity.svg)"),
        "{md}"
    );
    let svg = std::fs::read_to_string(dir.join("capacity.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("engine 256:128"),
        "{svg}"
    );
    assert_eq!(
        svg.matches("<polyline").count(),
        4,
        "two targets × two concurrency panels"
    );
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("capacity.json")).unwrap()).unwrap();
    let entries = json.as_array().unwrap();
    assert_eq!(entries.len(), 8);
    assert_eq!(entries[0]["samples"].as_array().unwrap().len(), 4);
    // The fake answers every needle and tool call right.
    assert_eq!(entries[4]["score"]["passed"], 2);
    assert_eq!(entries[6]["score"]["checked"], 1);

    // Notes written between the markers survive a rerun.
    let noted = md.replace("(No notes yet.)", "Hand-written finding.");
    std::fs::write(&doc, noted).unwrap();
    let out = run("short-c4").await;
    assert!(out.status.success());
    let md = std::fs::read_to_string(&doc).unwrap();
    assert!(
        md.contains("Hand-written finding.") && !md.contains("short-c8"),
        "{md}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn calibrate_writes_the_admission_policy() {
    let Some(model) = model_path() else { return };
    // TTFT is 60 ms per request in flight: C=4 is 240 ms, C=8 480 ms.
    let fake = Fake::start(|_| Kind::Ok).await;
    let dir = temp_dir("calibrate");
    let policy = dir.join("policy.toml");
    let mut a = args(&["calibrate", "--url", &fake.url(), "--ttft-p95", "0.36"]);
    a.extend(args(&[
        "--shape",
        "16:5",
        "--requests",
        "8",
        "--rates",
        "2,4",
    ]));
    a.push("--out".into());
    a.push(policy.display().to_string());
    let out = cli(a, &model).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Levels 1, 2, 4 and 8 (the first over the target ends the sweep), then two rates, then
    // the cost model's three prefill probes (256, 1K and 4K prompt tokens, 2 requests each)
    // and its 1K and 4K probes beside a decoding request (2 more each).
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("calibrate"))
        .collect();
    assert_eq!(rows.len(), 11, "{stdout}");
    assert_eq!(
        rows.iter().filter(|l| l.contains(" 2/2 ")).count(),
        5,
        "{stdout}"
    );
    let toml = std::fs::read_to_string(&policy).unwrap();
    assert!(toml.contains("[admission]"), "{toml}");
    let active: usize = toml
        .lines()
        .find_map(|l| l.strip_prefix("active_max = "))
        .unwrap()
        .parse()
        .unwrap();
    assert!((2..=4).contains(&active), "{toml}");
    assert!(
        toml.contains("\nqueue_depth = ") && toml.contains("\nqueue_wait_max = \""),
        "{toml}"
    );
    // The cost model, with the probe beside a decode written out.
    assert!(
        toml.contains("[admission.cost]")
            && toml.contains("beside a decoding request 1024 tok ")
            && toml.contains(", 4096 tok ")
            && toml.contains("\nprefill_ms_per_1k_beside_decodes = ")
            && toml.contains("\nprefill_ms_per_1k_squared_beside_decodes = "),
        "{toml}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A reader of stdout that has gone (`sluice-load … | head`) stops the echo, not the run: the
/// matrix still writes its document, and nothing panics.
#[tokio::test]
async fn a_closed_stdout_stops_the_echo_not_the_run() {
    let Some(model) = model_path() else { return };
    let fake = Fake::start(|_| Kind::Ok).await;
    let dir = temp_dir("closed-stdout");
    let doc = dir.join("capacity.md");
    let mut list = args(&["matrix", "--engine", &fake.url(), "--scale", "0.05"]);
    list.extend(args(&["--rows", "short-c4", "--out"]));
    list.push(doc.display().to_string());
    let mut cmd = command(&list, &model);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        // The reader goes before a byte is read.
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let md = std::fs::read_to_string(&doc).unwrap();
    assert!(md.contains("(short-c4) | engine | C=4 | 4/4"), "{md}");
    std::fs::remove_dir_all(dir).unwrap();
}
