//! The shared token budget: every charge of the last minute in Redis (id → time, id → tokens,
//! and their running sum), charged on arrival (in the arrival's script, [`super::arrive`]) and
//! settled at the end, together with the release of the request's lease when it has one
//! (`lua/finish.lua`, through [`Finish`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::finish::Finish;
use super::Lease;

/// The window a budget covers.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A charge in Redis that can still be lowered to what the request used.
#[derive(Debug)]
pub struct Charge {
    finish: Arc<Finish>,
}

impl Charge {
    pub(super) fn new(finish: Arc<Finish>) -> Self {
        Self { finish }
    }

    /// Lowers the charge to `tokens` (never raises it) when the request's holdings go back (a
    /// settle lost to an unavailable Redis keeps the whole reservation, which leaves the window
    /// in a minute).
    pub fn settle(&self, tokens: u64) {
        self.finish.settle(tokens);
    }
}

/// What the arrival leaves in the request for the shared ceiling's layer: the lease taken on
/// arrival (if any), and the charge's end that the request's lease joins (if it has a budget).
/// A lease not taken goes back at once when given back ([`Self::give_back_lease`]: the request
/// has to wait for its local slot) or when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct Arrival {
    lease: Arc<Mutex<Option<Lease>>>,
    finish: Option<Arc<Finish>>,
}

impl Arrival {
    pub(super) fn new(lease: Option<Lease>, finish: Option<Arc<Finish>>) -> Self {
        Self {
            lease: Arc::new(Mutex::new(lease)),
            finish,
        }
    }

    /// The lease taken on arrival, once, joined to the charge's end.
    pub fn take_lease(&self) -> Option<Lease> {
        let lease = self
            .lease
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        Some(self.join(lease))
    }

    /// Gives the lease taken on arrival back now: the request waits for its local slot, and
    /// the shared ceiling's stage takes a lease again once it has one.
    pub fn give_back_lease(&self) {
        drop(self.lease.lock().unwrap_or_else(|e| e.into_inner()).take());
    }

    /// Makes `lease` go back with the charge's settle, when there is a charge.
    pub fn join(&self, lease: Lease) -> Lease {
        ending(lease, self.finish.as_ref())
    }
}

/// `lease`, given back with `finish`'s settle when there is one.
pub(super) fn ending(lease: Lease, finish: Option<&Arc<Finish>>) -> Lease {
    match finish {
        Some(f) => lease.ending_with(f.clone()),
        None => lease,
    }
}
