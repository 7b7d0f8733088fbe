//! How a request ended. Every request the stack accepts ends in exactly one outcome, recorded
//! once: by the error that refused it, by its response body's end, or — when the client went
//! away first — by the guard or the body dropped unfinished.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;

use super::record::{Facts, RequestRecord};
use super::spans::Ended;
use super::usage::UsageScanner;
use super::Metrics;
use crate::body::{output, BoxError, GatewayBody, Tap, TapBody};
use crate::error::GatewayError;

/// The ways a request ends (the `outcome` label of `sluice_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// The whole response was sent, with a success status.
    Ok,
    /// Refused with an error the client can act on (4xx: auth, limits, bad input).
    Rejected,
    /// Shed by admission (503 `overloaded`), or by an upstream's own 503.
    Shed,
    /// Waited past `queue_wait_max` (503 `queue_timeout`).
    Timeout,
    /// The client went away first.
    Cancelled,
    /// The upstream or the gateway failed (5xx other than shedding, or a broken stream).
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Self::Ok,
        Self::Rejected,
        Self::Shed,
        Self::Timeout,
        Self::Cancelled,
        Self::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Shed => "shed",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }

    /// The outcome of a refusal.
    pub fn of_error(e: &GatewayError) -> Self {
        match e {
            GatewayError::Overloaded { .. }
            | GatewayError::UpstreamBusy { .. }
            | GatewayError::DeadlineUnmeetable { .. } => Self::Shed,
            GatewayError::QueueTimeout { .. } => Self::Timeout,
            e if e.class().status.is_client_error() => Self::Rejected,
            _ => Self::Error,
        }
    }

    /// The outcome of a response with `status` whose body was sent whole.
    pub fn of_status(status: StatusCode) -> Self {
        if status.is_success() {
            Self::Ok
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            Self::Shed
        } else if status.is_client_error() {
            Self::Rejected
        } else {
            Self::Error
        }
    }
}

/// The `code` label of an upstream response with `status`.
fn status_code_label(status: StatusCode) -> &'static str {
    if status.is_success() {
        "none"
    } else {
        "upstream_error"
    }
}

/// Records `Cancelled` if dropped before [`OutcomeGuard::disarm`]: the client went away while
/// its request was still being admitted or waiting for the upstream's headers.
#[derive(Debug)]
pub struct OutcomeGuard {
    end: Option<(Arc<Metrics>, RequestRecord)>,
}

impl OutcomeGuard {
    /// Counts the request as accepted.
    pub fn accept(metrics: Arc<Metrics>, record: RequestRecord) -> Self {
        metrics.accepted();
        Self {
            end: Some((metrics, record)),
        }
    }

    /// The request ended with an error response.
    pub fn refused(mut self, e: &GatewayError) {
        if let Some((m, r)) = self.end.take() {
            let ended = Ended {
                at: tokio::time::Instant::now(),
                outcome: Outcome::of_error(e),
                code: e.code(),
                status: Some(e.class().status.as_u16()),
                output_tokens: None,
            };
            count_end(&m, &r, &ended);
        }
    }

    /// The response started: its body records the end.
    pub fn respond(mut self, body: GatewayBody, status: StatusCode) -> GatewayBody {
        let ending = Ending {
            status,
            end: self.end.take(),
            usage: UsageScanner::default(),
            seen_output: false,
            stream_error: false,
        };
        TapBody::new(body, ending).boxed_unsync()
    }
}

impl Drop for OutcomeGuard {
    fn drop(&mut self) {
        if let Some((m, r)) = self.end.take() {
            let ended = Ended {
                at: tokio::time::Instant::now(),
                outcome: Outcome::Cancelled,
                code: "none",
                status: None,
                output_tokens: None,
            };
            count_end(&m, &r, &ended);
        }
    }
}

/// Records the request's outcome, durations and tokens when its response body ends, fails or
/// is dropped.
#[derive(Debug)]
struct Ending {
    status: StatusCode,
    end: Option<(Arc<Metrics>, RequestRecord)>,
    usage: UsageScanner,
    seen_output: bool,
    /// The stream carried an error event (`data: {"error": ...}`): it failed, even if it then
    /// ended cleanly with `[DONE]`.
    stream_error: bool,
}

impl Ending {
    /// The outcome and code of a body that ended cleanly.
    fn clean_end(&self) -> (Outcome, &'static str) {
        if self.stream_error {
            (Outcome::Error, "stream_error")
        } else {
            (
                Outcome::of_status(self.status),
                status_code_label(self.status),
            )
        }
    }

    fn end(&mut self, outcome: Outcome, code: &str) {
        let Some((m, r)) = self.end.take() else {
            return;
        };
        let at = tokio::time::Instant::now();
        let output_tokens = self.usage.completion_tokens();
        let ended = Ended {
            at,
            outcome,
            code,
            status: Some(self.status.as_u16()),
            output_tokens,
        };
        let Some(facts) = count_end(&m, &r, &ended) else {
            return;
        };
        m.request_duration.observe(at - facts.arrived);
        if let Some(n) = facts.prompt_tokens {
            m.input_tokens.observe_value(n as f64);
        }
        if let Some(n) = output_tokens {
            m.output_tokens.observe_value(n as f64);
        }
    }
}

/// Finishes the request's record (the access line, the spans) and counts how it ended
/// (`sluice_requests_total`, and its tenant's usage when it has one): once, from the facts the
/// record gives back the first time; those facts, then.
fn count_end(m: &Metrics, r: &RequestRecord, ended: &Ended<'_>) -> Option<Facts> {
    let facts = r.finish(ended)?;
    m.ended(ended.outcome, ended.code, facts.class);
    if let Some(tenant) = &facts.tenant {
        // Prompt tokens count once sent upstream: what the tenant was served.
        let sent = facts.upstream.as_ref().and(facts.prompt_tokens);
        m.tenants
            .ended(tenant, ended.outcome, sent, ended.output_tokens);
    }
    Some(facts)
}

impl Tap for Ending {
    fn data(&mut self, data: &Bytes) {
        // The first token, not the first bytes: a stream's role event comes before any
        // prefill (see [`output`]).
        if !self.seen_output && output::scan(data).past_prefill() {
            self.seen_output = true;
            if let Some((m, r)) = &self.end {
                m.time_to_first_token.observe(r.facts().arrived.elapsed());
                r.first_byte();
            }
        }
        self.usage.push(data);
        if data.starts_with(b"data: {\"error\"") {
            self.stream_error = true;
        }
    }

    fn ended(&mut self, result: Result<(), &BoxError>) {
        match result {
            Ok(()) => {
                let (o, code) = self.clean_end();
                self.end(o, code);
            }
            Err(_) => self.end(Outcome::Error, "upstream_broke_off"),
        }
    }

    fn dropped(&mut self, complete: bool) {
        if complete {
            let (o, code) = self.clean_end();
            self.end(o, code);
        } else {
            self.end(Outcome::Cancelled, "none");
        }
    }
}
