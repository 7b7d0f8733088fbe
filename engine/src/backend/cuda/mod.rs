//! The CUDA backend's parts that exist today: the kernels (CUDA C compiled by NVRTC, no toolkit
//! headers), their CPU twins, the host-side launch arithmetic, and (feature `cuda`) the probe
//! that turns a missing driver, NVRTC or GPU into one clear error instead of cudarc's panic.
//!
//! - [`kernels`]: the sources, the entry points of each module, the NVRTC options.
//! - [`twins`]: each kernel's algorithm in Rust, in the kernel's own order where that changes
//!   rounding (lane partials, butterfly reductions, online softmax); `cargo test` checks them
//!   against the CPU backend on every machine, so a wrong index fails before any GPU runs it.
//! - [`launch`]: grid and block shapes, split-KV choice, the per-row KV slots and tables the
//!   kernels read from the block tables, and the device arena's size.
//! - [`graphs`]: decode graphs' host side: bucket choice and padding, what a capture is keyed
//!   by, when a step is replayed or captured again, the staging of per-step inputs.
//! - `probe` (feature `cuda`): what `--device cuda` checks first.
//! - `device`, `backend` (feature `cuda`): the loaded modules and their launchers; the backend.
//! - [`crate::model::synthetic`]: a seeded GGUF with the bundled model's shapes; `model_check` (feature
//!   `cuda`): the GPU check's model-level part, which runs it on both backends; `golden` (feature
//!   `cuda`): the bundled model itself on CUDA against llama.cpp's golden records.
//!
//! `make cuda-check` compiles every module for `compute_90` and `compute_80` with NVRTC from
//! PyPI, assembles it for `sm_90` with `ptxas -v`, and fails on a spill or an error
//! (`examples/cuda_check.rs`). `backend` (feature `cuda`) is the `Backend` that owns device
//! weights, buffers and the KV pool and launches these kernels; the commands reach it through
//! `backend::select` (`--device cuda`); it captures decode steps into CUDA graphs (on by default,
//! `SLUICE_CUDA_GRAPHS=off` turns them off).

#[cfg(feature = "cuda")]
pub mod backend;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod golden;
pub mod graphs;
pub mod kernels;
pub mod launch;
#[cfg(feature = "cuda")]
pub mod model_check;
#[cfg(feature = "cuda")]
pub mod probe;
pub mod twins;
