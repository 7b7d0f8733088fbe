//! Finished spans and where they go: a [`SpanSink`] installed once per process (the OTLP
//! exporter, [`super::otlp`]), else the `tracing` log at debug level.

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use super::context::to_hex;

/// A finished span, in the caller's trace when it sent one.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub name: &'static str,
    pub kind: SpanKind,
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The parent span (the caller's, for a process's outermost span).
    pub parent_id: Option<[u8; 8]>,
    pub start: SystemTime,
    pub end: SystemTime,
    /// Attributes, with OpenTelemetry's semantic-convention names where one exists. An
    /// `error.type` attribute marks the span as failed.
    pub attributes: Vec<(&'static str, AttrValue)>,
}

impl SpanRecord {
    /// The value of attribute `key`, if set.
    pub fn attribute(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find_map(|(k, v)| (*k == key).then_some(v))
    }
}

/// OpenTelemetry's span kinds, as far as Sluice uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the process (queueing, prefill, decode).
    Internal,
    /// Serving a caller's request.
    Server,
    /// A call to another service (the gateway's call upstream).
    Client,
}

/// An attribute's value: OTLP keeps the type, so counts stay numbers in the trace backend.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    F64(f64),
    Bool(bool),
}

impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        Self::Str(v)
    }
}

impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        Self::Str(v.to_owned())
    }
}

impl From<usize> for AttrValue {
    fn from(v: usize) -> Self {
        Self::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<u16> for AttrValue {
    fn from(v: u16) -> Self {
        Self::Int(v.into())
    }
}

impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        Self::F64(v)
    }
}

impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

/// Where finished spans go.
pub trait SpanSink: Send + Sync {
    fn record(&self, span: SpanRecord);
}

static SINK: OnceLock<Arc<dyn SpanSink>> = OnceLock::new();

/// Installs the process's span sink (once; later calls are ignored and return `false`).
pub fn set_sink(sink: Arc<dyn SpanSink>) -> bool {
    SINK.set(sink).is_ok()
}

/// Whether a sink is installed (a caller may skip building spans no one takes).
pub fn has_sink() -> bool {
    SINK.get().is_some()
}

/// Hands a finished span to the sink.
pub fn record(span: SpanRecord) {
    match SINK.get() {
        Some(s) => s.record(span),
        None => tracing::debug!(
            name = span.name,
            trace_id = %to_hex(&span.trace_id),
            span_id = %to_hex(&span.span_id),
            parent_id = %span.parent_id.map(|p| to_hex(&p)).unwrap_or_default(),
            duration_ms = span.end.duration_since(span.start).map_or(0.0, |d| d.as_secs_f64() * 1e3),
            "span"
        ),
    }
}
