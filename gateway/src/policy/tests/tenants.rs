//! Rules of `[[tenants]]`, `[alerts]` and `[admin]`.

use super::{err, tenant, ALICE, BOB};
use crate::policy::load::parse;

// --- [[tenants]] ---

refused!(
    tenant_name_empty,
    &tenant("", ALICE, ""),
    "tenants[0].name: must not be empty"
);
refused!(
    tenant_names_repeat,
    &(tenant("a", ALICE, "") + &tenant("a", BOB, "")),
    "line 6, column 8: tenants[1].name",
    "tenants[0]"
);
refused!(
    tenant_key_not_hex,
    &tenant("a", "sk-plain-key", ""),
    "line 3, column 18: tenants[0].api_key_sha256",
    "never the key itself"
);
#[test]
fn a_key_pasted_where_its_hash_goes_is_not_repeated() {
    let e = err(&tenant("a", "sk-live-abc123", ""));
    assert!(e.contains("tenants[0].api_key_sha256"), "{e}");
    assert!(e.contains("14 characters"), "{e}");
    assert!(
        !e.contains("sk-live-abc123"),
        "the key reaches the log and alerts: {e}"
    );
    let e = err("[admin]\napi_key_sha256 = \"sk-admin-secret\"\n");
    assert!(e.starts_with("line 2"), "{e}");
    assert!(!e.contains("sk-admin-secret"), "{e}");
}

refused!(
    tenant_key_uppercase,
    &tenant("a", &ALICE.to_uppercase(), ""),
    "tenants[0].api_key_sha256"
);
refused!(
    tenant_key_short,
    &tenant("a", &ALICE[..63], ""),
    "tenants[0].api_key_sha256"
);
refused!(
    tenant_keys_repeat,
    &(tenant("a", ALICE, "") + &tenant("b", ALICE, "")),
    "line 7, column 18: tenants[1].api_key_sha256: is already the key of tenants[0]"
);
refused!(
    tenant_key_is_admin_key,
    &format!(
        "{}[admin]\napi_key_sha256 = \"{ALICE}\"",
        tenant("a", ALICE, "")
    ),
    "tenants[0].api_key_sha256: is the admin key"
);
refused!(
    tenant_rps_zero,
    &tenant("a", ALICE, "requests_per_second = 0.0"),
    "tenants[0].requests_per_second"
);
refused!(
    tenant_rps_negative,
    &tenant("a", ALICE, "requests_per_second = -1.0"),
    "tenants[0].requests_per_second"
);
refused!(
    tenant_rps_nan,
    &tenant("a", ALICE, "requests_per_second = nan"),
    "tenants[0].requests_per_second"
);
refused!(
    tenant_rps_infinite,
    &tenant("a", ALICE, "requests_per_second = inf"),
    "tenants[0].requests_per_second"
);
refused!(
    tenant_burst_zero,
    &tenant("a", ALICE, "burst = 0"),
    "tenants[0].burst: must be at least 1"
);
refused!(
    tenant_tokens_per_minute_zero,
    &tenant("a", ALICE, "tokens_per_minute = 0"),
    "tenants[0].tokens_per_minute"
);

#[test]
fn tenant_small_token_budget_is_accepted() {
    // Below one full request: allowed (documented); such requests are refused on arrival.
    let text = tenant(
        "a",
        ALICE,
        "tokens_per_minute = 100\nrequests_per_second = 0.5",
    );
    let p = parse(&text).expect("small budget");
    assert_eq!(p.tenants[0].tokens_per_minute, Some(100));
    assert_eq!(p.tenants[0].burst, 10);
}

// --- [alerts] and [admin] ---

refused!(
    alerts_webhook_not_a_url,
    "[alerts]\nwebhooks = [\"http://ok:9093/hook\", \"mailto:x\"]",
    "alerts.webhooks[1]"
);
refused!(
    alerts_alertmanager_url_not_a_url,
    "[alerts]\nalertmanager_urls = [\"127.0.0.1:9093\"]",
    "line 2, column 22: alerts.alertmanager_urls[0]"
);
refused!(
    alerts_alertmanager_url_with_api_path,
    "[alerts]\nalertmanager_urls = [\"http://am:9093/api/v2/alerts\"]",
    "alerts.alertmanager_urls[0]",
    "base URL"
);
refused!(
    alerts_shed_ratio_zero,
    "[alerts]\nshed_ratio = 0.0",
    "alerts.shed_ratio"
);
refused!(
    alerts_shed_ratio_above_one,
    "[alerts]\nshed_ratio = 1.5",
    "alerts.shed_ratio"
);
refused!(
    alerts_shed_ratio_nan,
    "[alerts]\nshed_ratio = nan",
    "alerts.shed_ratio"
);
refused!(
    alerts_shed_ratio_as_string,
    "[alerts]\nshed_ratio = \"10%\"",
    "line 2, column 14"
);
refused!(
    alerts_resolve_ratio_negative,
    "[alerts]\nresolve_ratio = -0.1",
    "alerts.resolve_ratio"
);
refused!(
    alerts_resolve_ratio_above_shed_ratio,
    "[alerts]\nshed_ratio = 0.2\nresolve_ratio = 0.3",
    "line 3, column 17: alerts.resolve_ratio",
    "alerts.shed_ratio (0.2)"
);
refused!(
    alerts_min_requests_zero,
    "[alerts]\nmin_requests = 0",
    "alerts.min_requests"
);
refused!(
    alerts_min_requests_negative,
    "[alerts]\nmin_requests = -1",
    "line 2"
);
refused!(
    alerts_queue_p95_zero,
    "[alerts]\nqueue_p95 = \"0s\"",
    "alerts.queue_p95"
);
refused!(
    alerts_queue_p95_over_1h,
    "[alerts]\nqueue_p95 = \"2h\"",
    "alerts.queue_p95"
);

#[test]
fn lowering_queue_wait_max_alone_is_accepted() {
    // alerts.queue_p95 (default 10s) above it is allowed: that alert then never fires.
    let p = parse("[admission]\nqueue_wait_max = \"5s\"").expect("short wait");
    assert!(p.alerts.queue_p95 > p.admission.queue_wait_max);
}
refused!(
    alerts_window_zero,
    "[alerts]\nwindow = \"0s\"",
    "alerts.window"
);
refused!(
    alerts_window_over_a_day,
    "[alerts]\nwindow = \"25h\"",
    "alerts.window"
);
refused!(
    alerts_evaluate_every_too_short,
    "[alerts]\nevaluate_every = \"10ms\"",
    "alerts.evaluate_every",
    "100ms"
);
refused!(
    alerts_evaluate_every_longer_than_window,
    "[alerts]\nwindow = \"10s\"\nevaluate_every = \"20s\"",
    "line 3, column 18: alerts.evaluate_every",
    "alerts.window"
);
refused!(
    alerts_evaluate_every_too_many_samples,
    "[alerts]\nwindow = \"24h\"\nevaluate_every = \"1s\"",
    "alerts.evaluate_every",
    "samples"
);
refused!(
    alerts_repeat_interval_zero,
    "[alerts]\nrepeat_interval = \"0s\"",
    "alerts.repeat_interval"
);
refused!(
    alerts_old_shed_rate_key,
    "[alerts]\nshed_rate = 0.1",
    "shed_rate"
);

#[test]
fn alerts_resolve_ratio_equal_to_shed_ratio_is_accepted() {
    // No hysteresis, but consistent: fires at the share, resolves below it.
    let text = "[alerts]\nalertmanager_urls = [\"http://127.0.0.1:9093/prefix\"]\n\
                shed_ratio = 0.3\nresolve_ratio = 0.3\nevaluate_every = \"100ms\"\n\
                window = \"10s\"";
    let p = parse(text).expect("equal ratios");
    assert_eq!(p.alerts.resolve_ratio, p.alerts.shed_ratio);
    assert_eq!(
        p.alerts.alertmanager_urls,
        vec!["http://127.0.0.1:9093/prefix"]
    );
}
refused!(
    admin_key_not_hex,
    "[admin]\napi_key_sha256 = \"hunter2\"",
    "admin.api_key_sha256"
);
