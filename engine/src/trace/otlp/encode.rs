//! [`SpanRecord`]s to OTLP's protobuf messages (`opentelemetry-proto`'s generated types).

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};

use crate::trace::{AttrValue, SpanKind, SpanRecord};

/// One export: `spans` from the service `service_name`, under the instrumentation scope
/// `sluice` at this crate's version.
pub fn export_request(service_name: &str, spans: &[SpanRecord]) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    key_value("service.name", &AttrValue::Str(service_name.to_owned())),
                    key_value("telemetry.sdk.language", &AttrValue::Str("rust".into())),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "sluice".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans: spans.iter().map(span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn span(s: &SpanRecord) -> Span {
    let error = s.attribute("error.type");
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        parent_span_id: s.parent_id.map_or_else(Vec::new, |p| p.to_vec()),
        name: s.name.to_owned(),
        kind: match s.kind {
            SpanKind::Internal => span::SpanKind::Internal,
            SpanKind::Server => span::SpanKind::Server,
            SpanKind::Client => span::SpanKind::Client,
        } as i32,
        start_time_unix_nano: unix_nanos(s.start),
        end_time_unix_nano: unix_nanos(s.end),
        attributes: s.attributes.iter().map(|(k, v)| key_value(k, v)).collect(),
        status: error.map(|e| Status {
            code: status::StatusCode::Error as i32,
            message: match e {
                AttrValue::Str(m) => m.clone(),
                other => format!("{other:?}"),
            },
        }),
        ..Default::default()
    }
}

fn key_value(key: &str, value: &AttrValue) -> KeyValue {
    let value = match value {
        AttrValue::Str(s) => any_value::Value::StringValue(s.clone()),
        AttrValue::Int(i) => any_value::Value::IntValue(*i),
        AttrValue::F64(f) => any_value::Value::DoubleValue(*f),
        AttrValue::Bool(b) => any_value::Value::BoolValue(*b),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prost::Message;

    use super::*;

    #[test]
    fn round_trips_through_the_protobuf_encoding() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let record = SpanRecord {
            name: "engine.request",
            kind: SpanKind::Server,
            trace_id: [7; 16],
            span_id: [8; 8],
            parent_id: Some([9; 8]),
            start,
            end: start + Duration::from_millis(1500),
            attributes: vec![
                ("gen_ai.usage.input_tokens", AttrValue::Int(42)),
                ("gen_ai.latency.time_in_queue", AttrValue::F64(0.25)),
                ("error.type", AttrValue::Str("kv pool exhausted".into())),
            ],
        };
        let bytes = export_request("sluice-engine", &[record]).encode_to_vec();
        let back = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let rs = &back.resource_spans[0];
        let service = &rs.resource.as_ref().unwrap().attributes[0];
        assert_eq!(service.key, "service.name");
        let s = &rs.scope_spans[0].spans[0];
        assert_eq!(s.name, "engine.request");
        assert_eq!(s.kind, span::SpanKind::Server as i32);
        assert_eq!(
            (
                s.trace_id.len(),
                s.parent_span_id.as_slice(),
                s.span_id.len()
            ),
            (16, &[9u8; 8][..], 8)
        );
        assert_eq!(s.end_time_unix_nano - s.start_time_unix_nano, 1_500_000_000);
        assert_eq!(
            s.attributes[0].value.as_ref().unwrap().value,
            Some(any_value::Value::IntValue(42))
        );
        let status = s.status.as_ref().unwrap();
        assert_eq!(
            (status.code, status.message.as_str()),
            (status::StatusCode::Error as i32, "kv pool exhausted")
        );
    }
}
