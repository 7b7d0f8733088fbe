//! Traces: W3C trace context in and out, the spans this process records, and their export
//! over OTLP.

mod context;
pub mod otlp;
mod span;

pub use context::{new_id, to_hex, TraceContext};
pub use span::{has_sink, record, set_sink, AttrValue, SpanKind, SpanRecord, SpanSink};
