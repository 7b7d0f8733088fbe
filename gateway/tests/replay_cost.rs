//! `sluice policy replay-cost` on a log the gateway wrote: the replay ends where the live fit
//! did (the recorded run's `/ui/stats`), and a log without observations says how to get them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `idle-after-short.sh` on model 167, the gateway at `RUST_LOG=info,sluice::predict=debug`:
/// its log's "prefill observed" lines in `prefills.txt`.
const RUN: &str = "loadtests/results/predictive-spr-20261207-noise/idle-new";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn sluice(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("sluice runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_replay_ends_where_the_live_fit_did() {
    let log = format!("{RUN}/prefills.txt");
    let (ok, out, err) = sluice(&["policy", "replay-cost", &log]);
    assert!(ok, "{out}{err}");
    let stats: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join(RUN).join("stats-end.json")).expect("stats"),
    )
    .expect("json");
    let live = &stats["prediction"]["parameters"];
    let n = live["prefill_observations"].as_u64().expect("count");
    assert!(
        out.starts_with(&format!("{n} prefills replayed\n")),
        "{out}"
    );
    let terms = out
        .lines()
        .find_map(|l| l.strip_prefix("prefill terms (s): "))
        .expect("terms");
    let replayed: Vec<f64> = terms
        .split(", ")
        .map(|t| t.rsplit(' ').next().and_then(|v| v.parse().ok()).expect(t))
        .collect();
    let live: Vec<f64> = live["prefill"]
        .as_array()
        .expect("terms")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect();
    assert_eq!(replayed.len(), live.len(), "{out}");
    for (r, l) in replayed.iter().zip(&live) {
        assert!((r - l).abs() < 1e-4, "replayed {replayed:?}, live {live:?}");
    }
    // Both lengths had prefills to judge, and the fit's 8K prompt alone is the one told.
    assert!(out.contains("under 1000 tokens: 190 prefills"), "{out}");
    assert!(out.contains("8192 tokens 7.45 s"), "{out}");
}

#[test]
fn a_log_without_observations_says_how_to_get_them() {
    let (ok, out, err) = sluice(&["policy", "replay-cost", "policies/default.toml"]);
    assert!(!ok, "{out}");
    assert!(err.contains("RUST_LOG=info,sluice::predict=debug"), "{err}");
    let (ok, _, err) = sluice(&["policy", "replay-cost", "no/such/log"]);
    assert!(!ok);
    assert!(err.contains("no/such/log"), "{err}");
}
