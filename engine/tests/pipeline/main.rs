//! The three-rank pipeline against the real model: ranks as real processes on loopback,
//! driven through the OpenAI API.

mod harness;

use std::io::BufRead;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use harness::*;

const PROMPTS: [&str; 8] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "import numpy as np\n\n# compute the mean of an array\n",
    "The quick brown fox",
    "Q: What is 12 plus 7?\nA:",
    "In 1492, Columbus",
];

/// One three-rank server shared by the tests that only read from it.
fn three_ranks() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| start(&["--ranks", "3", "--threads", "1", "--kv-tokens", "4096"]))
}

#[test]
fn three_ranks_give_the_same_greedy_text_as_one() {
    let one = start(&["--ranks", "1", "--threads", "2", "--kv-tokens", "4096"]);
    let three = three_ranks();
    for p in &PROMPTS[..4] {
        assert_eq!(
            complete(&three.addr, p, 24),
            complete(&one.addr, p, 24),
            "prompt {p:?}"
        );
    }
    let h = health(&three.addr);
    assert_eq!(h["status"], "ok");
    let ranks = h["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 3);
    let layers: Vec<&Value> = ranks.iter().map(|r| &r["layers"]).collect();
    assert_eq!(layers, [&json!([0, 9]), &json!([10, 19]), &json!([20, 29])]);
    for r in ranks {
        assert_eq!(
            r["kv_tokens_total"], 4096,
            "every rank holds the same pool: {h}"
        );
        assert!(r["weight_bytes"].as_u64().expect("bytes") > 0);
    }
}

#[test]
fn eight_concurrent_requests_equal_the_same_requests_one_at_a_time() {
    // Its own server, so that its KV pool is empty at the end.
    let s = &start(&["--ranks", "3", "--threads", "1", "--kv-tokens", "4096"]);
    let alone: Vec<String> = PROMPTS.iter().map(|p| complete(&s.addr, p, 32)).collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let hs: Vec<_> = PROMPTS
            .iter()
            .map(|p| scope.spawn(|| complete(&s.addr, p, 32)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    assert_eq!(together, alone);
    eventually(5, "an empty KV pool after completions", || {
        kv_used(&s.addr) == vec![0, 0, 0]
    });
}

fn kv_used(addr: &str) -> Vec<u64> {
    health(addr)["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["kv_tokens_used"].as_u64().expect("used"))
        .collect()
}

#[test]
fn cancelled_streams_return_their_kv_blocks() {
    // Its own server: the shared one's KV use depends on the tests running beside this one.
    let s = &start(&["--ranks", "3", "--threads", "1", "--kv-tokens", "4096"]);
    let streams: Vec<_> = (0..4)
        .map(|i| {
            open_stream(
                &s.addr,
                &json!({"prompt": PROMPTS[i], "max_tokens": 2000, "ignore_eos": true, "stream": true, "temperature": 0}),
            )
        })
        .collect();
    eventually(5, "KV in use on every rank", || {
        kv_used(&s.addr).iter().all(|&u| u > 0)
    });
    drop(streams);
    eventually(5, "an empty KV pool after cancellations", || {
        kv_used(&s.addr) == vec![0, 0, 0]
    });
    let (_, metrics) = http(&s.addr, "GET", "/metrics", None);
    assert!(metrics.contains("vllm:num_requests_running"), "{metrics}");
}

#[test]
fn an_over_long_request_is_refused_before_any_work() {
    let s = three_ranks();
    let (status, v) = post_json(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 20000}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
}

#[test]
fn the_default_max_tokens_fits_the_kv_pool() {
    // The pool (4096 tokens) is smaller than --context-window (12288): it is the window.
    let s = three_ranks();
    let (status, v) = http(&s.addr, "GET", "/v1/models", None);
    assert_eq!(status, 200, "{v}");
    let v: Value = serde_json::from_str(&v).expect("json");
    assert_eq!(v["data"][0]["max_model_len"], 4096, "{v}");
    // No max_tokens: the default fits what is left of the pool (a one-word grammar keeps the
    // answer short).
    let (status, v) = post_json(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "hello", "structured_outputs": {"choice": ["yes", "no"]}}),
    );
    assert_eq!(status, 200, "{v}");
    // One that does not fit is still refused.
    let (status, v) = post_json(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 4096}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
}

#[test]
fn killing_the_last_rank_fails_in_flight_requests_within_two_seconds() {
    let s = start(&["--ranks", "3", "--threads", "1", "--kv-tokens", "4096"]);
    let mut stream = open_stream(
        &s.addr,
        &json!({"prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": true, "stream": true}),
    );
    let rank2 = children(s.child.id())
        .into_iter()
        .find(|&p| cmdline(p).contains("--rank 2"))
        .expect("rank 2 is a child of serve");
    let killed = Instant::now();
    std::process::Command::new("kill")
        .args(["-9", &rank2.to_string()])
        .status()
        .expect("kill");
    // The stream must end with an explicit error, not just stop.
    let mut saw_error = false;
    let mut line = String::new();
    while stream.read_line(&mut line).unwrap_or(0) > 0 {
        if line.contains("\"error\"") {
            saw_error = true;
        }
        if line.contains("[DONE]") {
            break;
        }
        line.clear();
    }
    let took = killed.elapsed();
    assert!(saw_error, "the stream ended without an error event");
    assert!(took < Duration::from_secs(2), "the error took {took:?}");
    // The control link to rank 2 reports its loss on its own thread: allow it a moment.
    eventually(2, "/health to show rank 2 down", || {
        let h = health(&s.addr);
        h["status"] != "ok" && h["ranks"][2]["up"] == false
    });
    let (status, v) = post_json(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 4}),
    );
    assert_eq!(status, 503, "{v}");
}

/// Rank 1 of 2 started by hand (layers 0-14, 15-29) with a pool of `kv_tokens`; its address.
fn hand_started_rank(secret: (&str, &str), kv_tokens: &str) -> (std::process::Child, String) {
    let mut rank = engine_cmd()
        .args([
            "rank",
            "--rank",
            "1",
            "--ranks",
            "2",
            "--listen",
            "127.0.0.3:0",
            "--layers",
            "0-14,15-29",
            "--kv-tokens",
            kv_tokens,
        ])
        .args(["--model", &model_path().to_string_lossy()])
        .env(secret.0, secret.1)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start rank");
    let mut out = std::io::BufReader::new(rank.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("LISTENING line");
    let addr = line
        .trim()
        .strip_prefix("LISTENING ")
        .expect("address")
        .to_owned();
    (rank, addr)
}

/// Ranks that could hold different pools agree on the smallest: /health and the metrics show
/// one total for every rank, from the first answer on (a rank's status report may come later).
#[test]
fn ranks_agree_on_the_smallest_kv_pool() {
    let secret = ("SLUICE_CLUSTER_SECRET", "pool");
    let (mut rank, addr) = hand_started_rank(secret, "1024");
    let s = try_start(
        &[
            "--ranks",
            "2",
            "--layers",
            "0-14,15-29",
            "--rank-addrs",
            &addr,
            "--kv-tokens",
            "4096",
        ],
        &[secret],
    )
    .expect("rank 0 connects");
    let h = health(&s.addr);
    let totals: Vec<u64> = h["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["kv_tokens_total"].as_u64().expect("total"))
        .collect();
    assert_eq!(totals, vec![1024, 1024], "{h}");
    let bytes: Vec<u64> = h["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| r["kv_bytes"].as_u64().expect("bytes"))
        .collect();
    assert_eq!(bytes[0], bytes[1], "15 layers each: {h}");
    let (_, metrics) = http(&s.addr, "GET", "/metrics", None);
    for rank in ["0", "1"] {
        let line = format!("sluice_engine_kv_tokens_capacity{{rank=\"{rank}\"}} 1024");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    drop(s);
    let _ = rank.kill();
    let _ = rank.wait();
}

#[test]
fn a_rank_with_a_different_layer_split_or_secret_is_refused() {
    let secret = ("SLUICE_CLUSTER_SECRET", "s3cret");
    let (mut rank, addr) = hand_started_rank(secret, "1024");

    let err = try_start(
        &[
            "--ranks",
            "2",
            "--layers",
            "0-9,10-29",
            "--rank-addrs",
            &addr,
            "--kv-tokens",
            "1024",
        ],
        &[secret],
    )
    .err()
    .expect("a mismatched split is refused");
    assert!(err.contains("blocks"), "{err}");
    let err = try_start(
        &[
            "--ranks",
            "2",
            "--layers",
            "0-14,15-29",
            "--rank-addrs",
            &addr,
            "--kv-tokens",
            "1024",
        ],
        &[(secret.0, "wrong")],
    )
    .err()
    .expect("a wrong secret is refused");
    assert!(err.contains("secret"), "{err}");
    // The right split and secret are accepted by the same rank.
    let ok = try_start(
        &[
            "--ranks",
            "2",
            "--layers",
            "0-14,15-29",
            "--rank-addrs",
            &addr,
            "--kv-tokens",
            "1024",
        ],
        &[secret],
    )
    .expect("matching rank 0 connects");
    assert_eq!(health(&ok.addr)["status"], "ok");
    drop(ok);
    let _ = rank.kill();
    let _ = rank.wait();
}

/// `--transport rdma`: where this build or machine has no RDMA, `serve` stops at once with one
/// line naming `--transport tcp`; where it has (a build with `--features rdma` on a host with a
/// device, e.g. Soft-RoCE: docs/transport.md), three ranks over RDMA give TCP's greedy text.
#[test]
fn rdma_runs_where_there_is_a_device_and_says_so_in_one_line_where_not() {
    let started = Instant::now();
    let rdma = try_start(
        &[
            "--ranks",
            "3",
            "--threads",
            "1",
            "--kv-tokens",
            "4096",
            "--transport",
            "rdma",
        ],
        &[],
    );
    match rdma {
        Err(text) => {
            // `try_start` prefixes the exit status; the engine printed one line.
            assert_eq!(text.lines().count(), 1, "{text}");
            let last = text.split_once("sluice-engine: ").map_or("", |(_, l)| l);
            assert!(last.ends_with("--transport tcp works"), "{text}");
            assert!(
                last.contains("no RDMA device") || last.contains("without RDMA support"),
                "{text}"
            );
            assert!(!text.contains("panicked"), "{text}");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "stopped only after {:?}",
                started.elapsed()
            );
            println!("skipped the RDMA run: {last}");
        }
        Ok(rdma) => {
            let tcp = three_ranks();
            for p in &PROMPTS[4..] {
                assert_eq!(
                    complete(&rdma.addr, p, 24),
                    complete(&tcp.addr, p, 24),
                    "prompt {p:?}"
                );
            }
        }
    }
}

/// A rank whose rank 0 goes away after Setup, before dialing the data link, stops (it used to
/// wait for that link for good, and refuse a restarted rank 0's control link).
#[test]
fn a_rank_stops_when_rank_0_dies_during_setup() {
    use sluice_engine::transport::message::{Message, Setup};
    use sluice_engine::transport::{
        dial, DialOptions, HelloFields, LinkRole, LinkTransport, Transport,
    };
    let secret = ("SLUICE_CLUSTER_SECRET", "setup");
    let (mut rank, addr) = hand_started_rank(secret, "1024");
    let hello = HelloFields {
        role: LinkRole::Control,
        model_sha256: sluice_engine::model::file_sha256(&model_path()).expect("sha"),
        rank: 1,
        layers: [15, 29],
        n_ranks: 2,
        transport: LinkTransport::Tcp,
    };
    let control =
        dial(&addr, &hello, secret.1.as_bytes(), &DialOptions::default()).expect("control link");
    let (welcome, _) = control.recv().expect("welcome");
    assert!(matches!(welcome, Message::Welcome(_)), "{welcome:?}");
    let setup = Setup {
        kv_blocks: 1,
        next: None,
    };
    control.send(&Message::Setup(setup), &[]).expect("setup");
    // Rank 0 "dies": it never dials the data link.
    control.close();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rank.try_wait().expect("wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "the rank still waits for its data link"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A scheduler that could run nothing is refused at start (it admitted nothing: every request
/// waited for good).
#[test]
fn serve_refuses_a_zero_max_running_or_batch() {
    for flag in ["--max-running", "--max-batch-tokens"] {
        let out = engine_cmd()
            .args(["serve", flag, "0"])
            .output()
            .expect("run");
        assert!(!out.status.success(), "{flag} 0 was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("at least 1"), "{flag}: {err}");
    }
}
