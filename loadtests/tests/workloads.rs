//! Every workload and scenario against the scripted fake server, through the library.
//! Timing assertions are lower bounds the fake guarantees (its sleeps never end early) or
//! exact schedules; nothing depends on how fast a loaded machine runs.

#![allow(clippy::unwrap_used)] // test scaffolding: a broken fake should fail loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    alternating, mixed, shed_every_other, Fake, Kind, Numbered, FIRST_CONTENT, KEY, MODEL,
};
use sluice_loadtests::client::{ClientOptions, Endpoint};
use sluice_loadtests::measure::measure;
use sluice_loadtests::report::Entry;
use sluice_loadtests::scenario::{JobContext, Row, RowKind};
use sluice_loadtests::workload::{Arrivals, Bound, Target, Workload};

fn target_with(url: &str, opts: &ClientOptions) -> Target {
    Target {
        endpoint: Arc::new(Endpoint::parse(url, opts).unwrap()),
        timeout: Duration::from_secs(20),
        retries: 0,
    }
}

fn target(fake: &Fake) -> Target {
    let opts = ClientOptions {
        api_key: Some(KEY.into()),
        ..ClientOptions::default()
    };
    target_with(&fake.url(), &opts)
}

fn ctx() -> JobContext {
    JobContext {
        prompts: Arc::new(Numbered),
        model: MODEL.into(),
        seed: 11,
    }
}

fn row(
    kind: RowKind,
    workload: Workload,
    requests: Option<usize>,
    duration: Option<Duration>,
) -> Row {
    Row {
        id: "t".into(),
        title: "test".into(),
        series: "s".into(),
        kind,
        workload,
        bound: Bound { requests, duration },
    }
}

fn shape(s: &str) -> RowKind {
    RowKind::Shape(s.parse().unwrap())
}

fn closed(c: usize) -> Workload {
    Workload::Closed { concurrency: c }
}

async fn run(fake: &Fake, row: &Row) -> Entry {
    measure(row, "fake", &target(fake), &ctx(), 0, false)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_refused_request_is_sent_again_after_its_retry_after_when_retries_allow() {
    // Without retries the refusals are outcomes.
    let fake = Fake::start(shed_every_other).await;
    let e = run(&fake, &row(shape("16:5"), closed(1), Some(3), None)).await;
    assert_eq!(
        (e.stats.total, e.stats.succeeded, e.stats.retried),
        (3, 1, 0)
    );
    assert_eq!(e.stats.outcomes["http_503:overloaded"], 2);
    // With one retry each request is refused, waits the 1 s asked, and is served; its times
    // count from the first send.
    let fake = Fake::start(shed_every_other).await;
    let t = Target {
        retries: 1,
        ..target(&fake)
    };
    let e = measure(
        &row(shape("16:5"), closed(1), Some(3), None),
        "fake",
        &t,
        &ctx(),
        0,
        false,
    )
    .await
    .unwrap();
    assert_eq!(fake.arrivals(), 6);
    assert_eq!(
        (e.stats.total, e.stats.succeeded, e.stats.retried),
        (3, 3, 3)
    );
    for r in &e.run.records {
        assert_eq!(r.sample.retries, 1);
        let ttft = r.sample.ttft.unwrap();
        assert!(ttft >= Duration::from_secs(1), "{ttft:?}");
        assert!(r.sample.e2e >= ttft);
    }
    assert!(sluice_loadtests::report::table_row(&e).contains("(3 retried)"));
}

#[tokio::test]
async fn closed_loop_counts_requests_tokens_ttft_and_errors() {
    let fake = Fake::start(mixed).await;
    let e = run(&fake, &row(shape("16:5"), closed(2), Some(8), None)).await;
    assert_eq!(fake.rejected(), Vec::<String>::new());
    let s = &e.stats;
    assert_eq!((s.total, s.succeeded), (8, 4), "{s:?}");
    let outcomes: Vec<(&str, usize)> = s.outcomes.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        outcomes,
        [
            ("http_503:overloaded", 2),
            ("ok", 4),
            ("stream_error:internal_error", 2)
        ]
    );
    assert_eq!(
        s.failure_examples["stream_error:internal_error"],
        "kv cache exhausted"
    );
    assert_eq!(
        s.failure_examples["http_503:overloaded"],
        "the queue is full"
    );
    // Usage (5) where sent, else the 3 content chunks.
    assert_eq!(s.completion_tokens, 2 * 5 + 2 * 3);
    assert_eq!(s.usage_reported, 2);
    assert_eq!(s.prompt_tokens_mean, Some(9.0));
    assert_eq!((s.ttft.count, s.e2e.count), (4, 4));
    assert!(
        s.ttft.p50.unwrap() >= FIRST_CONTENT.as_secs_f64(),
        "{:?}",
        s.ttft
    );
    assert!(s.e2e.p50.unwrap() > s.ttft.p50.unwrap());
    // A closed loop never waits in the client.
    assert_eq!(s.arrival_to_end.p95, s.e2e.p95);
    // Queue headers from the shed (0.5 ms) and the usage-reporting successes (2.5 ms).
    assert_eq!((s.queue.count, s.queue.p95), (4, Some(0.0025)));
    assert!((s.output_tok_per_s() - 16.0 / s.wall.as_secs_f64()).abs() < 1e-9);
    assert_eq!(fake.max_in_flight(), 2);
    assert_eq!(
        fake.distinct_prompts(),
        8,
        "every request has its own prompt"
    );
}

#[tokio::test]
async fn closed_loop_bounded_by_duration_stops_by_itself() {
    let fake = Fake::start(|_| Kind::Ok).await;
    let e = run(
        &fake,
        &row(
            shape("16:5"),
            closed(2),
            None,
            Some(Duration::from_millis(300)),
        ),
    )
    .await;
    let s = &e.stats;
    // Each request takes at least FIRST_CONTENT: at most 2 workers × 300/60 + the last ones.
    assert!(s.total >= 2 && s.total <= 12, "{}", s.total);
    assert_eq!(s.succeeded, s.total);
    assert!(e.stats.wall >= Duration::from_millis(300));
    assert_eq!(fake.arrivals(), s.total);
}

#[tokio::test]
async fn open_loop_keeps_its_schedule_and_measures_client_queueing() {
    let fake = Fake::start(|_| Kind::Ok).await;
    // 20/s with one request in flight, each taking > 60 ms: a client-side queue must grow.
    let open = Workload::Open {
        arrivals: Arrivals::Fixed(20.0),
        concurrency: 1,
    };
    let e = run(&fake, &row(shape("16:5"), open, Some(6), None)).await;
    assert_eq!(e.stats.succeeded, 6);
    assert_eq!(fake.max_in_flight(), 1);
    for (i, r) in e.run.records.iter().enumerate() {
        let due = Duration::from_millis(50 * i as u64);
        assert!(
            r.arrival >= due && r.arrival < due + Duration::from_millis(5),
            "{i}: {r:?}"
        );
        assert!(r.sent >= r.arrival);
    }
    // The last one was sent after 5 earlier ones of >= 60 ms each, but arrived at 250 ms.
    let last = &e.run.records[5];
    assert!(last.sent >= Duration::from_millis(300), "{last:?}");
    let s = &e.stats;
    assert!(
        s.arrival_to_end.p95.unwrap() >= s.e2e.p95.unwrap() + 0.05,
        "{s:?}"
    );
    assert!(s.arrival_to_first.p95.unwrap() > s.ttft.p95.unwrap());

    // The same arrivals with room in the client: requests overlap, nobody waits.
    let fake = Fake::start(|_| Kind::Ok).await;
    let open = Workload::Open {
        arrivals: Arrivals::Fixed(20.0),
        concurrency: 8,
    };
    let e = run(&fake, &row(shape("16:5"), open, Some(6), None)).await;
    assert!(fake.max_in_flight() >= 2);
    assert!(e
        .run
        .records
        .iter()
        .all(|r| r.sent - r.arrival < Duration::from_millis(40)));
}

#[tokio::test]
async fn open_loop_bounded_by_duration_or_count_stops_by_itself() {
    let fake = Fake::start(|_| Kind::Ok).await;
    let fixed = Workload::Open {
        arrivals: Arrivals::Fixed(20.0),
        concurrency: 4,
    };
    // Arrivals at 0, 50, ..., 250 ms fall inside 300 ms.
    let e = run(
        &fake,
        &row(shape("16:5"), fixed, None, Some(Duration::from_millis(300))),
    )
    .await;
    assert_eq!(e.stats.total, 6);
    let poisson = Workload::Open {
        arrivals: Arrivals::Poisson(40.0),
        concurrency: 4,
    };
    let e = run(
        &fake,
        &row(
            shape("16:5"),
            poisson,
            Some(5),
            Some(Duration::from_secs(60)),
        ),
    )
    .await;
    assert_eq!((e.stats.total, e.stats.succeeded), (5, 5));
    assert_eq!(fake.arrivals(), 11);
}

#[tokio::test]
async fn repeated_input_sends_one_prompt() {
    let fake = Fake::start(|_| Kind::Ok).await;
    let e = run(
        &fake,
        &row(
            RowKind::Repeat("12k".parse().unwrap()),
            closed(1),
            Some(3),
            None,
        ),
    )
    .await;
    assert_eq!(e.stats.succeeded, 3);
    assert_eq!((fake.prompts().len(), fake.distinct_prompts()), (3, 1));
    assert!(fake.prompts()[0].contains("12000 tokens"));
}

#[tokio::test]
async fn needles_are_scored_by_depth() {
    let fake = Fake::start(alternating).await;
    let kind = RowKind::Needle {
        haystack: 4000,
        depths: vec![0.1, 0.9],
    };
    let e = run(&fake, &row(kind, closed(1), Some(4), None)).await;
    assert_eq!(fake.rejected(), Vec::<String>::new());
    let s = &e.stats;
    assert_eq!(s.succeeded, 4);
    // Requests 0 and 2 (10%) answered the code; 1 and 3 (90%) did not.
    assert_eq!(s.score.map(|sc| (sc.passed, sc.checked)), Some((2, 4)));
    let by_kind: Vec<(&str, usize, usize)> = s
        .score_by_kind
        .iter()
        .map(|(k, sc)| (k.as_str(), sc.passed, sc.checked))
        .collect();
    assert_eq!(by_kind, [("needle@10%", 2, 2), ("needle@90%", 0, 2)]);
}

#[tokio::test]
async fn tool_calls_must_parse() {
    let fake = Fake::start(alternating).await;
    let e = run(
        &fake,
        &row(
            RowKind::Tools {
                context: 1000,
                constrained: true,
            },
            closed(2),
            Some(4),
            None,
        ),
    )
    .await;
    assert_eq!(fake.rejected(), Vec::<String>::new());
    let s = &e.stats;
    assert_eq!(s.succeeded, 4);
    assert_eq!(s.score.map(|sc| (sc.passed, sc.checked)), Some((2, 4)));
    // A tool call is the first token.
    assert_eq!(s.ttft.count, 4);
}

#[tokio::test]
async fn the_soak_mixes_shapes_until_its_time_is_up() {
    let fake = Fake::start(|_| Kind::Ok).await;
    let soak = Workload::Open {
        arrivals: Arrivals::Poisson(50.0),
        concurrency: 8,
    };
    let e = run(
        &fake,
        &row(RowKind::Soak, soak, None, Some(Duration::from_millis(800))),
    )
    .await;
    let s = &e.stats;
    // ~40 arrivals expected; a Poisson count below 15 or above 80 is astronomically rare.
    assert!((15..=80).contains(&s.total), "{}", s.total);
    assert_eq!(s.succeeded, s.total);
    let mut kinds: Vec<&str> = e.run.records.iter().map(|r| r.kind.as_str()).collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds, ["1k:256", "256:128", "4k"]);
    assert_eq!(fake.distinct_prompts(), s.total);
}

#[tokio::test]
async fn timeouts_and_refused_connections_are_failures() {
    let fake = Fake::start(|_| Kind::Hang).await;
    let mut t = target(&fake);
    t.timeout = Duration::from_millis(300);
    let r = row(shape("16:5"), closed(2), Some(2), None);
    let e = measure(&r, "fake", &t, &ctx(), 0, false).await.unwrap();
    assert_eq!(e.stats.succeeded, 0);
    assert_eq!(e.stats.outcomes["timeout"], 2);

    // A port nobody listens on.
    let closed_port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed_port.local_addr().unwrap());
    drop(closed_port);
    let t = target_with(&url, &ClientOptions::default());
    let e = measure(&r, "none", &t, &ctx(), 0, false).await.unwrap();
    assert_eq!(e.stats.outcomes["transport_error"], 2);
}

#[tokio::test]
async fn https_with_a_ca_file_or_insecure_and_not_otherwise() {
    let (fake, ca) = Fake::start_tls(|_| Kind::Ok).await;
    let r = row(shape("16:5"), closed(1), Some(2), None);
    let with = |ca: Option<std::path::PathBuf>, insecure| ClientOptions {
        api_key: Some(KEY.into()),
        ca,
        insecure,
    };
    for opts in [with(Some(ca.clone()), false), with(None, true)] {
        let t = target_with(&fake.url(), &opts);
        let e = measure(&r, "tls", &t, &ctx(), 0, false).await.unwrap();
        assert_eq!(
            e.stats.succeeded, 2,
            "{opts:?}: {:?}",
            e.stats.failure_examples
        );
    }
    // The system's CAs do not know this certificate.
    if let Ok(opts) = std::panic::catch_unwind(|| target_with(&fake.url(), &with(None, false))) {
        let e = measure(&r, "tls", &opts, &ctx(), 0, false).await.unwrap();
        assert_eq!(e.stats.outcomes["transport_error"], 2);
        assert!(e.stats.failure_examples["transport_error"].contains("TLS"));
    }
    std::fs::remove_file(ca).unwrap();
}
