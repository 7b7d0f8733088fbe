//! A request's hold on a replica: counted as outstanding from the pick until the response
//! body ends (the lease travels inside the body), and the way the request's fate reaches the
//! replica's health.

use std::sync::Arc;

use http::StatusCode;

use super::replica::Replica;
use super::Shared;
use crate::forward::upstream::Target;

/// Where one attempt goes.
#[derive(Debug)]
pub struct Lease {
    pub target: Target,
    held: Option<Held>,
}

#[derive(Debug)]
struct Held {
    replica: Arc<Replica>,
    pool: Arc<Shared>,
}

impl Lease {
    /// A target without replica bookkeeping (a fixed URL, the bundled engine).
    pub fn fixed(target: Target) -> Self {
        Self { target, held: None }
    }

    pub(super) fn held(replica: Arc<Replica>, pool: Arc<Shared>) -> Self {
        replica.take();
        Self {
            target: replica.target.clone(),
            held: Some(Held { replica, pool }),
        }
    }

    /// The replica's index in the pool, if it is one.
    pub fn replica(&self) -> Option<usize> {
        self.held.as_ref().map(|h| h.replica.index)
    }

    /// The attempt failed: no connection, no answer in time, or a broken stream.
    pub fn failed(&self) {
        if let Some(h) = &self.held {
            if h.replica.failed(&h.pool.thresholds()) {
                tracing::warn!(replica = %h.replica.target.base, "replica ejected after consecutive failures");
                h.pool.refresh_capacity();
            }
        }
    }

    /// The replica answered with `status`: 5xx other than 503 (an engine shedding load is
    /// healthy) counts as a failure, anything else as a success.
    pub fn answered(&self, status: StatusCode) {
        if self.held.is_none() {
            return;
        }
        if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            self.failed();
        } else {
            self.succeeded();
        }
    }

    /// The attempt succeeded (a stream counts once it has ended well).
    pub fn succeeded(&self) {
        if let Some(h) = &self.held {
            h.replica.succeeded();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(h) = &self.held {
            h.replica.give_back();
        }
    }
}
