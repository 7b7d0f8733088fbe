//! The shipped policy files under `policies/` all validate.

use std::path::{Path, PathBuf};

use crate::policy::load::{hex_sha256, LoadedPolicy};
use crate::policy::schema::{Class, Policy, UpstreamKind};

/// A fresh, empty directory for one test.
pub(super) fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-policy-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn policies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn load(relative: &str) -> Policy {
    let path = policies().join(relative);
    match LoadedPolicy::from_file(&path) {
        Ok(p) => p.policy,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_shipped_policy_validates() {
    let mut checked = 0;
    for dir in [policies(), policies().join("examples")] {
        for entry in std::fs::read_dir(&dir).expect("policies dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                if let Err(e) = LoadedPolicy::from_file(&path) {
                    panic!("{e}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "only {checked} policy files found");
}

#[test]
fn default_toml_is_the_built_in_defaults() {
    assert_eq!(load("default.toml"), Policy::default());
}

#[test]
fn interactive_example_is_the_defaults() {
    assert_eq!(load("examples/interactive.toml"), Policy::default());
}

#[test]
fn batch_example_queues_longer() {
    let (batch, default) = (load("examples/batch.toml"), Policy::default());
    assert!(batch.admission.queue_depth > default.admission.queue_depth);
    assert!(batch.admission.queue_wait_max > default.admission.queue_wait_max);
    assert_eq!(batch.admission.active_max, default.admission.active_max);
}

#[test]
fn multi_tenant_example_keys_match_its_comment() {
    let p = load("examples/multi-tenant.toml");
    let key = |plain: &str| hex_sha256(plain.as_bytes());
    assert_eq!(p.tenants.len(), 2);
    assert_eq!(p.tenants[0].name, "alice");
    assert_eq!(p.tenants[0].api_key_sha256, key("sk-sluice-alice-example"));
    assert_eq!(p.tenants[0].class, Class::Interactive);
    assert_eq!(p.tenants[1].name, "bob");
    assert_eq!(p.tenants[1].api_key_sha256, key("sk-sluice-bob-example"));
    assert_eq!(p.tenants[1].class, Class::Batch);
    assert!(
        p.tenants
            .iter()
            .all(|t| t.requests_per_second.is_some()
                && t.tokens_per_minute.is_some_and(|n| n > 12288))
    );
    assert_eq!(p.admin.api_key_sha256, Some(key("sk-sluice-admin-example")));
    assert_eq!(p.upstream.kind, UpstreamKind::Bundled);
}
