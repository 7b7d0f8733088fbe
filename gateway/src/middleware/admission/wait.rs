//! Waiting in the queue: until a slot is granted, the queue sheds the waiter, its prediction
//! misses its TTFT deadline (re-checked every [`RECHECK_EVERY`]), `queue_wait_max` passes since
//! it arrived (the limit in force, read again at every re-check: a reload that shortens it
//! applies to the waiters too), or the client goes away (the future is dropped, which leaves the
//! queue).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::queue::{Admission, Arrival, Permit, Ticket};
use crate::error::GatewayError;

/// How often a waiter re-checks its deadline against its prediction.
pub const RECHECK_EVERY: Duration = Duration::from_millis(250);

/// A slot, and how long the request waited for it.
#[derive(Debug)]
pub struct Admitted {
    pub permit: Permit,
    pub queued: Duration,
}

/// Takes a slot for `ticket`, waiting in the queue when there is none free.
pub async fn acquire(admission: Arc<Admission>, ticket: Ticket) -> Result<Admitted, GatewayError> {
    acquire_or(admission, ticket, || ()).await
}

/// [`acquire`], calling `queued` when the request has to wait in the queue.
pub async fn acquire_or(
    admission: Arc<Admission>,
    ticket: Ticket,
    queued: impl FnOnce(),
) -> Result<Admitted, GatewayError> {
    let (id, rx, arrived) = match admission.arrive(ticket)? {
        Arrival::Granted(permit) => {
            return Ok(Admitted {
                permit,
                queued: Duration::ZERO,
            })
        }
        Arrival::Queued { id, rx, arrived } => (id, rx, arrived),
    };
    queued();
    let mut place = Place {
        admission,
        id,
        rx: Some(rx),
    };
    let answer = loop {
        // A deadline fixed on arrival outlived a reload that cut queue_wait_max (3600 s → 10 s
        // left the queued waiting up to an hour, before 2026-12-04).
        let deadline = arrived + place.admission.queue_wait_max();
        let recheck = tokio::time::sleep(RECHECK_EVERY);
        tokio::select! {
            biased;
            answer = place.rx() => break answer,
            () = tokio::time::sleep_until(deadline) => {
                if place.admission.leave(id) {
                    place.rx = None;
                    return Err(GatewayError::QueueTimeout {
                        waited: arrived.elapsed(),
                    });
                }
                // Granted or shed just as the deadline passed: the answer is in the channel.
                break place.rx().await;
            }
            // A refusal comes through the channel, read first on the next turn.
            () = recheck => place.admission.recheck(),
        }
    };
    place.rx = None;
    let permit = answer?;
    Ok(Admitted {
        permit,
        queued: arrived.elapsed(),
    })
}

/// A place in the queue, given up when dropped before its answer came.
struct Place {
    admission: Arc<Admission>,
    id: u64,
    rx: Option<oneshot::Receiver<Result<Permit, GatewayError>>>,
}

impl Place {
    async fn rx(&mut self) -> Result<Permit, GatewayError> {
        let Some(rx) = self.rx.as_mut() else {
            return Err(GatewayError::Internal(
                "queue place already answered".into(),
            ));
        };
        rx.await
            .unwrap_or_else(|_| Err(GatewayError::Internal("admission queue dropped".into())))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.rx.is_some() {
            // The lock is taken and released inside `leave`, before `rx` drops: a permit
            // already sent through it then frees its slot without deadlocking.
            self.admission.leave(self.id);
        }
    }
}
