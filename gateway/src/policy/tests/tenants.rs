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
    alerts_shed_rate_zero,
    "[alerts]\nshed_rate = 0.0",
    "alerts.shed_rate"
);
refused!(
    alerts_shed_rate_nan,
    "[alerts]\nshed_rate = nan",
    "alerts.shed_rate"
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
    admin_key_not_hex,
    "[admin]\napi_key_sha256 = \"hunter2\"",
    "admin.api_key_sha256"
);
