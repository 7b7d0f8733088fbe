//! Sluice's bundled inference engine.
//!
//! - [`model`]: the GGUF reader, the tokenizer and chat template, and the Llama forward pass.
//! - [`backend`]: where the arithmetic runs (CPU kernels; CUDA behind a feature).
//! - [`kv`]: the paged KV cache (a block pool and per-sequence block tables).
//! - [`generate`]: sampling, the generation loop and teacher-forced scoring.
//! - [`bench`](mod@bench): prefill and batched-decode throughput.

pub mod api;
pub mod backend;
pub mod bench;
pub mod dtype;
pub mod error;
pub mod fuzzing;
pub mod generate;
pub mod http;
pub mod kv;
pub mod model;
pub mod pipeline;
pub mod prom;
pub mod scheduler;
pub mod server;
pub mod trace;
pub mod transport;

pub use error::{Error, Result};
