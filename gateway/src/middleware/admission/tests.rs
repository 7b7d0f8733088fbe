//! Admission: the queue's rules with paused time, and the layer over a `tower_test` mock.

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};
use tower_test::mock;

use super::*;
use crate::body::{self, GatewayBody};
use crate::error::GatewayError;
use crate::middleware::auth::Caller;
use crate::middleware::count::PromptTokens;
use crate::policy::Class;

/// The count-based rules alone (prediction off, a budget no prompt here reaches).
fn limits(active_max: usize, queue_depth: usize) -> Limits {
    Limits {
        active_max,
        queue_depth,
        predictive: false,
        prefill_tokens_max: 1 << 20,
        ..Limits::from(&crate::policy::Admission::default())
    }
}

fn interactive(tokens: usize) -> Ticket {
    Ticket::new(Class::Interactive, tokens)
}

fn batch() -> Ticket {
    Ticket::new(Class::Batch, 10)
}

/// Starts `acquire` on a task; its result arrives on the returned channel.
fn spawn_acquire(
    admission: &Arc<Admission>,
    ticket: Ticket,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::UnboundedReceiver<Result<Admitted, GatewayError>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let admission = admission.clone();
    let task = tokio::spawn(async move {
        let _ = tx.send(acquire(admission, ticket).await);
        // Keep the permit alive until the test drops the receiver's message.
    });
    (task, rx)
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn fifth_request_waits_for_a_slot_and_gets_the_first_one_freed() {
    let adm = Admission::new(limits(4, 16));
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(acquire(adm.clone(), interactive(10)).await.expect("slot"));
    }
    let (_t5, mut rx5) = spawn_acquire(&adm, interactive(10));
    let (_t6, mut rx6) = spawn_acquire(&adm, interactive(10));
    settle().await;
    assert!(rx5.try_recv().is_err(), "the 5th must wait");
    assert_eq!(adm.snapshot().queued_interactive, 2);
    tokio::time::advance(Duration::from_millis(1500)).await;
    held.pop();
    settle().await;
    let fifth = rx5.try_recv().expect("granted").expect("a slot");
    assert_eq!(fifth.queued, Duration::from_millis(1500));
    assert!(rx6.try_recv().is_err(), "FIFO: the 6th still waits");
    assert_eq!(adm.snapshot().active, 4);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_at_once_with_retry_after() {
    let adm = Admission::new(limits(1, 2));
    let _held = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let (_a, _ra) = spawn_acquire(&adm, interactive(10));
    let (_b, _rb) = spawn_acquire(&adm, interactive(10));
    settle().await;
    let err = acquire(adm.clone(), interactive(10))
        .await
        .expect_err("shed");
    match err {
        GatewayError::Overloaded { retry_after, class } => {
            assert_eq!(class, Class::Interactive);
            assert!(retry_after >= Duration::from_secs(1));
        }
        other => panic!("expected overloaded, got {other:?}"),
    }
    assert_eq!(adm.snapshot().queued_interactive, 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_follows_the_drain_rate() {
    let adm = Admission::new(limits(1, 1));
    // Ten requests finish one every 2 s: the queue drains at 0.5/s.
    for _ in 0..10 {
        let p = acquire(adm.clone(), interactive(10)).await.expect("slot");
        tokio::time::advance(Duration::from_secs(2)).await;
        drop(p);
    }
    let _held = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let (_a, _ra) = spawn_acquire(&adm, interactive(10));
    settle().await;
    let Err(GatewayError::Overloaded { retry_after, .. }) =
        acquire(adm.clone(), interactive(10)).await
    else {
        panic!("expected overloaded");
    };
    // Two ahead (the waiter and this one) at ~0.5/s: about 4 s.
    assert!(
        (3..=5).contains(&retry_after.as_secs()),
        "retry after {retry_after:?}"
    );
    // Shed right after it, the next ones are told to come back a departure (~2 s) later each.
    let mut told = vec![retry_after];
    for _ in 0..2 {
        let Err(GatewayError::Overloaded { retry_after, .. }) =
            acquire(adm.clone(), interactive(10)).await
        else {
            panic!("expected overloaded");
        };
        told.push(retry_after);
    }
    for pair in told.windows(2) {
        let step = (pair[1] - pair[0]).as_secs_f64();
        assert!((1.5..=2.5).contains(&step), "{told:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_past_queue_wait_max_times_out_and_leaves_the_queue() {
    let mut l = limits(1, 4);
    l.queue_wait_max = Duration::from_secs(60);
    let adm = Admission::new(l);
    let _held = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let started = tokio::time::Instant::now();
    let err = acquire(adm.clone(), interactive(10))
        .await
        .expect_err("timeout");
    assert_eq!(
        err,
        GatewayError::QueueTimeout {
            waited: Duration::from_secs(60)
        }
    );
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert_eq!(adm.snapshot().queued_interactive, 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_the_queue_and_frees_nothing_twice() {
    let adm = Admission::new(limits(1, 4));
    let held = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let (t, _rx) = spawn_acquire(&adm, interactive(10));
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 1);
    t.abort();
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 0);
    drop(held);
    assert_eq!(adm.snapshot().active, 0);
    // The freed slot goes to the next arrival, not to the cancelled waiter.
    let _again = acquire(adm.clone(), interactive(10)).await.expect("slot");
    assert_eq!(adm.snapshot().active, 1);
}

#[tokio::test(start_paused = true)]
async fn batch_never_takes_the_last_slot_and_is_shed_first() {
    let adm = Admission::new(limits(2, 1));
    let _b1 = acquire(adm.clone(), batch()).await.expect("first slot");
    // The second (last) slot is not for batch: it queues.
    let (_t, mut batch_rx) = spawn_acquire(&adm, batch());
    settle().await;
    assert_eq!(adm.snapshot().queued_batch, 1);
    // Interactive takes the last slot at once.
    let _i1 = acquire(adm.clone(), interactive(10))
        .await
        .expect("last slot");
    // The queue (depth 1) is full of batch: an interactive arrival evicts it.
    let (_ti, mut int_rx) = spawn_acquire(&adm, interactive(10));
    settle().await;
    match batch_rx.try_recv().expect("answered") {
        Err(GatewayError::Overloaded { class, .. }) => assert_eq!(class, Class::Batch),
        other => panic!("expected the batch waiter shed, got {other:?}"),
    }
    assert!(int_rx.try_recv().is_err(), "the interactive request waits");
    assert_eq!(adm.snapshot().queued_interactive, 1);
    // A batch arrival at a full queue is shed itself.
    assert!(matches!(
        acquire(adm.clone(), batch()).await,
        Err(GatewayError::Overloaded {
            class: Class::Batch,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn with_one_slot_batch_runs_only_when_no_interactive_waits() {
    let adm = Admission::new(limits(1, 4));
    let held = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let (_tb, mut rb) = spawn_acquire(&adm, batch());
    let (_ti, mut ri) = spawn_acquire(&adm, interactive(10));
    settle().await;
    drop(held);
    settle().await;
    let first = ri.try_recv().expect("interactive first").expect("slot");
    assert!(rb.try_recv().is_err());
    drop(first);
    settle().await;
    assert!(rb.try_recv().expect("then batch").is_ok());
}

#[tokio::test(start_paused = true)]
async fn heavy_prompts_share_one_lane_and_light_ones_pass_them() {
    let adm = Admission::new(limits(4, 8));
    let heavy1 = acquire(adm.clone(), interactive(5000)).await.expect("slot");
    assert!(heavy1.permit.is_heavy());
    let (_th, mut rh) = spawn_acquire(&adm, interactive(5000));
    settle().await;
    assert!(rh.try_recv().is_err(), "the second heavy request waits");
    // A light request behind it is not blocked.
    let light = acquire(adm.clone(), interactive(100)).await.expect("slot");
    assert!(!light.permit.is_heavy());
    assert_eq!(adm.snapshot().heavy_active, 1);
    drop(heavy1);
    settle().await;
    let _heavy2 = rh.try_recv().expect("granted").expect("a slot");
    assert_eq!(adm.snapshot().heavy_active, 1);
    // Exactly at the threshold is not heavy.
    let edge = acquire(adm.clone(), interactive(4096)).await.expect("slot");
    assert!(!edge.permit.is_heavy());
}

#[tokio::test(start_paused = true)]
async fn new_limits_apply_without_killing_running_requests() {
    let adm = Admission::new(limits(4, 8));
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(acquire(adm.clone(), interactive(10)).await.expect("slot"));
    }
    let mut waiting = Vec::new();
    for _ in 0..4 {
        waiting.push(spawn_acquire(&adm, interactive(10)));
    }
    settle().await;
    // Down to 2: all four keep running; nothing new is admitted until the count falls.
    adm.set_limits(limits(2, 8));
    assert_eq!(adm.snapshot().active, 4);
    held.truncate(2);
    settle().await;
    assert_eq!(
        adm.snapshot().active,
        2,
        "no admission above the new ceiling"
    );
    assert_eq!(adm.snapshot().queued_interactive, 4);
    // Up to 5: three waiters are admitted at once.
    adm.set_limits(limits(5, 8));
    settle().await;
    assert_eq!(adm.snapshot().active, 5);
    assert_eq!(adm.snapshot().queued_interactive, 1);
    // A queue shrunk to 0 sheds the remaining (newest) waiter.
    adm.set_limits(limits(5, 0));
    settle().await;
    let shed = waiting
        .iter_mut()
        .filter_map(|(_, rx)| rx.try_recv().ok())
        .filter(|r| matches!(r, Err(GatewayError::Overloaded { .. })))
        .count();
    assert_eq!(shed, 1);
    assert_eq!(adm.snapshot().queued_interactive, 0);
}

fn of_tenant(tenant: &str) -> Ticket {
    Ticket {
        tenant: Arc::from(tenant),
        ..interactive(10)
    }
}

#[tokio::test(start_paused = true)]
async fn a_tenant_back_in_an_idle_class_banks_no_credit() {
    let adm = Admission::new(limits(1, 16));
    // "a" is served ~1e5 weighted tokens alone, then everyone is idle for a minute.
    let a = acquire(adm.clone(), of_tenant("a")).await.expect("slot");
    a.permit.tokens(100_000);
    drop(a);
    tokio::time::advance(Duration::from_secs(60)).await;
    // "c" comes into the idle class: it starts at the floor the class left off at, not at 0.
    let mut held = acquire(adm.clone(), of_tenant("c")).await.expect("slot");
    let (_ta, mut ra) = spawn_acquire(&adm, of_tenant("a"));
    settle().await;
    for _round in 0..2 {
        // "c" always keeps one request queued beside "a"'s.
        let (_tc, mut rc) = spawn_acquire(&adm, of_tenant("c"));
        settle().await;
        drop(held);
        settle().await;
        if let Ok(granted) = ra.try_recv() {
            granted.expect("a's slot");
            return;
        }
        held = rc.try_recv().expect("c granted").expect("c's slot");
    }
    panic!("\"a\" was passed over twice by \"c\", which had idled as long");
}

#[tokio::test(start_paused = true)]
async fn a_reload_that_shortens_queue_wait_max_applies_to_waiters() {
    let mut l = limits(1, 16);
    l.queue_wait_max = Duration::from_secs(60);
    let adm = Admission::new(l.clone());
    let _held = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let (_t, mut rx) = spawn_acquire(&adm, interactive(10));
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 1);
    l.queue_wait_max = Duration::from_secs(1);
    adm.set_limits(l);
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    match rx.try_recv() {
        Ok(Err(GatewayError::QueueTimeout { waited })) => {
            assert!(waited <= Duration::from_secs(2), "waited {waited:?}")
        }
        other => panic!("expected queue_timeout under the new limit, got {other:?}"),
    }
    assert_eq!(adm.snapshot().queued_interactive, 0);
}

// ---- the layer over a mock upstream ----

type Mock = mock::Mock<Request<()>, Response<GatewayBody>>;
type Handle = mock::Handle<Request<()>, Response<GatewayBody>>;

type Layered = Shed<Admit<tower::util::MapErr<Mock, fn(crate::body::BoxError) -> GatewayError>>>;

fn upstream_error(e: crate::body::BoxError) -> GatewayError {
    GatewayError::Upstream(e.to_string())
}

/// The admission layer over a mock whose errors are mapped into `GatewayError`.
fn layered(adm: &Arc<Admission>) -> (Layered, Handle) {
    let (mock, handle): (Mock, Handle) = mock::pair();
    let f: fn(crate::body::BoxError) -> GatewayError = upstream_error;
    let inner = tower::util::MapErr::new(mock, f);
    (
        AdmissionLayer::new(adm.clone(), Default::default()).layer(inner),
        handle,
    )
}

fn request() -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut().insert(Caller {
        tenant: None,
        class: Class::Interactive,
    });
    req.extensions_mut().insert(PromptTokens(10));
    req
}

/// A streaming body the test controls.
fn channel_body() -> (
    http_body_util::channel::Sender<bytes::Bytes, crate::body::BoxError>,
    GatewayBody,
) {
    let (tx, body) = http_body_util::channel::Channel::new(4);
    (tx, body.boxed_unsync())
}

#[tokio::test(start_paused = true)]
async fn the_slot_is_held_until_the_body_ends_not_the_headers() {
    let adm = Admission::new(limits(1, 4));
    let (svc, mut handle) = layered(&adm);
    let first = tokio::spawn(svc.clone().oneshot(request()));
    let (_req, send) = handle
        .next_request()
        .await
        .expect("first reaches the upstream");
    let (mut tx, body) = channel_body();
    send.send_response(Response::new(body));
    let resp = first.await.expect("task").expect("response");
    assert_eq!(resp.headers()["x-sluice-queue-ms"], "0");
    // Headers are out, the body is still streaming: the slot is still held.
    assert_eq!(adm.snapshot().active, 1);
    let second = tokio::spawn(svc.clone().oneshot(request()));
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(10), handle.next_request())
            .await
            .is_err(),
        "the second request must not reach the upstream yet"
    );
    // The body ends: the slot frees and the second request goes upstream.
    tx.send_data("data: [DONE]\n\n".into()).await.expect("send");
    drop(tx);
    let collected = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&collected[..], b"data: [DONE]\n\n");
    tokio::time::advance(Duration::from_millis(250)).await;
    let (_req, send) = handle
        .next_request()
        .await
        .expect("second reaches the upstream");
    send.send_response(Response::new(body::full("{}")));
    let resp = second.await.expect("task").expect("response");
    assert_eq!(resp.headers()["x-sluice-queue-ms"], "260");
}

#[tokio::test(start_paused = true)]
async fn the_stages_below_admission_can_mark_the_upstream_start() {
    let adm = Admission::new(limits(1, 4));
    let (svc, mut handle) = layered(&adm);
    let first = tokio::spawn(svc.clone().oneshot(request()));
    let (req, send) = handle.next_request().await.expect("upstream");
    let mark = req
        .extensions()
        .get::<UpstreamStart>()
        .cloned()
        .expect("the admission service adds the handle");
    mark.mark();
    send.send_response(Response::new(body::full("{}")));
    let resp = first.await.expect("task").expect("response");
    drop(resp);
    assert_eq!(adm.snapshot().active, 0);
    // The flight is gone: a late mark does nothing.
    mark.mark();
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_mid_stream_frees_the_slot() {
    let adm = Admission::new(limits(1, 4));
    let (svc, mut handle) = layered(&adm);
    let first = tokio::spawn(svc.clone().oneshot(request()));
    let (_req, send) = handle.next_request().await.expect("upstream");
    let (_tx, body) = channel_body();
    send.send_response(Response::new(body));
    let resp = first.await.expect("task").expect("response");
    assert_eq!(adm.snapshot().active, 1);
    drop(resp); // the client disconnected: hyper drops the body
    assert_eq!(adm.snapshot().active, 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_is_shed_through_poll_ready() {
    let adm = Admission::new(limits(1, 1));
    let (svc, mut handle) = layered(&adm);
    handle.allow(10);
    let _running = tokio::spawn(svc.clone().oneshot(request()));
    let _queued = tokio::spawn(svc.clone().oneshot(request()));
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 1);
    // Not ready: the admission service parks, and the shed wrapper answers at once.
    let mut admit = Admit::new(
        tower::service_fn(|_: Request<()>| async {
            Ok::<_, GatewayError>(Response::new(body::full("")))
        }),
        adm.clone(),
        Default::default(),
    );
    let waker = futures_noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(admit.poll_ready(&mut cx).is_pending());
    let started = tokio::time::Instant::now();
    let err = svc.clone().oneshot(request()).await.expect_err("shed");
    assert!(matches!(err, GatewayError::Overloaded { .. }));
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn shed_requests_leave_no_wakers_behind_and_a_parked_poll_is_woken() {
    let adm = Admission::new(limits(1, 1));
    let (svc, mut handle) = layered(&adm);
    handle.allow(100);
    let _running = tokio::spawn(svc.clone().oneshot(request()));
    let queued = tokio::spawn(svc.clone().oneshot(request()));
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 1);
    // Each shed request's task polled readiness with its own waker: nothing parks, nothing
    // is kept.
    let shed: Vec<_> = (0..50)
        .map(|_| tokio::spawn(svc.clone().oneshot(request())))
        .collect();
    for t in shed {
        let r = t.await.expect("task");
        assert!(matches!(r, Err(GatewayError::Overloaded { .. })), "{r:?}");
    }
    assert_eq!(adm.ready_wakers(), 0);
    // The admission service alone still keeps tower's contract: a Pending poll_ready is woken
    // when the queue changes.
    struct Flag(std::sync::atomic::AtomicBool);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let flag = Arc::new(Flag(false.into()));
    let waker = std::task::Waker::from(flag.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut admit = Admit::new(
        tower::service_fn(|_: Request<()>| async {
            Ok::<_, GatewayError>(Response::new(body::full("")))
        }),
        adm.clone(),
        Default::default(),
    );
    assert!(admit.poll_ready(&mut cx).is_pending());
    assert_eq!(adm.ready_wakers(), 1);
    queued.abort();
    settle().await;
    assert!(
        flag.0.load(std::sync::atomic::Ordering::SeqCst),
        "not woken"
    );
    assert!(admit.poll_ready(&mut cx).is_ready());
}

fn futures_noop_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

#[tokio::test(start_paused = true)]
async fn a_wait_whose_client_leaves_is_observed_too() {
    let adm = Admission::new(limits(1, 4));
    let metrics = Arc::new(crate::telemetry::Metrics::default());
    let (mock, mut handle): (Mock, Handle) = mock::pair();
    let f: fn(crate::body::BoxError) -> GatewayError = upstream_error;
    let svc =
        AdmissionLayer::new(adm.clone(), metrics.clone()).layer(tower::util::MapErr::new(mock, f));
    handle.allow(100);
    // The first holds the only slot (its upstream never answers); the second waits 5 s, and
    // its client goes away.
    let _running = tokio::spawn(svc.clone().oneshot(request()));
    settle().await;
    let queued = tokio::spawn(svc.clone().oneshot(request()));
    settle().await;
    assert_eq!(adm.snapshot().queued_interactive, 1);
    tokio::time::advance(Duration::from_secs(5)).await;
    queued.abort();
    settle().await;
    let waits = metrics.queue_wait.snapshot();
    assert_eq!(waits.count, 2, "the grant and the wait its client left");
    assert!((waits.sum - 5.0).abs() < 0.1, "{}", waits.sum);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_its_response_gives_its_slot_back() {
    let adm = Admission::new(limits(1, 4));
    let a = acquire(adm.clone(), interactive(10)).await.expect("slot");
    let (mut tx, rx) =
        http_body_util::channel::Channel::<bytes::Bytes, crate::body::BoxError>::new(4);
    // What a stage inside gave the response to give back (the shared ceiling's lease).
    let lease_back = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = lease_back.clone();
    let also = crate::body::stall::OnStall::new(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let mut body = slot_body(rx.boxed_unsync(), a.permit, Default::default(), Some(also));
    tx.send_data(bytes::Bytes::from_static(b"data: {}\n\n"))
        .await
        .expect("send");
    // The client's connection takes one frame, then no more (its window stays shut).
    body.frame().await.expect("frame").expect("ok");
    tokio::time::sleep(slot::WRITE_STALL - Duration::from_secs(1)).await;
    assert_eq!(adm.snapshot().active, 1, "still read within the bound");
    assert_eq!(lease_back.load(std::sync::atomic::Ordering::SeqCst), 0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(adm.snapshot().active, 0, "the slot is given back");
    assert_eq!(
        lease_back.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "and the lease, by the same watch"
    );
    // The stream itself goes on as it can; its end frees nothing twice.
    drop(tx);
    drop(body);
    assert_eq!(adm.snapshot().active, 0);
}

/// What the stage inside (the shared ceiling's) hands over in the response's extensions runs
/// at the slot's write stall: one watch gives back both, through the layer itself.
#[tokio::test(start_paused = true)]
async fn the_stall_watch_runs_what_the_inner_stage_handed_over() {
    let adm = Admission::new(limits(1, 4));
    let (mut tx, rx) =
        http_body_util::channel::Channel::<bytes::Bytes, crate::body::BoxError>::new(4);
    let body = Arc::new(std::sync::Mutex::new(Some(rx.boxed_unsync())));
    let given_back = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = given_back.clone();
    let inner = tower::service_fn(move |_: Request<()>| {
        let body = body.lock().expect("body").take().expect("one request");
        let counted = counted.clone();
        async move {
            let mut resp = Response::new(body);
            resp.extensions_mut()
                .insert(crate::body::stall::OnStall::new(move || {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }));
            Ok::<_, GatewayError>(resp)
        }
    });
    let admit = Admit::new(inner, adm.clone(), Default::default());
    let resp = admit.oneshot(request()).await.expect("admitted");
    assert!(
        resp.extensions()
            .get::<crate::body::stall::OnStall>()
            .is_none(),
        "taken by the watch"
    );
    let mut body = resp.into_body();
    tx.send_data(bytes::Bytes::from_static(b"data: {}\n\n"))
        .await
        .expect("send");
    body.frame().await.expect("frame").expect("ok");
    tokio::time::sleep(slot::WRITE_STALL + Duration::from_secs(1)).await;
    assert_eq!(adm.snapshot().active, 0, "the slot is given back");
    assert_eq!(
        given_back.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "and what the inner stage handed over"
    );
    drop(tx);
}
