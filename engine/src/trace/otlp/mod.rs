//! OTLP trace export: spans go to an OpenTelemetry collector over gRPC or HTTP/protobuf,
//! configured by the standard `OTEL_*` variables (or the gateway's policy). With no endpoint
//! configured nothing is exported and nothing is logged.

mod config;
mod encode;
mod export;
mod transport;

pub use config::{OtlpConfig, OtlpConfigError, OtlpSettings, Protocol};
pub use encode::export_request;
pub use export::{install, OtlpExporter};
