use std::sync::Arc;

use http::Request;

use super::*;
use crate::policy::{LoadedPolicy, Policy, PolicyStore};

fn sha(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

fn tenant(name: &str, key: &str, class: Class) -> Tenant {
    Tenant {
        name: name.into(),
        api_key_sha256: sha(key),
        class,
        requests_per_second: None,
        burst: 10,
        tokens_per_minute: None,
    }
}

fn store(tenants: Vec<Tenant>) -> Arc<PolicyStore> {
    let mut loaded = LoadedPolicy::defaults();
    loaded.policy = Policy {
        tenants,
        ..Policy::default()
    };
    PolicyStore::new(loaded)
}

fn check(auth: &Auth, headers: &[(&str, &str)]) -> Result<Caller, GatewayError> {
    let mut req = Request::new(());
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    auth.check(&mut req)?;
    Ok(req.extensions().get::<Caller>().cloned().expect("caller"))
}

#[test]
fn open_gateway_needs_no_key() {
    let auth = Auth::new(store(vec![]));
    let c = check(&auth, &[]).expect("open");
    assert_eq!(c.tenant, None);
    assert_eq!(c.class, Class::Interactive);
    assert_eq!(c.name(), "anonymous");
}

#[test]
fn keys_select_their_tenant_by_bearer_or_x_api_key() {
    let auth = Auth::new(store(vec![
        tenant("alice", "sk-alice", Class::Interactive),
        tenant("bob", "sk-bob", Class::Batch),
    ]));
    let a = check(&auth, &[("authorization", "Bearer sk-alice")]).expect("alice");
    assert_eq!(a.name(), "alice");
    let b = check(&auth, &[("x-api-key", "sk-bob")]).expect("bob");
    assert_eq!((b.name(), b.class), ("bob", Class::Batch));
    let b = check(&auth, &[("authorization", "bearer   sk-bob ")]).expect("case and spaces");
    assert_eq!(b.name(), "bob");
}

#[test]
fn missing_or_wrong_keys_get_401() {
    let auth = Auth::new(store(vec![tenant("alice", "sk-alice", Class::Interactive)]));
    assert_eq!(check(&auth, &[]), Err(GatewayError::MissingApiKey));
    assert_eq!(
        check(&auth, &[("authorization", "Bearer sk-alicf")]),
        Err(GatewayError::InvalidApiKey)
    );
    assert_eq!(
        check(&auth, &[("authorization", "Basic sk-alice")]),
        Err(GatewayError::MissingApiKey)
    );
    let e = GatewayError::InvalidApiKey.into_response();
    assert_eq!(e.status(), http::StatusCode::UNAUTHORIZED);
}

#[test]
fn priority_header_lowers_but_never_raises() {
    let auth = Auth::new(store(vec![
        tenant("alice", "sk-alice", Class::Interactive),
        tenant("bob", "sk-bob", Class::Batch),
    ]));
    let a = check(
        &auth,
        &[
            ("authorization", "Bearer sk-alice"),
            (PRIORITY_HEADER, "batch"),
        ],
    )
    .expect("alice");
    assert_eq!(a.class, Class::Batch);
    let b = check(
        &auth,
        &[
            ("authorization", "Bearer sk-bob"),
            (PRIORITY_HEADER, "interactive"),
        ],
    )
    .expect("bob");
    assert_eq!(b.class, Class::Batch, "a batch key cannot raise itself");
    let a = check(
        &auth,
        &[
            ("authorization", "Bearer sk-alice"),
            (PRIORITY_HEADER, "urgent!!"),
        ],
    )
    .expect("alice");
    assert_eq!(
        a.class,
        Class::Interactive,
        "an unknown class changes nothing"
    );
}

#[test]
fn a_reload_changes_the_keys_at_once() {
    let store = store(vec![tenant("alice", "sk-alice", Class::Interactive)]);
    let auth = Auth::new(store.clone());
    assert!(check(&auth, &[("x-api-key", "sk-carol")]).is_err());
    let mut next = LoadedPolicy::defaults();
    next.policy.tenants = vec![tenant("carol", "sk-carol", Class::Interactive)];
    store.replace(next);
    assert_eq!(
        check(&auth, &[("x-api-key", "sk-carol")])
            .expect("carol")
            .name(),
        "carol"
    );
    assert!(check(&auth, &[("x-api-key", "sk-alice")]).is_err());
}
