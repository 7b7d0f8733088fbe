//! The RDMA transport: the [`Transport`](super::Transport) over a reliable-connected queue
//! pair, next to TCP (`--transport rdma`).
//!
//! A data link starts as a TCP link (the same handshake, with `transport = rdma` in the
//! hello). Both sides then open their verbs, post every receive slot, and exchange
//! [`QpInfo`] over that TCP link; each connects its queue pair to the other's and says so; from
//! then on every message travels as SEND/RECV over the queue pair, cut into slots, while the
//! TCP link keeps the heartbeats and carries the receive credits back (`link`).
//!
//! - [`verbs`]: the seam: [`Verbs`], [`QpInfo`], [`Completion`], [`RdmaConfig`].
//! - [`link`]: [`RdmaTransport`] and [`upgrade`]: fragments, credits, completions.
//! - `ibv` (feature `rdma`): [`Verbs`] on a real device through the `ibverbs` crate.
//! - `loopback` (tests): [`Verbs`] on an in-process fake fabric.

pub mod link;
pub mod verbs;

#[cfg(feature = "rdma")]
mod ibv;
#[cfg(test)]
pub(crate) mod loopback;
#[cfg(test)]
mod tests;

pub use link::{upgrade, RdmaTransport};
pub use verbs::{Completion, QpInfo, RdmaConfig, Verbs};

use crate::error::Result;

/// What to tell someone who asked for RDMA where there is none (the end of every such error).
pub(crate) const USE_TCP: &str = "--transport tcp works";

/// Opens the verbs of one link on the configured device.
///
/// # Errors
///
/// No RDMA device (or no RDMA support compiled in): one line that says so and names
/// `--transport tcp`.
pub fn open(cfg: &RdmaConfig) -> Result<Box<dyn Verbs>> {
    #[cfg(feature = "rdma")]
    {
        ibv::open(cfg)
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = cfg;
        Err(not_compiled())
    }
}

/// Checks, before anything else starts, that the configured RDMA device exists; returns its
/// name.
///
/// # Errors
///
/// As [`open`].
pub fn check_device(cfg: &RdmaConfig) -> Result<String> {
    #[cfg(feature = "rdma")]
    {
        ibv::check_device(cfg)
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = cfg;
        Err(not_compiled())
    }
}

#[cfg(not(feature = "rdma"))]
fn not_compiled() -> crate::error::Error {
    crate::error::Error::Transport(format!(
        "this sluice-engine was built without RDMA support (cargo feature `rdma`); {USE_TCP}"
    ))
}
