//! What can go wrong starting or waiting for the bundled engine.

use std::path::PathBuf;
use std::time::Duration;

use super::{EngineState, ENGINE_BIN_ENV, ENGINE_BIN_NAME};

/// An error from the bundled-engine [`Supervisor`](super::Supervisor).
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The engine executable named by the configuration or `$SLUICE_ENGINE_BIN` is missing.
    #[error("the engine executable {} does not exist", path.display())]
    EngineNotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// No `sluice-engine` next to the gateway's executable.
    #[error(
        "cannot find the `{ENGINE_BIN_NAME}` executable (looked for {}); build it with \
         `cargo build --release -p sluice-engine` or set ${ENGINE_BIN_ENV}",
        display_paths(searched)
    )]
    EngineNotBuilt {
        /// Where it was looked for.
        searched: Vec<PathBuf>,
    },
    /// The model file is missing.
    #[error(
        "the model file {} does not exist; fetch it with `make fetch-model` \
         (scripts/fetch-model.sh)",
        path.display()
    )]
    ModelNotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// The gateway's own executable could not be found (to look for the engine beside it).
    #[error("cannot find the gateway's own executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// No loopback port could be reserved for the engine.
    #[error("cannot reserve a loopback port for the engine: {0}")]
    Port(#[source] std::io::Error),
    /// [`wait_ready`](super::Supervisor::wait_ready) ran out of time.
    #[error("the engine was not ready after {waited:?} (it is {state})")]
    NotReady {
        /// How long it was waited for.
        waited: Duration,
        /// The state at the end.
        state: EngineState,
    },
    /// The supervisor has stopped.
    #[error("the engine supervisor has stopped")]
    Stopped,
}

fn display_paths(paths: &[PathBuf]) -> String {
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    shown.join(", ")
}
