//! Request bodies built ahead of the senders, off the async runtime: a long prompt is
//! tokenizer work, and building it in a sender would count it as the server's latency.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{mpsc, Mutex};

use crate::error::{Error, Result};
use crate::scenario::{Job, JobSource};

/// Jobs built ahead of this many requests.
const AHEAD: usize = 4;

/// Jobs `0, 1, 2, ...` (up to the limit), shared by the senders.
#[derive(Debug)]
pub(super) struct Feed {
    inner: Mutex<(VecDeque<Job>, mpsc::Receiver<Result<Job>>)>,
}

fn build(jobs: &Arc<dyn JobSource>, range: std::ops::Range<u64>) -> Result<Vec<Job>> {
    range.map(|n| jobs.job(n)).collect()
}

impl Feed {
    /// Builds the first `prime` jobs before returning (so that a run's clock starts with
    /// requests ready), then keeps [`AHEAD`] more ready in the background.
    pub(super) async fn start(
        jobs: Arc<dyn JobSource>,
        limit: Option<usize>,
        prime: usize,
    ) -> Result<Self> {
        let limit = limit.map_or(u64::MAX, |l| l as u64);
        let primed = prime.max(1) as u64;
        let primed = primed.min(limit);
        let first = {
            let jobs = jobs.clone();
            tokio::task::spawn_blocking(move || build(&jobs, 0..primed))
                .await
                .map_err(|e| Error::Prompt(format!("building prompts: {e}")))??
        };
        let (tx, rx) = mpsc::channel(AHEAD);
        tokio::spawn(async move {
            for n in primed..limit {
                let jobs = jobs.clone();
                let job = tokio::task::spawn_blocking(move || jobs.job(n))
                    .await
                    .unwrap_or_else(|e| Err(Error::Prompt(format!("building prompts: {e}"))));
                // The run is over (or failed) when nobody listens.
                if tx.send(job).await.is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            inner: Mutex::new((first.into(), rx)),
        })
    }

    /// The next job; `None` once the limit is reached.
    pub(super) async fn next(&self) -> Option<Result<Job>> {
        let mut inner = self.inner.lock().await;
        if let Some(job) = inner.0.pop_front() {
            return Some(Ok(job));
        }
        inner.1.recv().await
    }
}
