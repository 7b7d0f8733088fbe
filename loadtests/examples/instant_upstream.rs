//! A fake OpenAI-compatible upstream that answers at once: the peer of the gateway overhead
//! benchmark (`loadtests/bench/gateway-overhead.sh`), not product code.
//!
//! `POST /v1/chat/completions` and `POST /v1/completions` read the body and answer with a small
//! fixed completion: JSON, or SSE chunks when the body has `"stream": true`. `GET /v1/models`
//! lists one model; anything else is 404. `--delay-ms` holds every completion that long before
//! answering (the shed run uses it to keep the gateway's only slot busy). `--busy` answers every
//! completion with vLLM's own 503 ("The engine is currently busy…"), the reply of an engine
//! whose queue is full; `GET /attempts` says how many completion requests have arrived, so a
//! benchmark can count a gateway's retries. `GET /health` and `/healthz` answer 200.
//!
//! ```sh
//! cargo run --release -p sluice-loadtests --example instant_upstream -- --listen 127.0.0.1:9100
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const MODEL: &str = "instant";

const CHAT_JSON: &str = r#"{"id":"chatcmpl-instant","object":"chat.completion","created":1764460800,"model":"instant","choices":[{"index":0,"message":{"role":"assistant","content":"Hi there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

const COMPLETION_JSON: &str = r#"{"id":"cmpl-instant","object":"text_completion","created":1764460800,"model":"instant","choices":[{"index":0,"text":" Hi there!","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

const CHAT_SSE: &str = concat!(
    r#"data: {"id":"chatcmpl-instant","object":"chat.completion.chunk","created":1764460800,"model":"instant","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"chatcmpl-instant","object":"chat.completion.chunk","created":1764460800,"model":"instant","choices":[{"index":0,"delta":{"content":" there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);

const COMPLETION_SSE: &str = concat!(
    r#"data: {"id":"cmpl-instant","object":"text_completion","created":1764460800,"model":"instant","choices":[{"index":0,"text":" Hi","finish_reason":null}]}"#,
    "\n\n",
    r#"data: {"id":"cmpl-instant","object":"text_completion","created":1764460800,"model":"instant","choices":[{"index":0,"text":" there!","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#,
    "\n\n",
    "data: [DONE]\n\n",
);

const BUSY_JSON: &str = r#"{"error":{"message":"The engine is currently busy and the request queue is full. Please try again later.","type":"ServiceUnavailableError","param":null,"code":503}}"#;

const MODELS_JSON: &str = r#"{"object":"list","data":[{"id":"instant","object":"model","created":1764460800,"owned_by":"sluice-bench"}]}"#;

#[derive(Debug)]
struct Args {
    listen: SocketAddr,
    threads: usize,
    delay: Duration,
    busy: bool,
}

/// What every connection shares.
#[derive(Debug)]
struct Shared {
    delay: Duration,
    busy: bool,
    /// Completion requests received.
    attempts: AtomicU64,
}

fn usage() -> ! {
    eprintln!(
        "usage: instant_upstream [--listen ADDR (127.0.0.1:9100)] [--threads N (1)] [--delay-ms MS (0)] [--busy]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut args = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 9100)),
        threads: 1,
        delay: Duration::ZERO,
        busy: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--busy" {
            args.busy = true;
            continue;
        }
        let Some(value) = it.next() else { usage() };
        match flag.as_str() {
            "--listen" => args.listen = value.parse().unwrap_or_else(|_| usage()),
            "--threads" => args.threads = value.parse().unwrap_or_else(|_| usage()),
            "--delay-ms" => {
                args.delay = Duration::from_millis(value.parse().unwrap_or_else(|_| usage()))
            }
            _ => usage(),
        }
    }
    if args.threads == 0 {
        usage()
    }
    args
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(serve(args));
}

async fn serve(args: Args) {
    let listener = TcpListener::bind(args.listen)
        .await
        .expect("bind the listen address");
    let local = listener.local_addr().expect("listener address");
    eprintln!(
        "instant upstream on http://{local} ({} thread(s), delay {:?}{}); model {MODEL:?}",
        args.threads,
        args.delay,
        if args.busy { ", busy" } else { "" }
    );
    let shared = Arc::new(Shared {
        delay: args.delay,
        busy: args.busy,
        attempts: AtomicU64::new(0),
    });
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, shared.clone()));
            // Keep-alive is hyper's default for HTTP/1.1; errors here are client resets.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (json, sse) = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => (CHAT_JSON, CHAT_SSE),
        (&Method::POST, "/v1/completions") => (COMPLETION_JSON, COMPLETION_SSE),
        (&Method::GET, "/v1/models") => {
            return Ok(reply(StatusCode::OK, "application/json", MODELS_JSON))
        }
        (_, "/healthz" | "/health") => return Ok(reply(StatusCode::OK, "text/plain", "ok")),
        (&Method::GET, "/attempts") => {
            let n = shared.attempts.load(Ordering::Relaxed).to_string();
            let mut res = reply(StatusCode::OK, "text/plain", "");
            *res.body_mut() = Full::new(Bytes::from(n));
            return Ok(res);
        }
        _ => {
            return Ok(reply(
                StatusCode::NOT_FOUND,
                "application/json",
                r#"{"error":{"message":"not found","type":"invalid_request_error","code":"not_found","param":null}}"#,
            ))
        }
    };
    shared.attempts.fetch_add(1, Ordering::Relaxed);
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return Ok(reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                "unreadable body",
            ))
        }
    };
    let stream = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("stream").and_then(serde_json::Value::as_bool))
        .unwrap_or(false);
    if !shared.delay.is_zero() {
        tokio::time::sleep(shared.delay).await;
    }
    Ok(if shared.busy {
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "application/json",
            BUSY_JSON,
        )
    } else if stream {
        reply(StatusCode::OK, "text/event-stream", sse)
    } else {
        reply(StatusCode::OK, "application/json", json)
    })
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: &'static str,
) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}
