//! `sluice-load`: the deployment's capacity matrix against any OpenAI-compatible endpoint
//! (the Sluice gateway, its engine, llama-server, vLLM, SGLang), and the policy calibrated from it.
//!
//! - [`client`]: streaming HTTP(S) client and SSE parsing, one [`client::Sample`] per request.
//! - [`prompts`]: request shapes and prompts of an exact token count.
//! - [`request`]: the JSON bodies.
//! - [`scenario`]: what each request is (shapes, repeated input, needles, tool calls, the soak
//!   mix) and the matrix as data.
//! - [`workload`]: when requests go (closed loop, open loop fixed or Poisson), bounded by count
//!   and duration.
//! - [`stats`]: percentiles and the per-scenario aggregate.
//! - [`report`]: table, JSON, Markdown and SVG.
//! - [`measure`]: one row on one target, start to aggregate.
//! - [`calibrate`]: admission policy from the sweeps.

pub mod calibrate;
pub mod client;
pub mod error;
pub mod measure;
pub mod progress;
pub mod prompts;
pub mod report;
pub mod request;
pub mod rng;
pub mod scenario;
pub mod stats;
pub mod workload;

pub use error::{Error, Result};
