//! The active policy, shared by every layer and replaced whole on reload.

use std::sync::Arc;

use http::Extensions;
use tokio::sync::watch;

use super::load::LoadedPolicy;

/// The policy in force. A request takes one `Arc` snapshot on arrival ([`Snapshot`]) and every
/// layer reads that one, so a request keeps the policy it started under while a reload swaps in
/// the next one.
#[derive(Debug)]
pub struct PolicyStore {
    tx: watch::Sender<Arc<LoadedPolicy>>,
}

impl PolicyStore {
    pub fn new(policy: LoadedPolicy) -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(Arc::new(policy)),
        })
    }

    /// The policy in force now.
    pub fn current(&self) -> Arc<LoadedPolicy> {
        self.tx.borrow().clone()
    }

    /// The policy the request with `extensions` took on arrival; the one in force now for a
    /// request that took none (a layer used outside the stack, as in its own tests).
    pub fn of(&self, extensions: &Extensions) -> Arc<LoadedPolicy> {
        extensions
            .get::<Snapshot>()
            .map_or_else(|| self.current(), |s| s.0.clone())
    }

    /// Changes as they happen (the admission queue follows its limits this way).
    pub fn subscribe(&self) -> watch::Receiver<Arc<LoadedPolicy>> {
        self.tx.subscribe()
    }

    /// Puts `policy` in force.
    pub fn replace(&self, policy: LoadedPolicy) {
        self.tx.send_replace(Arc::new(policy));
    }
}

/// The policy a request took on arrival (a request extension, inserted by auth, the first layer
/// that reads the policy). Authentication, body limit, token caps, the shared ceiling's wait and
/// the upstream's settings all follow this one, so a reload during a slow upload or a long wait
/// never admits a request under a mix of two policies.
#[derive(Clone, Debug)]
pub struct Snapshot(pub Arc<LoadedPolicy>);
