//! What a rank's data links run on (`--transport tcp|rdma`): every data link is dialed and
//! handshaken over TCP, then, on RDMA, moved onto a queue pair.

use std::sync::Arc;
use std::time::Duration;

use super::message::LinkTransport;
use super::rdma::{self, RdmaConfig};
use super::Transport;
use crate::error::Result;

/// The transport of data links, with its settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DataTransport {
    #[default]
    Tcp,
    Rdma(RdmaConfig),
}

impl DataTransport {
    /// What the handshake announces.
    pub fn kind(&self) -> LinkTransport {
        match self {
            Self::Tcp => LinkTransport::Tcp,
            Self::Rdma(_) => LinkTransport::Rdma,
        }
    }

    /// Checks before a rank starts that it can run here: on RDMA, that the device exists.
    ///
    /// # Errors
    ///
    /// One line naming what is missing (and that `--transport tcp` works).
    pub fn check(&self) -> Result<()> {
        match self {
            Self::Tcp => Ok(()),
            Self::Rdma(cfg) => {
                let device = rdma::check_device(cfg)?;
                tracing::info!(%device, gid_index = ?cfg.gid_index, "data links run on RDMA");
                Ok(())
            }
        }
    }

    /// A data link whose handshake is done, ready for messages: as it is on TCP, moved onto a
    /// queue pair on RDMA (both sides call this). `heartbeat_timeout` bounds a send's wait for
    /// the peer's receive credit.
    ///
    /// # Errors
    ///
    /// The RDMA set-up failed (device, verbs, or the peer's answer).
    pub fn establish<T: Transport + 'static>(
        &self,
        link: Arc<T>,
        heartbeat_timeout: Duration,
    ) -> Result<Arc<dyn Transport>> {
        match self {
            Self::Tcp => Ok(link),
            Self::Rdma(cfg) => {
                let verbs = rdma::open(cfg)?;
                Ok(rdma::upgrade(link, verbs, heartbeat_timeout)?)
            }
        }
    }
}
