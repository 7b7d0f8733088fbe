//! Links between pipeline ranks.
//!
//! - [`message`]: the protocol's messages.
//! - [`frame`]: the wire format (fixed header, JSON message, raw tensor body) and the f32
//!   body helpers.
//! - [`tcp`]: [`TcpTransport`], the [`Transport`] over a TCP stream, with heartbeats, and
//!   [`RankListener`], the listening side.
//! - [`handshake`]: challenge, hello and proof, the checks a listener makes, and [`dial`].
//! - [`rdma`]: the [`Transport`] over an RDMA queue pair (feature `rdma` for real devices).
//! - [`select`]: [`DataTransport`], what data links run on (`--transport tcp|rdma`).
//!
//! A link starts with a handshake: the listener sends `Challenge{nonce}`, the dialer answers
//! `Hello{..}` with `proof = hex(HMAC-SHA256(cluster secret, nonce))`, and the listener either
//! refuses (`Refused{reason}`, naming what differs) or accepts: on a data link it answers
//! `Ready{rank}` itself, on a control link its caller answers `Welcome{..}`. [`dial`] returns once
//! that answer arrives, and the answer is the first message `recv` returns on the dialer's side.
//!
//! After the handshake each side sends `Heartbeat(status)` every
//! [`LinkConfig::heartbeat_interval`]; heartbeats never reach `recv`, they update
//! [`Transport::peer_status`]. A side that hears nothing for [`LinkConfig::heartbeat_timeout`]
//! reports the peer gone.

pub mod frame;
pub mod handshake;
pub mod message;
pub mod rdma;
pub mod select;
pub mod tcp;

#[cfg(test)]
mod suite;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::error::Result;
use message::{Message, RankStatus};

pub use frame::{f32_to_le_bytes, le_bytes_into_f32, le_bytes_to_f32};
pub use handshake::{dial, DialOptions, Expected, HelloFields};
pub use message::{LinkRole, LinkTransport, PROTOCOL_VERSION};
pub use select::DataTransport;
pub use tcp::{LinkConfig, RankListener, StatusSource, TcpTransport};

/// A bidirectional, ordered, framed connection to one peer rank.
pub trait Transport: Send + Sync {
    /// Sends one message (with its tensor body for `Forward`; every other message takes an empty
    /// body). Thread-safe: concurrent sends are serialized, each message goes out whole.
    fn send(&self, msg: &Message, body: &[u8]) -> Result<()>;
    /// Blocks until the next message that is not a heartbeat arrives, the peer goes away (Err),
    /// or the heartbeat timeout passes without hearing anything (Err naming the timeout).
    fn recv(&self) -> Result<(Message, Vec<u8>)>;
    /// The latest status the peer sent with its heartbeats, and how long ago anything was heard.
    fn peer_status(&self) -> (Option<RankStatus>, Duration);
    /// The peer's address, as `ip:port`.
    fn peer_addr(&self) -> String;
    /// Closes the connection; a blocked recv on either side returns an error.
    fn close(&self);
}
