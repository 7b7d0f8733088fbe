//! The library's one error type: what went wrong before or around the requests (a bad URL, an
//! unreadable CA file, a prompt that cannot be built). A request that fails is not an error: it
//! is a [`crate::client::Outcome`], counted in the report.

/// Why a load test could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or argument that cannot work (`--url ftp://...`, `--concurrency 0`).
    #[error("{0}")]
    Config(String),
    /// The CA file, the system trust store or the TLS set-up.
    #[error("TLS: {0}")]
    Tls(String),
    /// The tokenizer could not be loaded or a prompt could not be built.
    #[error("prompt: {0}")]
    Prompt(String),
    /// The server answered a set-up request (`GET /v1/models`) with something unusable.
    #[error("{0}")]
    Server(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
