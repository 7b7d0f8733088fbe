//! A request's trace: `gateway.request` from arrival to the last byte, with two children that
//! never overlap and together cover it — `gateway.queue` (arrival at admission until a slot is
//! granted, or the refusal) and `gateway.upstream` (slot granted until the last byte). The
//! engine's spans hang under `gateway.upstream` through the `traceparent` sent upstream.
//!
//! The layers note the moments in the [`RequestRecord`](super::RequestRecord); the spans are
//! built once, when the request ends, and handed to the process's span sink (OTLP export).

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::trace::{
    has_sink, new_id, record, AttrValue, SpanKind, SpanRecord, TraceContext,
};
use tokio::time::Instant;
use tracing::Level;

use super::outcome::Outcome;
use super::record::Facts;

/// The request's place in a trace (a request extension): its trace and the gateway's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestTrace {
    /// The caller's context, if it sent one.
    pub parent: Option<TraceContext>,
    /// The gateway's `gateway.request` span.
    pub span: TraceContext,
}

impl RequestTrace {
    /// The trace of a request with `traceparent` header `header` (if any).
    pub fn from_header(header: Option<&str>) -> Self {
        let parent = header.and_then(TraceContext::parse);
        let span_id = new_id::<8>();
        let span = match parent {
            Some(p) => p.child(span_id),
            None => TraceContext {
                trace_id: new_id::<16>(),
                parent_id: span_id,
                flags: 1,
            },
        };
        Self { parent, span }
    }
}

/// `bytes` as lowercase hex digits into `out` (twice as long), without allocating.
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// `ctx` as a W3C `traceparent` header value (`00-TRACE-SPAN-FLAGS`), built in place.
pub fn traceparent(ctx: &TraceContext) -> http::HeaderValue {
    let mut v = *b"00-00000000000000000000000000000000-0000000000000000-00";
    hex_into(&ctx.trace_id, &mut v[3..35]);
    hex_into(&ctx.parent_id, &mut v[36..52]);
    hex_into(&[ctx.flags], &mut v[53..55]);
    http::HeaderValue::from_bytes(&v).expect("hex digits and dashes are a header value")
}

/// The context sent upstream (a request extension, set when the slot is granted): the
/// `gateway.upstream` span, parent of the engine's spans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpstreamTrace(pub TraceContext);

/// How a request left the admission queue (the `sluice.queue.outcome` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueOutcome {
    Admitted,
    Shed,
    Timeout,
    Cancelled,
}

impl QueueOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Admitted => "admitted",
            Self::Shed => "shed",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The queue span's facts.
#[derive(Clone, Copy, Debug)]
pub struct QueueFacts {
    pub entered: Instant,
    /// Requests already waiting when this one arrived.
    pub depth: usize,
    pub left: Option<(Instant, QueueOutcome)>,
}

impl QueueFacts {
    /// When and how the wait ended, for a request that ended at `end`: a waiter that never
    /// left the queue was still in it when its client went away.
    pub fn left_by(&self, end: Instant) -> (Instant, QueueOutcome) {
        self.left.unwrap_or((end, QueueOutcome::Cancelled))
    }
}

/// The upstream span's facts.
#[derive(Clone, Debug)]
pub struct UpstreamFacts {
    pub span_id: [u8; 8],
    pub started: Instant,
    pub model: Option<Arc<str>>,
    pub first_byte: Option<Instant>,
    /// The replica that answered, by scheme and host (`http://10.0.0.7:8000`).
    pub replica: Option<String>,
}

/// How the request ended, for the spans.
#[derive(Clone, Copy, Debug)]
pub struct Ended<'a> {
    pub at: Instant,
    pub outcome: Outcome,
    /// The error code (`none` when there is none).
    pub code: &'a str,
    pub status: Option<u16>,
    pub output_tokens: Option<u64>,
}

/// Whether anyone takes spans: the process's sink, or the debug log that stands in for one.
pub fn wanted() -> bool {
    has_sink() || tracing::enabled!(target: "sluice_engine::trace::span", Level::DEBUG)
}

/// Builds the request's spans and hands them to the sink (none are built when no sink takes
/// them and the debug log, their other reader, is off).
pub fn emit(facts: &Facts, ended: &Ended<'_>) {
    if !wanted() {
        return;
    }
    let trace = facts.trace;
    let wall = |t: Instant| facts.arrived_wall + t.saturating_duration_since(facts.arrived);
    let span = |name, kind, span_id, start, end, attributes| SpanRecord {
        name,
        kind,
        trace_id: trace.span.trace_id,
        span_id,
        parent_id: Some(trace.span.parent_id),
        start: wall(start),
        end: wall(end),
        attributes,
    };
    let failed = ended.outcome != Outcome::Ok;
    let mut root = vec![
        ("sluice.outcome", ended.outcome.as_str().into()),
        ("sluice.class", facts.class.as_str().into()),
    ];
    if let Some(tenant) = &facts.tenant {
        root.push(("sluice.tenant", tenant.as_str().into()));
    }
    if let Some(s) = ended.status {
        root.push(("http.response.status_code", s.into()));
    }
    if failed {
        root.push(("error.type", error_type(ended).into()));
    }
    record(SpanRecord {
        parent_id: trace.parent.map(|p| p.parent_id),
        ..span(
            "gateway.request",
            SpanKind::Server,
            trace.span.parent_id,
            facts.arrived,
            ended.at,
            root,
        )
    });
    if let Some(q) = facts.queue {
        let (left, outcome) = q.left_by(ended.at);
        record(span(
            "gateway.queue",
            SpanKind::Internal,
            new_id(),
            q.entered,
            left,
            vec![
                ("sluice.class", facts.class.as_str().into()),
                ("sluice.queue.depth_on_entry", q.depth.into()),
                ("sluice.queue.outcome", outcome.as_str().into()),
                ("gen_ai.latency.time_in_queue", secs(left - q.entered)),
            ],
        ));
    }
    if let Some(u) = &facts.upstream {
        let mut attributes = vec![];
        if let Some(m) = &u.model {
            attributes.push(("gen_ai.request.model", AttrValue::Str(m.to_string())));
        }
        if let Some(r) = &u.replica {
            attributes.push(("sluice.upstream", r.as_str().into()));
        }
        if let Some(n) = facts.prompt_tokens {
            attributes.push(("gen_ai.usage.input_tokens", n.into()));
        }
        if let Some(n) = ended.output_tokens {
            attributes.push((
                "gen_ai.usage.output_tokens",
                AttrValue::Int(i64::try_from(n).unwrap_or(i64::MAX)),
            ));
        }
        if let Some(t) = u.first_byte {
            // As the client sees it: from arrival at the gateway, queueing included.
            attributes.push((
                "gen_ai.latency.time_to_first_token",
                secs(t - facts.arrived),
            ));
        }
        if failed {
            attributes.push(("error.type", error_type(ended).into()));
        }
        record(span(
            "gateway.upstream",
            SpanKind::Client,
            u.span_id,
            u.started,
            ended.at,
            attributes,
        ));
    }
}

fn error_type(ended: &Ended<'_>) -> String {
    if ended.code == "none" {
        ended.outcome.as_str().to_owned()
    } else {
        ended.code.to_owned()
    }
}

fn secs(d: Duration) -> AttrValue {
    d.as_secs_f64().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_built_in_place_is_the_contexts_text() {
        for header in [
            None,
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ] {
            let t = RequestTrace::from_header(header).span;
            assert_eq!(traceparent(&t), t.to_string().as_str());
        }
        let mut out = [0u8; 6];
        hex_into(&[0x00, 0xaf, 0x9e], &mut out);
        assert_eq!(&out, b"00af9e");
    }
}
