//! When requests go: a closed loop (C workers back to back) or an open loop (arrivals on a
//! schedule, fixed or Poisson, whatever the server does), each bounded by a request count, a
//! duration or both, and stopping by itself.

mod closed;
mod feed;
mod open;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{Connection, Endpoint, Outcome, Sample};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::scenario::JobSource;

pub use open::schedule;

/// When open-loop requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Every `1 / rate` seconds.
    Fixed(f64),
    /// A Poisson process of this rate: exponential gaps.
    Poisson(f64),
}

impl Arrivals {
    pub fn rate(&self) -> f64 {
        match *self {
            Self::Fixed(r) | Self::Poisson(r) => r,
        }
    }
}

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workload {
    /// `concurrency` workers, each sending its next request when its last one ends.
    Closed { concurrency: usize },
    /// Requests arrive on a schedule; at most `concurrency` are in flight, the rest wait
    /// client-side (that wait is in arrival-to-end, not in sent-to-end).
    Open {
        arrivals: Arrivals,
        concurrency: usize,
    },
}

impl Workload {
    pub fn concurrency(&self) -> usize {
        match *self {
            Self::Closed { concurrency } | Self::Open { concurrency, .. } => concurrency,
        }
    }

    /// The open loop's arrival rate.
    pub fn rate(&self) -> Option<f64> {
        match self {
            Self::Closed { .. } => None,
            Self::Open { arrivals, .. } => Some(arrivals.rate()),
        }
    }
}

/// When a run stops: after `requests`, or when `duration` has passed (no new request starts
/// after it; those in flight finish), whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Bound {
    pub requests: Option<usize>,
    pub duration: Option<Duration>,
}

/// The server under test.
#[derive(Debug, Clone)]
pub struct Target {
    pub endpoint: Arc<Endpoint>,
    /// Per request, from its send to its last byte.
    pub timeout: Duration,
    /// How many times a request refused with 429 or 503 and a `Retry-After` is sent again,
    /// after waiting what the server asked (at most [`RETRY_WAIT_MAX`]), as the OpenAI SDKs do
    /// (twice by default). 0: the refusal is the request's outcome.
    pub retries: u32,
}

/// The longest `Retry-After` a retry waits (the OpenAI SDKs honour up to a minute).
pub const RETRY_WAIT_MAX: Duration = Duration::from_secs(60);

/// Sends `job` on `conn`, and again after each refusal the target's `retries` allow: the
/// last answer, its times counted from the first send.
pub(crate) async fn send(
    conn: &mut Connection,
    target: &Target,
    job: &crate::scenario::Job,
) -> Sample {
    let first = Instant::now();
    let mut retries = 0;
    loop {
        let attempt = Instant::now();
        let mut sample = conn.send(job.api, job.body.clone(), target.timeout).await;
        let refused = matches!(
            sample.outcome,
            Outcome::Http {
                status: 429 | 503,
                ..
            }
        );
        match sample.retry_after {
            Some(wait) if refused && retries < target.retries => {
                tokio::time::sleep(wait.min(RETRY_WAIT_MAX)).await;
                retries += 1;
            }
            _ => {
                let before = attempt - first;
                sample.e2e += before;
                sample.ttft = sample.ttft.map(|t| t + before);
                sample.retries = retries;
                return sample;
            }
        }
    }
}

/// One request as the run saw it.
#[derive(Debug, Clone)]
pub struct Record {
    pub sample: Sample,
    /// When the request arrived (was due), since the run started. A closed loop's requests
    /// arrive when they are sent.
    pub arrival: Duration,
    /// When it was sent; later than `arrival` when the client's own concurrency was used up.
    pub sent: Duration,
    /// The job's kind (`256:128`, `needle@50%`).
    pub kind: String,
    /// Whether the answer passed its check; `None` when unscored.
    pub passed: Option<bool>,
}

impl Record {
    /// Arrival → last byte: what a user whose request joined a client-side queue waited.
    pub fn arrival_to_end(&self) -> Duration {
        self.sent - self.arrival + self.sample.e2e
    }

    /// Arrival → first token.
    pub fn arrival_to_first(&self) -> Option<Duration> {
        self.sample.ttft.map(|t| self.sent - self.arrival + t)
    }
}

/// Every record (in arrival order) and the wall time, first arrival to last byte.
#[derive(Debug, Clone)]
pub struct Run {
    pub records: Vec<Record>,
    pub wall: Duration,
    /// The bound's duration, when it had one: the span an open loop's arrivals were scheduled
    /// over. A rate per second of arrivals divides by this, not by the last arrival (which
    /// falls short of it by chance) nor the wall time (which the drain stretches).
    pub duration: Option<Duration>,
}

/// Runs `workload` against `target` until `bound`; `seed` draws Poisson arrivals.
pub async fn run(
    workload: &Workload,
    bound: &Bound,
    target: &Target,
    jobs: Arc<dyn JobSource>,
    seed: u64,
    progress: &Progress,
) -> Result<Run> {
    if bound.requests.is_none() && bound.duration.is_none() {
        return Err(Error::Config(
            "a run needs a request count or a duration".into(),
        ));
    }
    if bound.requests == Some(0) {
        return Err(Error::Config("a run needs at least one request".into()));
    }
    if workload.concurrency() == 0 {
        return Err(Error::Config("concurrency must be at least 1".into()));
    }
    let start_run = |prime| feed::Feed::start(jobs, bound.requests, prime);
    let mut records = match *workload {
        Workload::Closed { concurrency } => {
            let feed = start_run(concurrency).await?;
            closed::run(concurrency, bound.duration, target, feed, progress).await?
        }
        Workload::Open {
            arrivals,
            concurrency,
        } => {
            if !(arrivals.rate().is_finite() && arrivals.rate() > 0.0) {
                return Err(Error::Config("the arrival rate must be positive".into()));
            }
            let feed = start_run(1).await?;
            let plan = open::Plan {
                arrivals,
                concurrency,
                bound: *bound,
                seed,
            };
            open::run(&plan, target, feed, progress).await?
        }
    };
    records.sort_by_key(|r| r.arrival);
    let wall = records
        .iter()
        .map(|r| r.sent + r.sample.e2e)
        .max()
        .unwrap_or_default();
    progress.done();
    Ok(Run {
        records,
        wall,
        duration: bound.duration,
    })
}

/// A record of `sample`, sent at `sent` for a request due at `arrival` (both instants).
pub(crate) fn record(
    start: Instant,
    arrival: Instant,
    sent: Instant,
    job: &crate::scenario::Job,
    sample: Sample,
) -> Record {
    let passed = job.check.score(&sample);
    Record {
        arrival: arrival - start,
        sent: sent - start,
        kind: job.kind.clone(),
        passed,
        sample,
    }
}
