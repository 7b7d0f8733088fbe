//! The guard: access never widens silently, restart-only keys are held, refusals name keys.

use std::net::SocketAddr;

use super::{err, tenant, ALICE, BOB};
use crate::policy::guard::{Guard, RESTART_KEYS};
use crate::policy::load::parse;
use crate::policy::schema::Policy;

const ADMIN: &str = "0000000000000000000000000000000000000000000000000000000000000a11";

fn on(addr: &str) -> Guard {
    Guard::new(addr.parse::<SocketAddr>().expect("addr"))
}

fn policy(text: &str) -> Policy {
    parse(text).unwrap_or_else(|e| panic!("{e}"))
}

fn two_tenants() -> Policy {
    policy(&(tenant("alice", ALICE, "") + &tenant("bob", BOB, "")))
}

/// The reason `new` is refused after `running`.
fn refusal(running: &Policy, new: &str) -> String {
    match on("127.0.0.1:8443").admit(running, policy(new)) {
        Ok(a) => panic!("admitted: {:?}", a.policy),
        Err(e) => e.message,
    }
}

#[test]
fn a_file_without_tenants_cannot_replace_one_with_tenants() {
    let running = two_tenants();
    for new in ["", "# defaults\n", "[admission]\nactive_max = 2\n"] {
        let e = refusal(&running, new);
        assert!(e.starts_with("tenants: "), "{e}");
        assert!(e.contains("[server] open = true"), "{e}");
        assert!(e.contains("has 2"), "{e}");
    }
}

#[test]
fn saying_open_lets_every_tenant_go() {
    let a = on("127.0.0.1:8443")
        .admit(&two_tenants(), policy("[server]\nopen = true\n"))
        .expect("explicitly open");
    assert!(a.policy.tenants.is_empty());
    assert!(
        a.access_changes
            .iter()
            .any(|c| c.contains("tenants removed") && c.contains("alice")),
        "{:?}",
        a.access_changes
    );
    assert!(a
        .access_changes
        .iter()
        .any(|c| c == "server.open: false -> true"));
}

#[test]
fn removing_some_tenants_is_an_ordinary_edit() {
    let a = on("127.0.0.1:8443")
        .admit(&two_tenants(), policy(&tenant("alice", ALICE, "")))
        .expect("one tenant left");
    assert_eq!(a.policy.tenants.len(), 1);
    assert_eq!(
        a.access_changes,
        vec!["tenants removed: [\"bob\"]".to_owned()]
    );
}

#[test]
fn a_raised_class_or_a_removed_limit_is_an_access_change() {
    let limited =
        "class = \"batch\"\nrequests_per_second = 1.0\nburst = 1\ntokens_per_minute = 1000";
    let running = policy(&(tenant("alice", ALICE, "") + &tenant("bob", BOB, limited)));
    // bob becomes interactive and unlimited: allowed, and every change is named.
    let a = on("127.0.0.1:8443")
        .admit(&running, two_tenants())
        .expect("an ordinary edit");
    assert_eq!(
        a.access_changes,
        vec![
            "tenant \"bob\": class batch -> interactive",
            "tenant \"bob\": requests_per_second 1 -> unlimited",
            "tenant \"bob\": burst 1 -> 10",
            "tenant \"bob\": tokens_per_minute 1000 -> unlimited",
        ]
    );
    // Back again: the narrowing is named too; the same file twice changes nothing.
    let a = on("127.0.0.1:8443")
        .admit(&two_tenants(), running.clone())
        .expect("an ordinary edit");
    assert_eq!(a.access_changes.len(), 4, "{:?}", a.access_changes);
    let a = on("127.0.0.1:8443")
        .admit(&running, running.clone())
        .expect("unchanged");
    assert!(a.access_changes.is_empty(), "{:?}", a.access_changes);
}

#[test]
fn dropping_the_admin_key_needs_admin_disabled() {
    let with_admin = format!(
        "{}[admin]\napi_key_sha256 = \"{ADMIN}\"\n",
        tenant("a", ALICE, "")
    );
    let running = policy(&with_admin);
    let e = refusal(&running, &tenant("a", ALICE, ""));
    assert!(e.starts_with("admin.api_key_sha256: "), "{e}");
    assert!(e.contains("[admin] disabled = true"), "{e}");
    let a = on("127.0.0.1:8443")
        .admit(
            &running,
            policy(&format!(
                "{}[admin]\ndisabled = true\n",
                tenant("a", ALICE, "")
            )),
        )
        .expect("explicitly disabled");
    assert!(a.policy.admin.api_key_sha256.is_none());
}

#[test]
fn an_empty_reload_lists_every_refusal() {
    let with_admin = format!(
        "{}[admin]\napi_key_sha256 = \"{ADMIN}\"\n",
        tenant("a", ALICE, "")
    );
    let e = refusal(&policy(&with_admin), "");
    assert!(
        e.contains("tenants: ") && e.contains("; admin.api_key_sha256: "),
        "{e}"
    );
}

#[test]
fn open_off_loopback_needs_server_open_at_start_and_on_reload() {
    let open = Policy::default();
    assert!(on("127.0.0.1:8443").check_start(&open).is_ok());
    assert!(on("[::1]:8443").check_start(&open).is_ok());
    for addr in ["0.0.0.0:8443", "10.1.2.3:443", "[::]:8443"] {
        let e = on(addr).check_start(&open).expect_err("open off loopback");
        assert!(e.message.starts_with("server.open: "), "{e}");
        assert!(e.message.contains(addr), "{e}");
        assert!(on(addr)
            .check_start(&policy("[server]\nopen = true\n"))
            .is_ok());
        assert!(on(addr).check_start(&two_tenants()).is_ok());
        // A reload keeps to the same rule, even when the running policy was open too.
        let explicit = policy("[server]\nopen = true\n");
        let e = on(addr)
            .admit(&explicit, policy("[admission]\nactive_max = 2\n"))
            .expect_err("reload drops open");
        assert!(e.message.starts_with("server.open: "), "{e}");
    }
}

#[test]
fn restart_only_keys_are_held_and_reported_while_the_rest_applies() {
    let running = policy("[admission]\nactive_max = 4\n");
    let new = policy(
        "[server]\nlisten = \"0.0.0.0:9443\"\nopen = true\n[admission]\nactive_max = 2\n\
         [traces]\nendpoint = \"http://127.0.0.1:4318\"\n",
    );
    let a = on("127.0.0.1:8443").admit(&running, new).expect("admitted");
    assert_eq!(a.policy.admission.active_max, 2, "the live key applies");
    assert_eq!(a.policy.server.listen, running.server.listen, "listen held");
    assert_eq!(a.policy.traces.endpoint, None, "traces held");
    assert_eq!(a.restart_pending, vec!["server.listen", "traces.endpoint"]);
}

#[test]
fn switching_the_upstream_kind_waits_for_a_restart_whole() {
    // Kind and URLs are held together, so the policy in force stays a consistent bundled one.
    let running = Policy::default();
    let new = "[upstream]\nkind = \"openai\"\nurls = [\"http://127.0.0.1:8000\"]\n\
               idle_timeout = \"10s\"\n";
    let a = on("127.0.0.1:8443")
        .admit(&running, policy(new))
        .expect("admitted");
    assert_eq!(a.restart_pending, vec!["upstream.kind", "upstream.urls"]);
    assert_eq!(a.policy.upstream.kind, running.upstream.kind);
    assert!(a.policy.upstream.urls.is_empty());
    assert_eq!(a.policy.upstream.idle_timeout.as_secs(), 10);
}

#[test]
fn the_prefill_order_waits_for_a_restart_and_follows_the_upstream_kind() {
    use crate::middleware::admission::Limits;
    use crate::policy::PrefillOrder;
    // Unset: the bundled engine is started with shortest first, an openai upstream is taken as
    // first come, first served; the admission's prediction plays the same.
    let running = Policy::default();
    assert_eq!(running.upstream.prefill_order(), PrefillOrder::Shortest);
    assert_eq!(Limits::from(&running).prefill_order, PrefillOrder::Shortest);
    let openai = policy("[upstream]\nkind = \"openai\"\nurls = [\"http://127.0.0.1:8000\"]\n");
    assert_eq!(Limits::from(&openai).prefill_order, PrefillOrder::Oldest);
    // The bundled engine has it from its command line: a reload holds it.
    let new = policy("[upstream]\nprefill_order = \"oldest\"\n");
    assert_eq!(new.upstream.prefill_order(), PrefillOrder::Oldest);
    let a = on("127.0.0.1:8443").admit(&running, new).expect("admitted");
    assert_eq!(a.restart_pending, vec!["upstream.prefill_order"]);
    assert_eq!(
        Limits::from(&a.policy).prefill_order,
        PrefillOrder::Shortest
    );
}

#[test]
fn every_restart_key_is_documented_as_such() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md"))
        .expect("docs/policy.md");
    let section = doc
        .split("### Keys that need a restart")
        .nth(1)
        .expect("docs/policy.md has a 'Keys that need a restart' section");
    let section = section.split("\n#").next().unwrap_or(section);
    for key in RESTART_KEYS {
        assert!(
            section.contains(&format!("`{key}`")),
            "{key} is not documented as restart-only"
        );
    }
}

refused!(
    open_with_tenants_is_a_contradiction,
    &format!("[server]\nopen = true\n{}", tenant("a", ALICE, "")),
    "server.open: true says the gateway runs without API keys, but [[tenants]] gives 1 key(s)"
);
refused!(
    admin_disabled_with_a_key_is_a_contradiction,
    &format!("[admin]\ndisabled = true\napi_key_sha256 = \"{ADMIN}\"\n"),
    "admin.disabled: true turns the admin endpoints off"
);
