//! The active policy, shared by every layer and replaced whole on reload.

use std::sync::Arc;

use tokio::sync::watch;

use super::load::LoadedPolicy;

/// The policy in force. Readers take an `Arc` snapshot per request, so a request keeps the
/// policy it started under while a reload swaps in the next one.
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

    /// Changes as they happen (the admission queue follows its limits this way).
    pub fn subscribe(&self) -> watch::Receiver<Arc<LoadedPolicy>> {
        self.tx.subscribe()
    }

    /// Puts `policy` in force.
    pub fn replace(&self, policy: LoadedPolicy) {
        self.tx.send_replace(Arc::new(policy));
    }
}
