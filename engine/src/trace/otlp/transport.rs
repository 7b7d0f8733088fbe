//! One export call, over OTLP/HTTP (protobuf body) or OTLP/gRPC (unary `Export` over HTTP/2
//! cleartext: a length-prefixed message, the status in the `grpc-status` trailer).

use bytes::{BufMut, Bytes, BytesMut};
use http::{header, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use super::config::{OtlpConfig, Protocol};
use crate::error::chain;

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("sending to the collector: {0}")]
    Send(String),
    #[error("the collector answered HTTP {0}")]
    Status(StatusCode),
    #[error("the collector answered grpc-status {code}: {message}")]
    Grpc { code: u32, message: String },
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// A connection pool to the collector.
#[derive(Debug, Clone)]
pub struct Transport {
    client: Client<HttpConnector, Full<Bytes>>,
    config: OtlpConfig,
}

impl Transport {
    pub fn new(config: OtlpConfig) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.timeout));
        let mut builder = Client::builder(TokioExecutor::new());
        builder.http2_only(config.protocol == Protocol::Grpc);
        Self {
            client: builder.build(connector),
            config,
        }
    }

    pub fn config(&self) -> &OtlpConfig {
        &self.config
    }

    /// Sends one export request and waits for the collector's verdict.
    pub async fn export(&self, request: &ExportTraceServiceRequest) -> Result<(), ExportError> {
        let limit = self.config.timeout;
        tokio::time::timeout(limit, self.call(request))
            .await
            .map_err(|_| ExportError::Timeout(limit))?
    }

    async fn call(&self, request: &ExportTraceServiceRequest) -> Result<(), ExportError> {
        let (content_type, body) = match self.config.protocol {
            Protocol::HttpProtobuf => ("application/x-protobuf", request.encode_to_vec().into()),
            Protocol::Grpc => ("application/grpc", grpc_frame(request)),
        };
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(self.config.url.clone())
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .map_err(|e| ExportError::Send(e.to_string()))?;
        let headers = req.headers_mut();
        if self.config.protocol == Protocol::Grpc {
            headers.insert(header::TE, HeaderValue::from_static("trailers"));
        }
        for (k, v) in &self.config.headers {
            headers.insert(k.clone(), v.clone());
        }
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| ExportError::Send(chain(&e)))?;
        let status = resp.status();
        let grpc_in_headers = grpc_status(resp.headers());
        let collected = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ExportError::Send(chain(&e)))?;
        if !status.is_success() {
            return Err(ExportError::Status(status));
        }
        if self.config.protocol == Protocol::Grpc {
            // A trailers-only answer carries the status in the headers.
            let verdict = collected
                .trailers()
                .and_then(grpc_status)
                .or(grpc_in_headers)
                .ok_or_else(|| ExportError::Send("no grpc-status in the answer".into()))?;
            if verdict.0 != 0 {
                return Err(ExportError::Grpc {
                    code: verdict.0,
                    message: verdict.1,
                });
            }
        }
        Ok(())
    }
}

/// A gRPC message: uncompressed flag, big-endian length, the protobuf bytes.
fn grpc_frame(request: &ExportTraceServiceRequest) -> Bytes {
    let len = request.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Encoding into a buffer with enough room cannot fail.
    let _ = request.encode(&mut buf);
    buf.freeze()
}

fn grpc_status(headers: &http::HeaderMap) -> Option<(u32, String)> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    Some((code, message))
}
