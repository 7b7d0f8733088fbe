//! The scripts and the arrival against a real `redis-server` (skipped without one, unless
//! `SLUICE_REQUIRE_REDIS=1`).

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::keys::{self, Keys};
use super::scripts::ARRIVE;
use super::testing::RealRedis;
use super::*;
use crate::error::GatewayError;
use crate::middleware::admission::{Admission, Limits};
use crate::policy::Class;

/// One charge of `needed` tokens against `budget` a `window`, alone in the arrival's script:
/// its verdict (0 charged, 2 refused) and the wait it names.
async fn charge(
    conn: &mut MultiplexedConnection,
    keys: &[String; 3],
    id: &str,
    budget: u64,
    needed: u64,
    window: Duration,
) -> (u8, u64) {
    let mut call = ARRIVE.prepare_invoke();
    call.arg("b");
    for k in keys {
        call.key(k);
    }
    call.arg(id)
        .arg(budget)
        .arg(needed)
        .arg(window.as_millis() as u64);
    let (verdict, wait, _): (u8, u64, u8) = call.invoke_async(conn).await.expect("arrive");
    (verdict, wait)
}

async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

#[tokio::test]
async fn a_tenant_refused_until_its_charges_expire_is_charged_again_after() {
    let Some(redis) = RealRedis::start().await else {
        return;
    };
    let mut conn = redis.connection().await;
    let keys = Keys::new("window").budget("frank");
    let window = Duration::from_secs(1);
    // The whole budget at t = 0; a refusal at 300 ms (which set the sum's TTL afresh).
    assert_eq!(charge(&mut conn, &keys, "a", 100, 100, window).await.0, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (verdict, wait) = charge(&mut conn, &keys, "b", 100, 50, window).await;
    assert_eq!(verdict, 2, "over the budget");
    assert!(wait <= 1000, "{wait} ms");
    // The refusal keeps the three keys together: none outlives the others.
    let ttls = [
        pttl(&mut conn, &keys[0]).await,
        pttl(&mut conn, &keys[1]).await,
        pttl(&mut conn, &keys[2]).await,
    ];
    assert!(
        ttls.iter().max().expect("3") - ttls.iter().min().expect("3") < 50,
        "the charges, their tokens and their sum expire together: {ttls:?}"
    );
    // Past the keys' TTL (two windows after the charge): the charge is long out of the window,
    // and a tenant retrying as told is charged.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let (verdict, wait) = charge(&mut conn, &keys, "c", 100, 50, window).await;
    assert_eq!(
        (verdict, wait),
        (0, 0),
        "a stale sum of expired charges refused the tenant"
    );
    let used: Option<String> = redis::cmd("GET")
        .arg(&keys[2])
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(used.as_deref(), Some("50"));
}

/// The leases held under `shared`'s ceiling, the charges' tokens and their sum for `tenant`,
/// read in one transaction (never between an arrival's charge and its lease).
async fn holdings(
    conn: &mut MultiplexedConnection,
    shared: &Shared,
    tenant: &str,
) -> (usize, Vec<String>, Option<String>) {
    let c = shared.ceiling.as_ref().expect("a shared ceiling");
    let keys = shared.keys.budget(tenant);
    redis::pipe()
        .atomic()
        .cmd("ZCARD")
        .arg(&c.leases)
        .cmd("HVALS")
        .arg(&keys[1])
        .cmd("GET")
        .arg(&keys[2])
        .query_async(conn)
        .await
        .expect("ZCARD, HVALS, GET")
}

/// The shared state on `redis` under `prefix`, connected, its arrivals trying for the lease
/// (an admission with free slots).
async fn connected(redis: &RealRedis, prefix: &str) -> (Arc<Shared>, Arc<Admission>) {
    let p = redis.policy(prefix);
    let shared = Shared::start(&p).expect("valid").expect("on");
    assert!(shared.wait_up(Duration::from_secs(5)).await, "connected");
    assert_eq!(
        shared.ceiling.as_ref().map(|c| c.leases.clone()),
        Some(
            Keys::new(prefix)
                .ceiling(&keys::upstream_id(&p.upstream.urls))
                .leases
        )
    );
    // The arrival's script loaded (by an arrival that takes nothing lasting): an `EVALSHA`
    // left unanswered is never followed by its `EVAL`.
    let warm = Ask {
        tenant: "warm",
        rate: Some(Rate::new(1000.0, 100)),
        tokens: None,
        class: Class::Interactive,
    };
    assert!(matches!(shared.arrive(&warm).await, Ok(Ok(_))));
    let admission = Admission::new(Limits::from(&p.admission));
    shared.watch_admission(&admission);
    (shared, admission)
}

#[tokio::test]
async fn an_arrival_abandoned_while_redis_runs_its_script_leaves_nothing_taken() {
    let Some(redis) = RealRedis::start().await else {
        return;
    };
    let (shared, _admission) = connected(&redis, "abandon").await;
    let mut look = redis.connection().await;
    // Redis holds every command for 400 ms: the arrival's script is sent, not yet run.
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(400)
        .arg("ALL")
        .query_async(&mut redis.connection().await)
        .await
        .expect("CLIENT PAUSE");
    let s = shared.clone();
    let arriving = tokio::spawn(async move {
        let ask = Ask {
            tenant: "erin",
            rate: None,
            tokens: Some((1000, 500)),
            class: Class::Interactive,
        };
        s.arrive(&ask).await.map(|r| r.is_ok())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The client goes away while the script waits to run.
    arriving.abort();
    assert!(arriving.await.is_err(), "aborted");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut held = holdings(&mut look, &shared, "erin").await;
    while std::time::Instant::now() < deadline && held != (0, vec!["0".into()], Some("0".into())) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = holdings(&mut look, &shared, "erin").await;
    }
    // The script ran (its charge is there) and what it took went back: no lease, 0 tokens.
    assert_eq!(
        held,
        (0, vec!["0".into()], Some("0".into())),
        "(leases, the charge's tokens, the budget's sum) after an abandoned arrival"
    );
    assert!(shared.health().is_up());
}

#[tokio::test]
async fn a_request_that_must_wait_for_its_local_slot_holds_no_shared_one() {
    use tower::{Layer, ServiceExt};
    let Some(redis) = RealRedis::start().await else {
        return;
    };
    let (shared, admission) = connected(&redis, "queued").await;
    let mut look = redis.connection().await;
    // Budget → (every local slot taken, between the arrival's look at admission and its turn
    // there) → admission → an upstream that never answers: the request waits in the queue.
    let upstream = tower::service_fn(|_req: http::Request<()>| {
        std::future::pending::<Result<http::Response<crate::body::GatewayBody>, GatewayError>>()
    });
    let admit =
        crate::middleware::admission::AdmissionLayer::new(admission.clone(), Default::default())
            .layer(upstream);
    let taken = Arc::new(Mutex::new(Vec::new()));
    let fill = {
        let (admission, taken) = (admission.clone(), taken.clone());
        tower::service_fn(move |req: http::Request<()>| {
            fill_then(admission.clone(), taken.clone(), admit.clone(), req)
        })
    };
    let stage = crate::middleware::budget::Budget::new(Some(shared.clone()));
    let svc = crate::middleware::around::AroundLayer::new(stage).layer(fill);
    let tenant = crate::policy::Tenant {
        name: "gwen".into(),
        api_key_sha256: "0".repeat(64),
        class: Class::Interactive,
        requests_per_second: None,
        burst: 1,
        tokens_per_minute: Some(1000),
    };
    let mut req = http::Request::new(());
    req.extensions_mut()
        .insert(crate::middleware::auth::Caller {
            tenant: Some(Arc::new(tenant)),
            class: Class::Interactive,
        });
    req.extensions_mut()
        .insert(crate::middleware::count::PromptTokens(10));
    req.extensions_mut()
        .insert(crate::middleware::cap::MaxTokens(0));
    let waiting = tokio::spawn(svc.oneshot(req));
    // Charged, and the lease its arrival took given back while it waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut held = holdings(&mut look, &shared, "gwen").await;
    while std::time::Instant::now() < deadline && held != (0, vec!["10".into()], Some("10".into()))
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = holdings(&mut look, &shared, "gwen").await;
    }
    assert_eq!(
        admission.snapshot().queued_interactive,
        1,
        "it waits locally"
    );
    assert_eq!(
        held,
        (0, vec!["10".into()], Some("10".into())),
        "(leases, the charge's tokens, the budget's sum) while the request waits locally"
    );
    assert_eq!(shared.report().leases, 0);
    waiting.abort();
}

/// Takes every free slot of `admission` (into `taken`), then sends `req` through `admit`.
fn fill_then<S>(
    admission: Arc<Admission>,
    taken: Arc<Mutex<Vec<crate::middleware::admission::Admitted>>>,
    admit: S,
    req: http::Request<()>,
) -> crate::BoxFuture<Result<http::Response<crate::body::GatewayBody>, GatewayError>>
where
    S: tower::Service<
            http::Request<()>,
            Response = http::Response<crate::body::GatewayBody>,
            Error = GatewayError,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    use tower::ServiceExt;
    Box::pin(async move {
        while admission.snapshot().active < admission.snapshot().active_max {
            let ticket = crate::middleware::admission::Ticket {
                class: Class::Interactive,
                prompt_tokens: 1,
                tenant: Arc::from("other"),
                max_tokens: 1,
                deadline: None,
                stream: false,
            };
            let a = crate::middleware::admission::acquire(admission.clone(), ticket)
                .await
                .expect("a free slot");
            taken.lock().expect("lock").push(a);
        }
        admit.oneshot(req).await
    })
}
