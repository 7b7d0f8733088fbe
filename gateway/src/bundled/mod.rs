//! Bundled mode: the gateway starts `sluice-engine serve` as a child process on loopback and
//! keeps it running.
//!
//! [`Supervisor::start`] reserves a loopback port once (it stays the same across restarts),
//! starts `sluice-engine serve --ranks R --listen 127.0.0.1:PORT --model PATH
//! --exit-with-parent` and polls `GET /health`: every 500 ms while the engine starts, every
//! second once it is ready. The engine runs in a process group of its own, so that a Ctrl-C at
//! the terminal reaches only the gateway, which drains before it stops the engine. Its stdout
//! and stderr are relayed line by line to `tracing` under the target `sluice::engine`, at the
//! level the engine logged them; the engine is told (`SLUICE_LOG_TIMESTAMPS=0`) to leave out its
//! own timestamps, so each line carries one. An engine's last lines are logged before the
//! supervisor says how it ended.
//!
//! An engine that exits, is not ready within [`BundledConfig::start_timeout`], or stays
//! unhealthy that long after having been ready is killed and restarted after an exponential
//! [`Backoff`] (0.5 s, 1 s, 2 s … at most 30 s; the count starts over once an engine has stayed
//! ready for 60 s). Every change shows in [`Supervisor::state`] as an [`EngineState`].
//!
//! [`Supervisor::shutdown`] sends the engine SIGTERM, waits up to 5 s and then kills it; once
//! it is asked for, an engine that ends is not restarted.
//! Dropping the [`Supervisor`] does the same in the background; if the runtime goes away
//! first, the child is killed on drop, and the engine's `--exit-with-parent` covers a gateway
//! that is itself killed.

mod child;
mod config;
mod error;
mod health;
mod supervisor;

#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

pub use config::{Backoff, BundledConfig, ENGINE_BIN_ENV, ENGINE_BIN_NAME};
pub use error::SupervisorError;
pub use supervisor::Supervisor;

/// One engine rank as its `/health` last reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RankStatus {
    pub rank: usize,
    pub up: bool,
    /// First and last transformer block it holds.
    pub layers: [usize; 2],
    pub kv_tokens_total: u64,
    pub kv_tokens_used: u64,
}

/// Where the bundled engine stands, as seen by its supervisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineState {
    /// The engine process is starting and has not answered `GET /health` with 200 yet.
    Starting,
    /// The last health check answered 200.
    Ready,
    /// The engine had been ready, and its last health check failed (the reason).
    Unhealthy(String),
    /// The engine exited, could not be started or was killed; restart number `attempt`
    /// (counted from 1) follows after `backoff`.
    Restarting {
        /// Consecutive restarts, this one included.
        attempt: u32,
        /// The delay before this restart.
        backoff: Duration,
    },
    /// Shut down: no engine runs and none will be started.
    Stopped,
}

impl fmt::Display for EngineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Starting => f.write_str("starting"),
            Self::Ready => f.write_str("ready"),
            Self::Unhealthy(why) => write!(f, "unhealthy: {why}"),
            Self::Restarting { attempt, backoff } => {
                write!(f, "restarting (attempt {attempt}, after {backoff:?})")
            }
            Self::Stopped => f.write_str("stopped"),
        }
    }
}
