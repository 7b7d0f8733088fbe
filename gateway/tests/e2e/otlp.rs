//! Traces against a real OTLP receiver: an in-process collector that decodes the protocol with
//! `opentelemetry-proto` — gRPC through the protocol's own generated tonic server, HTTP/protobuf
//! as `POST /v1/traces`. The gateway's exporter (gRPC) is installed once for this test process;
//! the bundled engine's (HTTP/protobuf, see `bundled.rs`) sends to the same collector.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use sluice_engine::trace::otlp::{self, OtlpConfig, OtlpExporter, OtlpSettings};
use sluice_engine::trace::{SpanKind, SpanRecord, SpanSink, TraceContext};
use tokio::net::TcpListener;

use crate::common::{chat, eventually, policy, tenant, Gateway, ScriptedUpstream};

/// A span as the collector received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub service: String,
    pub span: Span,
}

impl Received {
    pub fn attr(&self, key: &str) -> Option<Any> {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.clone())
            .and_then(|v| v.value)
    }

    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.span.end_time_unix_nano - self.span.start_time_unix_nano)
    }
}

/// The collector: one gRPC and one HTTP listener, everything received kept in memory.
pub struct Collector {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
}

#[derive(Clone)]
struct Store(Arc<Mutex<Vec<Received>>>);

impl Store {
    fn keep(&self, req: ExportTraceServiceRequest) {
        let mut all = self.0.lock().expect("lock");
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    all.push(Received {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
    }
}

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The runtime the collector and the gateway's exporter live on: it outlives every test's own.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime")
    })
}

impl Collector {
    /// The process's collector, started on first use.
    pub fn global() -> &'static Collector {
        static C: OnceLock<Collector> = OnceLock::new();
        C.get_or_init(|| {
            let rt = runtime();
            let _in = rt.enter();
            let listen = || {
                let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
                l.set_nonblocking(true).expect("nonblocking");
                TcpListener::from_std(l).expect("listener")
            };
            let (grpc, http) = (listen(), listen());
            let c = Collector {
                grpc: grpc.local_addr().expect("addr"),
                http: http.local_addr().expect("addr"),
                received: Arc::default(),
            };
            let store = Store(c.received.clone());
            let svc = TraceServiceServer::new(store.clone());
            rt.spawn(async move {
                while let Ok((s, _)) = grpc.accept().await {
                    let svc = TowerToHyperService::new(svc.clone());
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(s), svc),
                    );
                }
            });
            rt.spawn(async move {
                while let Ok((s, _)) = http.accept().await {
                    let store = store.clone();
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let store = store.clone();
                        async move { Ok::<_, Infallible>(http_export(&store, req).await) }
                    });
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(s), svc),
                    );
                }
            });
            c
        })
    }

    /// The spans of the trace `trace_id` received so far.
    pub fn trace(&self, trace_id: &[u8]) -> Vec<Received> {
        self.received
            .lock()
            .expect("lock")
            .iter()
            .filter(|r| r.span.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Waits (at most 10 s) until the trace holds a span of each of `names`, and returns it.
    pub async fn wait_for(&self, trace_id: &[u8], names: &[&str]) -> Vec<Received> {
        let complete = || {
            let t = self.trace(trace_id);
            names.iter().all(|n| t.iter().any(|r| r.span.name == *n))
        };
        assert!(
            eventually(Duration::from_secs(10), complete).await,
            "the collector has not got {names:?}; it has {:#?}",
            self.trace(trace_id)
        );
        self.trace(trace_id)
    }
}

/// OTLP/HTTP: `POST /v1/traces`, a protobuf `ExportTraceServiceRequest`.
async fn http_export(store: &Store, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let answer = |status: StatusCode, body: Vec<u8>| {
        Response::builder()
            .status(status)
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::from(body)))
            .expect("response")
    };
    let protobuf = req
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "application/x-protobuf");
    if req.uri().path() != "/v1/traces" || !protobuf {
        return answer(StatusCode::NOT_FOUND, Vec::new());
    }
    let Ok(body) = req.into_body().collect().await else {
        return answer(StatusCode::BAD_REQUEST, Vec::new());
    };
    match ExportTraceServiceRequest::decode(body.to_bytes()) {
        Ok(r) => {
            store.keep(r);
            answer(
                StatusCode::OK,
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
        Err(_) => answer(StatusCode::BAD_REQUEST, Vec::new()),
    }
}

/// The span called `name` in `spans`.
pub fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    spans
        .iter()
        .find(|r| r.span.name == name)
        .unwrap_or_else(|| panic!("no {name} in {spans:#?}"))
}

/// The settings the standard variables give for `protocol` to `addr`.
pub fn config(addr: SocketAddr, protocol: &str, service: &str) -> OtlpConfig {
    let endpoint = format!("http://{addr}");
    let vars = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_SERVICE_NAME", service),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ];
    OtlpConfig::from_pairs(&vars, &OtlpSettings::default(), "unused")
        .expect("valid")
        .expect("configured")
}

/// Installs the gateway's exporter, gRPC to the collector, once for this process.
pub fn export_gateway_spans() -> &'static Collector {
    static INSTALLED: OnceLock<Arc<OtlpExporter>> = OnceLock::new();
    let c = Collector::global();
    INSTALLED.get_or_init(|| {
        let _in = runtime().enter();
        otlp::install(config(c.grpc, "grpc", "sluice-gateway"))
    });
    c
}

fn span(trace_id: [u8; 16], name: &'static str) -> SpanRecord {
    let now = std::time::SystemTime::now();
    SpanRecord {
        name,
        kind: SpanKind::Internal,
        trace_id,
        span_id: sluice_engine::trace::new_id(),
        parent_id: None,
        start: now,
        end: now + Duration::from_millis(3),
        attributes: vec![("n", 7usize.into())],
    }
}

#[tokio::test]
async fn the_exporter_speaks_grpc_and_http_protobuf() {
    let c = Collector::global();
    for (addr, protocol) in [(c.grpc, "grpc"), (c.http, "http/protobuf")] {
        let exporter = OtlpExporter::start(config(addr, protocol, protocol));
        let trace_id = sluice_engine::trace::new_id::<16>();
        for name in ["a", "b", "c"] {
            exporter.record(span(trace_id, name));
        }
        exporter.flush().await;
        let got = c.wait_for(&trace_id, &["a", "b", "c"]).await;
        assert_eq!(got.len(), 3, "{protocol}: {got:#?}");
        assert!(got.iter().all(|r| r.service == protocol
            && r.duration() == Duration::from_millis(3)
            && r.attr("n") == Some(Any::IntValue(7))));
    }
    // No collector: the export fails once, quietly, and a flush still returns.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let exporter = OtlpExporter::start(config(closed, "grpc", "nowhere"));
    exporter.record(span(sluice_engine::trace::new_id(), "lost"));
    tokio::time::timeout(Duration::from_secs(10), exporter.flush())
        .await
        .expect("a flush with no collector returns");
}

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn secs(v: Option<Any>) -> f64 {
    match v {
        Some(Any::DoubleValue(d)) => d,
        other => panic!("not a double: {other:?}"),
    }
}

/// A request that had to queue: `gateway.request` covers it, `gateway.queue` then
/// `gateway.upstream` split it without overlap, and the upstream got the upstream span as its
/// parent.
#[tokio::test]
async fn a_queued_request_is_traced_as_queue_then_upstream() {
    let collector = export_gateway_spans();
    let mut up = ScriptedUpstream::start().await;
    let mut p = policy(1, 4);
    p.tenants = vec![tenant("alice", "sk-otlp-alice")];
    let up_url = up.url();
    let gw = Gateway::start(p, up.upstream()).await;
    let c = gw
        .client()
        .with_header("authorization", "Bearer sk-otlp-alice");
    // The first request takes the only slot.
    let first = c.send("POST", "/v1/chat/completions", Some(&chat())).await;
    let holder = up.next(Duration::from_secs(5)).await.expect("admitted");
    let c2 = c.clone();
    let mut body = chat();
    body["model"] = MODEL.into();
    let second =
        tokio::spawn(async move { c2.send("POST", "/v1/chat/completions", Some(&body)).await });
    assert!(
        eventually(Duration::from_secs(5), || gw.app.admission.queued() == 1).await,
        "the second request queues"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(holder.tx);
    first.into_body().collect().await.expect("first body");
    let arrival = up.next(Duration::from_secs(5)).await.expect("dequeued");
    let sent_upstream = TraceContext::parse(
        arrival.headers["traceparent"]
            .to_str()
            .expect("traceparent"),
    )
    .expect("valid traceparent");
    let mut tx = arrival.tx;
    // The role event first (as engines send it on accepting the request, before any prefill),
    // then the first token 50 ms later: the span's first token is the token.
    tx.send_data(Bytes::from_static(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    ))
    .await
    .expect("send");
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send_data(Bytes::from_static(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
    ))
    .await
    .expect("send");
    drop(tx);
    let resp = second.await.expect("task");
    assert_eq!(resp.status(), StatusCode::OK);
    let root_ctx = TraceContext::parse(resp.headers()["traceparent"].to_str().expect("ascii"))
        .expect("traceparent on the response");
    let prompt_tokens: i64 = resp.headers()["x-sluice-prompt-tokens"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("count");
    resp.into_body().collect().await.expect("second body");
    assert_eq!(sent_upstream.trace_id, root_ctx.trace_id, "one trace");

    let spans = collector
        .wait_for(
            &root_ctx.trace_id,
            &["gateway.request", "gateway.queue", "gateway.upstream"],
        )
        .await;
    let (root, queue, upstream) = (
        named(&spans, "gateway.request"),
        named(&spans, "gateway.queue"),
        named(&spans, "gateway.upstream"),
    );
    assert_eq!(root.service, "sluice-gateway");
    assert!(root.span.parent_span_id.is_empty(), "a new trace's root");
    assert_eq!(root.span.span_id, root_ctx.parent_id);
    assert_eq!(queue.span.parent_span_id, root.span.span_id);
    assert_eq!(upstream.span.parent_span_id, root.span.span_id);
    assert_eq!(
        upstream.span.span_id, sent_upstream.parent_id,
        "traceparent upstream names gateway.upstream"
    );

    assert_eq!(
        queue.attr("sluice.class"),
        Some(Any::StringValue("interactive".into()))
    );
    assert_eq!(
        queue.attr("sluice.queue.depth_on_entry"),
        Some(Any::IntValue(0))
    );
    assert_eq!(
        queue.attr("sluice.queue.outcome"),
        Some(Any::StringValue("admitted".into()))
    );
    let in_queue = secs(queue.attr("gen_ai.latency.time_in_queue"));
    assert!(in_queue >= 0.05, "it waited for the slot: {in_queue}");
    assert!((in_queue - queue.duration().as_secs_f64()).abs() < 1e-6);

    assert_eq!(
        upstream.attr("gen_ai.request.model"),
        Some(Any::StringValue(MODEL.into()))
    );
    assert_eq!(
        upstream.attr("sluice.upstream"),
        Some(Any::StringValue(up_url.clone()))
    );
    assert_eq!(
        upstream.attr("gen_ai.usage.input_tokens"),
        Some(Any::IntValue(prompt_tokens))
    );
    assert_eq!(
        upstream.attr("gen_ai.usage.output_tokens"),
        Some(Any::IntValue(3))
    );
    let ttft = secs(upstream.attr("gen_ai.latency.time_to_first_token"));
    assert!(
        ttft >= in_queue + 0.045,
        "TTFT counts from arrival to the first token, not to the role event: {ttft} vs \
         {in_queue} in the queue"
    );
    assert_eq!(
        root.attr("sluice.outcome"),
        Some(Any::StringValue("ok".into()))
    );
    assert_eq!(
        root.attr("sluice.tenant"),
        Some(Any::StringValue("alice".into()))
    );

    // Never overlapping, together covering the request (within 1 ms).
    let (r, q, u) = (&root.span, &queue.span, &upstream.span);
    assert!(r.start_time_unix_nano <= q.start_time_unix_nano);
    assert!(q.end_time_unix_nano <= u.start_time_unix_nano, "no overlap");
    assert_eq!(u.end_time_unix_nano, r.end_time_unix_nano);
    let covered = queue.duration() + upstream.duration();
    let gap = root.duration().abs_diff(covered);
    assert!(
        gap <= Duration::from_millis(1),
        "queue {:?} + upstream {:?} vs request {:?}",
        queue.duration(),
        upstream.duration(),
        root.duration()
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
}

/// A shed request's queue span says so, and the root span carries the error.
#[tokio::test]
async fn a_shed_request_is_traced_with_its_outcome() {
    let collector = export_gateway_spans();
    let mut up = ScriptedUpstream::start().await;
    let gw = Gateway::start(policy(1, 0), up.upstream()).await;
    let c = gw.client();
    let first = c.send("POST", "/v1/chat/completions", Some(&chat())).await;
    let holder = up.next(Duration::from_secs(5)).await.expect("admitted");
    let (status, headers, body) = c.post("/v1/chat/completions", &chat()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let ctx = TraceContext::parse(headers["traceparent"].to_str().expect("ascii")).expect("ctx");
    let spans = collector
        .wait_for(&ctx.trace_id, &["gateway.request", "gateway.queue"])
        .await;
    let (queue, root) = (
        named(&spans, "gateway.queue"),
        named(&spans, "gateway.request"),
    );
    assert_eq!(
        queue.attr("sluice.queue.outcome"),
        Some(Any::StringValue("shed".into()))
    );
    assert_eq!(
        root.attr("sluice.outcome"),
        Some(Any::StringValue("shed".into()))
    );
    assert_eq!(
        root.attr("error.type"),
        Some(Any::StringValue("overloaded".into()))
    );
    assert_eq!(
        root.attr("http.response.status_code"),
        Some(Any::IntValue(503))
    );
    assert!(spans.iter().all(|r| r.span.name != "gateway.upstream"));
    drop(holder.tx);
    first.into_body().collect().await.expect("body");
    gw.shutdown().await;
}
