//! The CUDA backend's parts that exist today: the kernels (CUDA C compiled by NVRTC, no toolkit
//! headers), their CPU twins, the host-side launch arithmetic, and (feature `cuda`) the probe
//! that turns a missing driver, NVRTC or GPU into one clear error instead of cudarc's panic.
//!
//! - [`kernels`]: the sources, the entry points of each module, the NVRTC options.
//! - [`twins`]: each kernel's algorithm in Rust, in the kernel's own order where that changes
//!   rounding (lane partials, butterfly reductions, online softmax); `cargo test` checks them
//!   against the CPU backend on every machine, so a wrong index fails before any GPU runs it.
//! - [`launch`]: grid and block shapes, split-KV choice, decode-graph buckets and padding, the
//!   per-row KV slots the kernels read from the block tables, and the device arena's size.
//! - `probe` (feature `cuda`): what `--device cuda` checks first.
//! - `device`, `backend` (feature `cuda`): the loaded modules and their launchers; the backend.
//!
//! `make cuda-check` compiles every module for `compute_90` and `compute_80` with NVRTC from
//! PyPI, assembles it for `sm_90` with `ptxas -v`, and fails on a spill or an error
//! (`examples/cuda_check.rs`). `backend` (feature `cuda`) is the `Backend` that owns device
//! weights, buffers and the KV pool and launches these kernels; the commands reach it through
//! `backend::select` (`--device cuda`). What is not written yet (decode graphs) is listed in
//! `docs/architecture.md`.

#[cfg(feature = "cuda")]
pub mod backend;
#[cfg(feature = "cuda")]
pub mod device;
pub mod kernels;
pub mod launch;
#[cfg(feature = "cuda")]
pub mod probe;
pub mod twins;
