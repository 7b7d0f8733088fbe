//! The open loop: requests arrive on a schedule fixed in advance, whether or not earlier ones
//! have finished, as users do. At most C are in flight; later arrivals wait in the client, and
//! their latency is measured from the *arrival*, so a slow server cannot hide its backlog by
//! slowing the generator (coordinated omission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinSet;

use super::feed::Feed;
use super::{record, Arrivals, Bound, Record, Target};
use crate::client::Connection;
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::scenario::Job;

#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub arrivals: Arrivals,
    pub concurrency: usize,
    pub bound: Bound,
    pub seed: u64,
}

/// The arrival offsets (seconds after the start) of a run: the first at 0, then gaps of
/// `1 / rate` or exponential ones; cut at `bound`'s count and duration.
pub fn schedule(arrivals: Arrivals, bound: &Bound, seed: u64) -> impl Iterator<Item = f64> {
    let mut rng = Rng::new(seed, 0x0a11_7a15);
    let limit = bound.duration.map_or(f64::INFINITY, |d| d.as_secs_f64());
    let mut next = 0.0;
    std::iter::from_fn(move || {
        let now = next;
        next += match arrivals {
            Arrivals::Fixed(rate) => 1.0 / rate,
            Arrivals::Poisson(rate) => rng.exponential(rate),
        };
        Some(now)
    })
    .take(bound.requests.unwrap_or(usize::MAX))
    .take_while(move |&t| t < limit)
}

type Queue = Arc<Mutex<mpsc::UnboundedReceiver<(Job, Instant)>>>;

pub(super) async fn run(
    plan: &Plan,
    target: &Target,
    feed: Feed,
    progress: &Progress,
) -> Result<Vec<Record>> {
    let (tx, rx) = mpsc::unbounded_channel::<(Job, Instant)>();
    let queue: Queue = Arc::new(Mutex::new(rx));
    let start = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..plan.concurrency {
        let (queue, progress) = (queue.clone(), progress.clone());
        let mut conn = Connection::new(target.endpoint.clone());
        let target = target.clone();
        workers.spawn(async move {
            let mut records = Vec::new();
            loop {
                let next = queue.lock().await.recv().await;
                let Some((job, arrival)) = next else { break };
                let sent = Instant::now();
                let sample = super::send(&mut conn, &target, &job).await;
                progress.finished(sample.outcome.is_ok());
                records.push(record(start, arrival, sent, &job, sample));
            }
            records
        });
    }
    let mut failure = None;
    for offset in schedule(plan.arrivals, &plan.bound, plan.seed) {
        let job = match feed.next().await {
            Some(Ok(job)) => job,
            Some(Err(e)) => {
                failure = Some(e);
                break;
            }
            None => break,
        };
        let due = start + Duration::from_secs_f64(offset);
        tokio::time::sleep_until(due.into()).await;
        if tx.send((job, due)).is_err() {
            break;
        }
    }
    drop(tx);
    let mut records = Vec::new();
    while let Some(done) = workers.join_next().await {
        records.extend(done.map_err(|e| Error::Config(format!("a worker failed: {e}")))?);
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(records),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_schedules_are_exact_and_cut_by_count_and_duration() {
        let by_count = Bound {
            requests: Some(4),
            duration: None,
        };
        let got: Vec<f64> = schedule(Arrivals::Fixed(2.0), &by_count, 1).collect();
        assert_eq!(got, [0.0, 0.5, 1.0, 1.5]);
        let by_time = Bound {
            requests: None,
            duration: Some(Duration::from_millis(1200)),
        };
        assert_eq!(schedule(Arrivals::Fixed(5.0), &by_time, 1).count(), 6);
        let both = Bound {
            requests: Some(3),
            duration: Some(Duration::from_secs(100)),
        };
        assert_eq!(schedule(Arrivals::Fixed(5.0), &both, 1).count(), 3);
    }

    #[test]
    fn poisson_schedules_have_the_rate_and_are_reproducible() {
        let bound = Bound {
            requests: None,
            duration: Some(Duration::from_secs(10_000)),
        };
        let a: Vec<f64> = schedule(Arrivals::Poisson(2.0), &bound, 9).collect();
        // 20,000 expected; a Poisson count's sd is ~141.
        assert!((a.len() as f64 - 20_000.0).abs() < 700.0, "{}", a.len());
        assert!(a.windows(2).all(|w| w[1] >= w[0]));
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1] - w[0]).collect();
        // Exponential gaps: as many below the mean's ln 2 as above.
        let below = gaps
            .iter()
            .filter(|&&g| g < 0.5 * std::f64::consts::LN_2)
            .count();
        assert!((below as f64 / gaps.len() as f64 - 0.5).abs() < 0.02);
        let b: Vec<f64> = schedule(Arrivals::Poisson(2.0), &bound, 9)
            .take(50)
            .collect();
        assert_eq!(&a[..50], &b[..]);
    }
}
