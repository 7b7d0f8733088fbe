//! The closed loop: C workers, each sending its next request as soon as its last one ended.
//! The offered load is whatever the server sustains, so latency here is service time alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::feed::Feed;
use super::{record, Record, Target};
use crate::client::Connection;
use crate::error::{Error, Result};
use crate::progress::Progress;

pub(super) async fn run(
    concurrency: usize,
    duration: Option<Duration>,
    target: &Target,
    feed: Feed,
    progress: &Progress,
) -> Result<Vec<Record>> {
    let feed = Arc::new(feed);
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let (feed, progress) = (feed.clone(), progress.clone());
        let mut conn = Connection::new(target.endpoint.clone());
        let target = target.clone();
        workers.spawn(async move {
            let mut records = Vec::new();
            while deadline.is_none_or(|d| Instant::now() < d) {
                let Some(job) = feed.next().await else { break };
                let job = job?;
                let sent = Instant::now();
                let sample = super::send(&mut conn, &target, &job).await;
                progress.finished(sample.outcome.is_ok());
                records.push(record(start, sent, sent, &job, sample));
            }
            Ok::<_, Error>(records)
        });
    }
    let mut records = Vec::new();
    while let Some(done) = workers.join_next().await {
        let done = done.map_err(|e| Error::Config(format!("a worker failed: {e}")))?;
        records.extend(done?);
    }
    Ok(records)
}
