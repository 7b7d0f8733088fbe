//! The gateway in front of a real third-party OpenAI-compatible server: llama.cpp's
//! `llama-server`, built from the `llama-cpp-python` sdist on PyPI (`scripts/build-peer.sh`),
//! serving the bundled GGUF. Counting, the cap, admission and streaming all work, and the
//! gateway's count equals llama-server's own `usage.prompt_tokens`.
//!
//! The binary is `$SLUICE_LLAMA_SERVER` (default: where `scripts/build-peer.sh` puts it). When
//! it is missing the test says so and passes, unless `SLUICE_REQUIRE_PEER=1`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::json;
use sluice_gateway::policy::UpstreamKind;

use crate::common::{eventually, policy, Gateway};

const DEFAULT_BIN: &str =
    "/tmp/peer/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server";

fn llama_server() -> Option<PathBuf> {
    let path =
        std::env::var_os("SLUICE_LLAMA_SERVER").map_or_else(|| DEFAULT_BIN.into(), PathBuf::from);
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var("SLUICE_REQUIRE_PEER").as_deref() != Ok("1"),
        "SLUICE_REQUIRE_PEER=1 but there is no llama-server at {} (scripts/build-peer.sh)",
        path.display()
    );
    eprintln!(
        "skipped: no llama-server at {} (scripts/build-peer.sh builds one)",
        path.display()
    );
    None
}

fn prompt_tokens(headers: &http::HeaderMap) -> u64 {
    headers["x-sluice-prompt-tokens"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_behind_the_gateway() {
    let Some(bin) = llama_server() else {
        return;
    };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let mut child = tokio::process::Command::new(bin)
        .args([
            "-m",
            &sluice_engine::model::default_model_path()
                .display()
                .to_string(),
        ])
        .args(["-t", "1", "-c", "4096", "-np", "2", "--jinja", "--metrics"])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("llama-server starts");
    let url = format!("http://127.0.0.1:{port}");

    let mut p = policy(1, 8);
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = vec![url.clone()];
    p.upstream.health_interval = Duration::from_millis(200);
    p.upstream.metrics_interval = Duration::from_millis(200);
    p.limits.input_tokens_max = 256;
    let gw = Gateway::start_replicas(p).await;
    let c = gw.client();
    let ready = {
        let c = c.clone();
        let mut ok = false;
        for _ in 0..300 {
            let (status, _, _) = c.json("GET", "/readyz", None).await;
            let (probe, _, _) = c
                .post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 1}))
                .await;
            if status == StatusCode::OK && probe == StatusCode::OK {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        ok
    };
    assert!(
        ready,
        "llama-server answered through the gateway within 60 s"
    );

    // Counting: the gateway's count is llama-server's usage.prompt_tokens.
    for body in [
        json!({"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 4, "temperature": 0}),
        json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2? Answer with a number."}], "max_tokens": 4, "temperature": 0}),
    ] {
        let (status, headers, v) = c.post("/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            Some(prompt_tokens(&headers)),
            v["usage"]["prompt_tokens"].as_u64(),
            "{v}"
        );
    }

    // The cap: refused by the gateway before llama-server sees it.
    let long = "word ".repeat(400);
    let (status, _, v) = c
        .post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");

    // Admission (one slot) and streaming: the second stream waits for the first.
    let stream = json!({"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 24,
                        "stream": true, "temperature": 0});
    let first = c.send("POST", "/v1/chat/completions", Some(&stream)).await;
    let c2 = c.clone();
    let s2 = stream.clone();
    let second =
        tokio::spawn(async move { c2.send("POST", "/v1/chat/completions", Some(&s2)).await });
    assert!(eventually(Duration::from_secs(10), || gw.app.admission.queued() == 1).await);
    let mut frames = 0;
    let mut text = String::new();
    let mut body = first.into_body();
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.expect("frame").into_data() {
            frames += 1;
            text.push_str(&String::from_utf8_lossy(&d));
        }
    }
    assert!(frames > 3, "streamed in {frames} pieces: {text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let second = second.await.expect("task");
    let status = second.status();
    if status != StatusCode::OK {
        let body = second.into_body().collect().await.expect("body").to_bytes();
        panic!(
            "the second stream got {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let queued: u64 = second.headers()["x-sluice-queue-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("ms");
    assert!(queued > 0, "the second stream waited for the slot");
    let _ = second.into_body().collect().await;

    // llama-server's own metrics (--metrics) reach the replica's saturation gauges.
    let (_, _, metrics) = c.json("GET", "/metrics", None).await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        metrics.contains("sluice_upstream_replica_engine_waiting{replica="),
        "{metrics}"
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
    let _ = child.kill().await;
}
