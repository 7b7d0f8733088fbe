//! The seam between the RDMA link's protocol and the verbs it calls: a queue pair with a
//! registered send region and a registered receive region, each cut into equal slots.
//!
//! The real implementation is `ibv` (feature `rdma`, through the `ibverbs` crate); the tests
//! run the same link over `loopback`, an in-process fabric that behaves as a reliable-connected
//! queue pair does: a send lands in the peer's oldest posted receive, in order, or fails the
//! queue pair when none is posted (what an exhausted RNR retry does on hardware).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Result;

/// What one side tells the other about its queue pair, over the TCP link, before either
/// sends: enough to connect (LID, GID, QPN, PSN) and to respect its receive region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    /// The port's local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The port's GID at the chosen index, hex (RoCE needs it; `None` on InfiniBand without a
    /// GID index).
    pub gid: Option<String>,
    /// Queue pair number.
    pub qpn: u32,
    /// The first packet sequence number this side sends with (the peer's receive PSN).
    pub psn: u32,
    /// Receive slots this side keeps posted: the peer's initial credit.
    pub slots: u32,
    /// Bytes per slot: the largest send the peer may post.
    pub slot_bytes: u32,
}

/// A finished work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The send from this send slot left; the slot may be written again.
    Sent { slot: usize },
    /// A message of `len` bytes arrived in this receive slot (which is no longer posted).
    Received { slot: usize, len: usize },
    /// A work request failed; the queue pair is in error and nothing more will complete.
    Failed { reason: String },
}

/// One queue pair and its two registered regions. Methods take `&self`: the link sends from
/// one thread while its poller polls from another.
pub trait Verbs: Send + Sync {
    /// This side's queue pair, to tell the peer.
    fn local(&self) -> QpInfo;
    /// Moves the queue pair to ready-to-send against the peer's (INIT → RTR → RTS).
    fn connect(&self, remote: &QpInfo) -> Result<()>;
    /// Posts receive slot `slot` for the next incoming send.
    fn post_recv(&self, slot: usize) -> Result<()>;
    /// Copies `parts`, one after another (at most `slot_bytes` in all), into send slot `slot`
    /// and posts a send of them: a fragment's header and its payload go out without being
    /// joined first.
    fn post_send(&self, slot: usize, parts: &[&[u8]]) -> Result<()>;
    /// Copies the first `len` bytes of receive slot `slot` to the end of `out`.
    fn read_recv(&self, slot: usize, len: usize, out: &mut Vec<u8>);
    /// Moves finished work into `out`, waiting at most `wait` for the first.
    fn poll(&self, out: &mut Vec<Completion>, wait: Duration) -> Result<()>;
}

/// Which RDMA port and buffers a link uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Device name (`mlx5_0`, `rxe0`); the first device when `None`.
    pub device: Option<String>,
    /// GID table index (RoCE needs one: usually the RoCE v2 entry of the port's IP).
    pub gid_index: Option<u32>,
    /// Receive slots per link (the sender's window).
    pub slots: u32,
    /// Bytes per slot; a larger message goes in consecutive slots.
    pub slot_bytes: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            device: None,
            gid_index: None,
            slots: 16,
            slot_bytes: 1 << 20,
        }
    }
}

/// Bytes in `parts` in all (for the verbs implementations: `ibv`, and `loopback` in tests).
#[cfg(any(test, feature = "rdma"))]
pub(super) fn gathered_len(parts: &[&[u8]]) -> usize {
    parts.iter().map(|p| p.len()).sum()
}

/// Copies `parts` one after another to the start of `dst` (which holds at least
/// [`gathered_len`] bytes).
#[cfg(any(test, feature = "rdma"))]
pub(super) fn gather(dst: &mut [u8], parts: &[&[u8]]) {
    let mut at = 0;
    for p in parts {
        dst[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
}
