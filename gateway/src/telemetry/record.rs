//! What the layers learn about a request, shared with the code that records its outcome at the
//! end: layer 1 inserts a [`RequestRecord`] extension, the layers below fill it in.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use sluice_engine::trace::TraceContext;
use tokio::time::Instant;

use super::spans::{emit, Ended, QueueFacts, QueueOutcome, RequestTrace, UpstreamFacts};
use crate::policy::Class;

/// A request's facts so far (a request extension; clones share it).
#[derive(Clone, Debug)]
pub struct RequestRecord(Arc<Mutex<Facts>>);

/// The facts.
#[derive(Clone, Debug)]
pub struct Facts {
    pub arrived: Instant,
    /// The same moment on the wall clock (the spans' timestamps are anchored here).
    pub arrived_wall: SystemTime,
    pub trace: RequestTrace,
    /// The request's `x-request-id` (the client's, or the one the gateway gave it).
    pub request_id: String,
    /// The endpoint (`/v1/chat/completions` or `/v1/completions`: the stack serves no other).
    pub path: String,
    /// The tenant, once authenticated; none while the gateway runs open or before auth.
    pub tenant: Option<String>,
    pub class: Class,
    /// The prompt's length, once counted.
    pub prompt_tokens: Option<usize>,
    /// Set on arrival at admission.
    pub queue: Option<QueueFacts>,
    /// Set when the slot is granted.
    pub upstream: Option<UpstreamFacts>,
    /// The spans went out (they go once).
    finished: bool,
}

impl RequestRecord {
    pub fn new(arrived: Instant, trace: RequestTrace, request_id: &str, path: &str) -> Self {
        Self(Arc::new(Mutex::new(Facts {
            arrived,
            arrived_wall: SystemTime::now(),
            trace,
            request_id: request_id.into(),
            path: path.into(),
            tenant: None,
            class: Class::Interactive,
            prompt_tokens: None,
            queue: None,
            upstream: None,
            finished: false,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Facts> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn facts(&self) -> Facts {
        self.lock().clone()
    }

    /// Who called (the tenant, none when the gateway runs open) and in which class.
    pub fn set_caller(&self, tenant: Option<&str>, class: Class) {
        let mut f = self.lock();
        f.tenant = tenant.map(str::to_owned);
        f.class = class;
    }

    pub fn set_prompt_tokens(&self, n: usize) {
        self.lock().prompt_tokens = Some(n);
    }

    /// Arrived at admission, behind `depth` waiting requests.
    pub fn queue_entered(&self, depth: usize) {
        self.lock().queue = Some(QueueFacts {
            entered: Instant::now(),
            depth,
            left: None,
        });
    }

    /// Refused by admission (shed or timed out).
    pub fn queue_refused(&self, outcome: QueueOutcome) {
        let now = Instant::now();
        let mut f = self.lock();
        let q = f.queue.get_or_insert(QueueFacts {
            entered: now,
            depth: 0,
            left: None,
        });
        q.left = Some((now, outcome));
    }

    /// A slot was granted: the queue span ends and the upstream span starts at this one
    /// instant. Returns the context to send upstream.
    pub fn granted(&self) -> TraceContext {
        let now = Instant::now();
        let span_id = sluice_engine::trace::new_id();
        let mut f = self.lock();
        if let Some(q) = &mut f.queue {
            q.left = Some((now, QueueOutcome::Admitted));
        }
        f.upstream = Some(UpstreamFacts {
            span_id,
            started: now,
            model: None,
            first_byte: None,
            replica: None,
        });
        f.trace.span.child(span_id)
    }

    /// The model the request names (`gen_ai.request.model`; kept only for spans someone takes).
    pub fn set_model(&self, model: &str) {
        if !super::spans::wanted() {
            return;
        }
        if let Some(u) = &mut self.lock().upstream {
            u.model = Some(model.into());
        }
    }

    /// The replica `shown` (by scheme, host and port: [`crate::forward::Target::shown`])
    /// answered: its headers came.
    pub fn answered_by(&self, shown: String) {
        if let Some(u) = &mut self.lock().upstream {
            u.replica = Some(shown);
        }
    }

    /// The response's first token went out (its first event with output, see
    /// [`crate::body::output`]).
    pub fn first_byte(&self) {
        let now = Instant::now();
        if let Some(u) = &mut self.lock().upstream {
            u.first_byte.get_or_insert(now);
        }
    }

    /// The request ended: its access line is logged and its spans go to the sink, once; the
    /// facts they were built from, the first time.
    pub fn finish(&self, ended: &Ended<'_>) -> Option<Facts> {
        let facts = {
            let mut f = self.lock();
            if std::mem::replace(&mut f.finished, true) {
                return None;
            }
            f.clone()
        };
        super::access::log(&facts, ended);
        emit(&facts, ended);
        Some(facts)
    }
}
