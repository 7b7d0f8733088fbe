//! A request's trace: `gateway.request` from arrival to the last byte, with two children that
//! never overlap and together cover it — `gateway.queue` (arrival at admission until a slot is
//! granted, or the refusal) and `gateway.upstream` (slot granted until the last byte). The
//! engine's spans hang under `gateway.upstream` through the `traceparent` sent upstream.
//!
//! The layers note the moments in the [`RequestRecord`](super::RequestRecord); the spans are
//! built once, when the request ends, and handed to the process's span sink (OTLP export).

use std::sync::Arc;
use std::time::Duration;

use sluice_engine::trace::{new_id, record, AttrValue, SpanKind, SpanRecord, TraceContext};
use tokio::time::Instant;

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

/// The upstream span's facts.
#[derive(Clone, Debug)]
pub struct UpstreamFacts {
    pub span_id: [u8; 8],
    pub started: Instant,
    pub model: Option<Arc<str>>,
    pub first_byte: Option<Instant>,
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

/// Builds the request's spans and hands them to the sink.
pub fn emit(facts: &Facts, ended: &Ended<'_>) {
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
        let (left, outcome) = q.left.unwrap_or((ended.at, QueueOutcome::Cancelled));
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
