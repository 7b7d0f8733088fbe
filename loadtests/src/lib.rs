//! `sluice-load`: a closed-loop load generator for any OpenAI-compatible endpoint, used to
//! measure the capacity matrix of Sluice's engine side by side with other servers.
//!
//! - [`client`]: the streaming HTTP client and SSE parsing, one [`client::Sample`] per request.
//! - [`prompts`]: request shapes and prompts of an exact token count.
//! - [`run`]: the closed loop over concurrency levels.
//! - [`stats`]: percentiles and the per-level aggregate.
//! - [`report`]: the table and the JSON lines.

pub mod client;
pub mod prompts;
pub mod report;
pub mod run;
pub mod stats;
