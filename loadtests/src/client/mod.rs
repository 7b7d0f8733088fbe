//! A streaming HTTP/1.1 client for OpenAI-compatible endpoints, over TCP or TLS: one keep-alive
//! connection per worker, the SSE stream parsed as it arrives, one [`Sample`] per request.

mod sample;
mod sse;
mod stream;
mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub use sample::{Outcome, Sample, ToolCall};
pub use sse::SseParser;
pub use stream::StreamState;

use crate::error::{Error, Result};
use stream::{clip, error_fields};

/// The response header in which Sluice reports how long a request waited for admission.
pub const QUEUE_HEADER: &str = "x-sluice-queue-ms";

/// Which OpenAI endpoint a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/completions`: a raw prompt, exactly the tokens the shape says.
    Completions,
    /// `POST /v1/chat/completions`: messages through the chat template, tools.
    Chat,
}

/// How to reach and authenticate to the server, beyond its URL.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// The only CA trusted for `https` (else the system bundle).
    pub ca: Option<PathBuf>,
    /// Accept any certificate.
    pub insecure: bool,
}

#[derive(Clone)]
struct Tls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({:?})", self.name)
    }
}

/// Where requests go: `http(s)://host:port` plus the OpenAI paths under it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `host:port`, what the TCP connection dials.
    addr: String,
    host: HeaderValue,
    tls: Option<Tls>,
    /// The path before `/v1`, without its trailing slash.
    prefix: String,
    auth: Option<HeaderValue>,
}

impl Endpoint {
    /// `url` is the server's base (`https://127.0.0.1:8443`), its `/v1`, or the full
    /// `/v1/completions` or `/v1/chat/completions` URL.
    pub fn parse(url: &str, opts: &ClientOptions) -> Result<Self> {
        let bad = |what: &str| Error::Config(format!("URL {url:?}: {what}"));
        let uri: Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(bad(&format!("scheme {other:?} is not http or https"))),
            None => return Err(bad("expected http(s)://host:port")),
        };
        let host_name = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addr = format!("{}:{port}", authority.host());
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| bad("bad host"))?;
        let tls = if https {
            let config = tls::client_config(opts.ca.as_deref(), opts.insecure)?;
            let name = ServerName::try_from(host_name.to_owned())
                .map_err(|e| bad(&format!("bad TLS server name: {e}")))?;
            Some(Tls {
                connector: TlsConnector::from(Arc::new(config)),
                name,
            })
        } else {
            None
        };
        let path = uri.path().trim_end_matches('/');
        let path = path.strip_suffix("/completions").unwrap_or(path);
        let path = path.strip_suffix("/chat").unwrap_or(path);
        let prefix = path.strip_suffix("/v1").unwrap_or(path).to_owned();
        let auth = match &opts.api_key {
            Some(key) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| Error::Config("the API key is not a valid header value".into()))?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        Ok(Self {
            addr,
            host,
            tls,
            prefix,
            auth,
        })
    }

    /// The path requests for `api` are POSTed to.
    pub fn path(&self, api: Api) -> String {
        match api {
            Api::Completions => format!("{}/v1/completions", self.prefix),
            Api::Chat => format!("{}/v1/chat/completions", self.prefix),
        }
    }

    fn models_path(&self) -> String {
        format!("{}/v1/models", self.prefix)
    }

    /// The URL requests for `api` are POSTed to.
    pub fn url(&self, api: Api) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let host = self.host.to_str().unwrap_or("?");
        format!("{scheme}://{host}{}", self.path(api))
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.host.clone());
        if let Some(auth) = &self.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        if !body.is_empty() {
            req = req
                .header(CONTENT_TYPE, "application/json")
                .header(ACCEPT, "text/event-stream, application/json");
        }
        req.body(Full::new(body)).map_err(|e| e.to_string())
    }
}

/// A byte stream hyper can speak HTTP/1.1 over: plain TCP or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Sender = SendRequest<Full<Bytes>>;

/// One worker's connection: kept alive between requests, redialled when the server closed it.
#[derive(Debug)]
pub struct Connection {
    endpoint: Arc<Endpoint>,
    sender: Option<Sender>,
}

impl Connection {
    pub fn new(endpoint: Arc<Endpoint>) -> Self {
        Self {
            endpoint,
            sender: None,
        }
    }

    async fn dial(&self) -> Result<Sender, String> {
        let addr = &self.endpoint.addr;
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = match &self.endpoint.tls {
            None => Box::new(tcp),
            Some(tls) => Box::new(
                tls.connector
                    .connect(tls.name.clone(), tcp)
                    .await
                    .map_err(|e| format!("TLS handshake with {addr}: {e}"))?,
            ),
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// The kept-alive sender if it is still usable (`true`), else a fresh one (`false`).
    async fn sender(&mut self) -> Result<(Sender, bool), String> {
        if let Some(mut s) = self.sender.take() {
            if s.ready().await.is_ok() {
                return Ok((s, true));
            }
        }
        Ok((self.dial().await?, false))
    }

    /// POSTs one streaming request to `api` (`body` is its JSON) and reads the whole response,
    /// within `timeout`.
    pub async fn send(&mut self, api: Api, body: Bytes, timeout: Duration) -> Sample {
        let start = Instant::now();
        match tokio::time::timeout(timeout, self.exchange(api, body, start)).await {
            Ok(sample) => sample,
            Err(_) => {
                // The connection went down with the dropped future.
                self.sender = None;
                Sample::failed(Outcome::Timeout(timeout), start.elapsed())
            }
        }
    }

    async fn exchange(&mut self, api: Api, body: Bytes, start: Instant) -> Sample {
        let failed = |outcome| Sample::failed(outcome, start.elapsed());
        let (mut sender, reused) = match self.sender().await {
            Ok(s) => s,
            Err(e) => return failed(Outcome::Transport(e)),
        };
        let path = self.endpoint.path(api);
        let request = |body| self.endpoint.request(Method::POST, &path, body);
        let mut resp = match request(body.clone()) {
            Ok(req) => sender.send_request(req).await,
            Err(e) => return failed(Outcome::Transport(e)),
        };
        // A kept-alive connection the server closed just as we sent: once more, on a fresh one.
        if reused && matches!(&resp, Err(e) if e.is_canceled() || e.is_incomplete_message()) {
            sender = match self.dial().await {
                Ok(s) => s,
                Err(e) => return failed(Outcome::Transport(e)),
            };
            resp = match request(body) {
                Ok(req) => sender.send_request(req).await,
                Err(e) => return failed(Outcome::Transport(e)),
            };
        }
        let resp = match resp {
            Ok(r) => r,
            Err(e) => return failed(Outcome::Transport(format!("send: {e}"))),
        };
        let status = resp.status();
        let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
        let queue_ms = header(QUEUE_HEADER).and_then(|v| v.trim().parse::<f64>().ok());
        let sse = header(CONTENT_TYPE.as_str()).is_some_and(|t| t.starts_with("text/event-stream"));
        let with_queue = |mut s: Sample| {
            s.queue_ms = queue_ms;
            s
        };

        if !status.is_success() {
            // Whole seconds, as the gateway sends it; an HTTP date is not read.
            let retry_after = header(RETRY_AFTER.as_str())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let bytes = match resp.into_body().collect().await {
                Ok(c) => {
                    self.sender = Some(sender);
                    c.to_bytes()
                }
                Err(_) => Bytes::new(),
            };
            let (code, message) = match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => error_fields(v.get("error").unwrap_or(&v)),
                Err(_) => (None, clip(&String::from_utf8_lossy(&bytes))),
            };
            let mut sample = with_queue(failed(Outcome::Http {
                status: status.as_u16(),
                code,
                message,
            }));
            sample.retry_after = retry_after;
            return sample;
        }

        let mut state = StreamState::new(start);
        let mut body = resp.into_body();
        if !sse {
            // Not a stream after all: the whole completion in one JSON body.
            return match body.collect().await {
                Ok(c) => {
                    self.sender = Some(sender);
                    let text = String::from_utf8_lossy(&c.to_bytes()).into_owned();
                    state.on_event(&text, Instant::now());
                    state.into_sample(Instant::now(), queue_ms)
                }
                Err(e) => with_queue(failed(Outcome::Transport(format!("reading the body: {e}")))),
            };
        }
        let mut parser = SseParser::default();
        loop {
            match body.frame().await {
                None => break,
                Some(Err(e)) => {
                    let outcome = Outcome::Transport(format!("reading the stream: {e}"));
                    return with_queue(failed(outcome));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let now = Instant::now();
                    for event in parser.push(&data) {
                        if !state.on_event(&event, now) {
                            // Failed: drop the connection rather than read the rest.
                            return state.into_sample(now, queue_ms);
                        }
                    }
                }
            }
        }
        if let Some(event) = parser.finish() {
            state.on_event(&event, Instant::now());
        }
        if state.complete() {
            self.sender = Some(sender);
        }
        state.into_sample(Instant::now(), queue_ms)
    }

    /// `GET /v1/models` → the first model's id.
    pub async fn first_model_id(&mut self, timeout: Duration) -> Result<String> {
        let path = self.endpoint.models_path();
        let fail = |what: String| Error::Server(format!("GET {path}: {what}"));
        let fetch = async {
            let (mut sender, _) = self.sender().await.map_err(fail)?;
            let req = self
                .endpoint
                .request(Method::GET, &path, Bytes::new())
                .map_err(fail)?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| fail(e.to_string()))?
                .to_bytes();
            self.sender = Some(sender);
            if !status.is_success() {
                return Err(fail(format!("HTTP {status}")));
            }
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?;
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| fail("no data[0].id".into()))
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| fail("timed out".into()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_paths() {
        let opts = ClientOptions::default();
        for (url, addr, completions, chat) in [
            (
                "http://127.0.0.1:8100",
                "127.0.0.1:8100",
                "/v1/completions",
                "/v1/chat/completions",
            ),
            (
                "http://localhost:8100/",
                "localhost:8100",
                "/v1/completions",
                "/v1/chat/completions",
            ),
            (
                "http://h/v1",
                "h:80",
                "/v1/completions",
                "/v1/chat/completions",
            ),
            (
                "http://h:1/p/v1/completions",
                "h:1",
                "/p/v1/completions",
                "/p/v1/chat/completions",
            ),
            (
                "http://h:1/v1/chat/completions",
                "h:1",
                "/v1/completions",
                "/v1/chat/completions",
            ),
            (
                "http://[::1]:9/api",
                "[::1]:9",
                "/api/v1/completions",
                "/api/v1/chat/completions",
            ),
        ] {
            let e = Endpoint::parse(url, &opts).unwrap();
            assert_eq!(
                (
                    e.addr.as_str(),
                    e.path(Api::Completions).as_str(),
                    e.path(Api::Chat).as_str()
                ),
                (addr, completions, chat),
                "{url}"
            );
            assert_eq!(e.models_path(), format!("{}/v1/models", e.prefix));
        }
        assert!(Endpoint::parse("ftp://h", &opts).is_err());
        assert!(Endpoint::parse("h:80", &opts).is_err());
        let with_key = ClientOptions {
            api_key: Some("sk-1".into()),
            ..ClientOptions::default()
        };
        let e = Endpoint::parse("http://h", &with_key).unwrap();
        assert_eq!(e.auth.unwrap().to_str().unwrap(), "Bearer sk-1");
        let e = Endpoint::parse(
            "https://localhost/v1",
            &ClientOptions {
                insecure: true,
                ..ClientOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            (e.addr.as_str(), e.url(Api::Chat).as_str()),
            ("localhost:443", "https://localhost/v1/chat/completions")
        );
    }
}
