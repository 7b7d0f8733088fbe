//! The access log: one line a request when it ends, at level info under the target
//! [`TARGET`]: who called, which replica answered, how it ended (status, outcome, error code),
//! its tokens, and where its time went: waiting for a slot (`queue_ms`) apart from the rest
//! (`ttft_ms`, `duration_ms`, from arrival). Its `trace_id` finds the request's spans. Off with
//! `RUST_LOG=info,sluice::access=off`.

use tokio::time::Instant;

use super::record::Facts;
use super::spans::Ended;

/// The access lines' target.
pub const TARGET: &str = "sluice::access";

/// Logs the line of a request that ended so.
pub fn log(facts: &Facts, ended: &Ended<'_>) {
    if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return;
    }
    let queue_ms = facts
        .queue
        .as_ref()
        .map(|q| millis(q.entered, q.left_by(ended.at).0));
    let ttft_ms = facts
        .upstream
        .as_ref()
        .and_then(|u| u.first_byte)
        .map(|first| millis(facts.arrived, first));
    tracing::info!(
        target: TARGET,
        // The client's id and the policy's tenant name quoted (and escaped); the rest are the
        // gateway's own words.
        request_id = facts.request_id.as_str(),
        trace_id = %facts.trace.span.trace_id_hex(),
        tenant = facts.tenant.as_deref(),
        class = %facts.class.as_str(),
        path = %facts.path,
        upstream = facts.upstream.as_ref().and_then(|u| u.replica.as_deref()),
        status = ended.status,
        outcome = %ended.outcome.as_str(),
        code = %ended.code,
        prompt_tokens = facts.prompt_tokens.map(|n| n as u64),
        output_tokens = ended.output_tokens,
        queue_ms,
        ttft_ms,
        duration_ms = millis(facts.arrived, ended.at),
        "request"
    );
}

/// Whole milliseconds from `from` to `to`.
fn millis(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_millis() as u64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{advance, Instant};

    use super::super::captured::Captured;
    use super::super::spans::{Ended, QueueOutcome, RequestTrace};
    use super::super::{Outcome, RequestRecord};
    use crate::policy::Class;

    /// The lines `run` logs under the access log's target.
    async fn logged(run: impl std::future::Future<Output = ()>) -> String {
        let lines = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        let _in_force = tracing::subscriber::set_default(subscriber);
        run.await;
        lines.text()
    }

    /// A request's end now.
    fn ended(
        outcome: Outcome,
        code: &'static str,
        status: Option<u16>,
        output_tokens: Option<u64>,
    ) -> Ended<'static> {
        Ended {
            at: Instant::now(),
            outcome,
            code,
            status,
            output_tokens,
        }
    }

    fn record(id: &str) -> RequestRecord {
        RequestRecord::new(
            Instant::now(),
            RequestTrace::from_header(None),
            id,
            "/v1/chat/completions",
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_served_request_is_one_line_with_its_wait_apart_from_its_first_token() {
        let r = record("req-1");
        let text = logged(async {
            r.set_caller(Some("alice"), Class::Batch);
            r.set_prompt_tokens(812);
            r.queue_entered(3);
            advance(Duration::from_millis(1500)).await;
            r.granted();
            r.answered_by("http://10.0.0.7:8000".into());
            advance(Duration::from_millis(700)).await;
            r.first_byte();
            advance(Duration::from_millis(300)).await;
            let ended = ended(Outcome::Ok, "none", Some(200), Some(64));
            r.finish(&ended);
            // Once: a second end (the body's, after the guard's) logs nothing.
            r.finish(&ended);
        })
        .await;
        let trace_id = r.facts().trace.span.trace_id_hex();
        let want = format!(
            " INFO sluice::access: request request_id=\"req-1\" trace_id={trace_id} \
             tenant=\"alice\" class=batch path=/v1/chat/completions \
             upstream=\"http://10.0.0.7:8000\" status=200 outcome=ok \
             code=none prompt_tokens=812 output_tokens=64 queue_ms=1500 ttft_ms=2200 \
             duration_ms=2500\n"
        );
        assert_eq!(text, want);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_has_its_code_and_no_tenant_nor_first_token() {
        let r = record("req-2");
        let text = logged(async {
            r.queue_entered(16);
            advance(Duration::from_secs(60)).await;
            r.queue_refused(QueueOutcome::Timeout);
            r.finish(&ended(Outcome::Timeout, "queue_timeout", Some(503), None));
        })
        .await;
        assert!(
            text.contains(" status=503 outcome=timeout code=queue_timeout "),
            "{text}"
        );
        assert!(
            text.contains(" queue_ms=60000 duration_ms=60000\n"),
            "{text}"
        );
        for absent in [
            "tenant=",
            "upstream=",
            "ttft_ms=",
            "output_tokens=",
            "prompt_tokens=",
        ] {
            assert!(!text.contains(absent), "{text}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_left_while_queued_waited_until_it_left() {
        let r = record("req-3");
        let text = logged(async {
            r.queue_entered(2);
            advance(Duration::from_millis(4200)).await;
            r.finish(&ended(Outcome::Cancelled, "none", None, None));
        })
        .await;
        assert!(
            text.contains(" outcome=cancelled code=none queue_ms=4200 duration_ms=4200\n"),
            "{text}"
        );
    }
}
