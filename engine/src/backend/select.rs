//! The backend a command runs on, chosen by `--device` (and `--gpus`).
//!
//! The model is generic over its [`Backend`], so a command says what it does with the model as
//! a [`WithBackend`] and [`BackendSpec::run`] calls it with the backend the user asked for: the
//! CPU's, or (feature `cuda`) the GPU's. Each pipeline rank builds its own.

use std::sync::Arc;

use super::cpu::CpuBackend;
use super::{Backend, Device};
use crate::error::{Error, Result};

/// What a rank's backend is made from.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendSpec {
    pub device: Device,
    /// CPU compute threads (the CPU backend; a GPU rank still tokenizes and samples on the CPU).
    pub threads: usize,
    /// Other ranks' threads share these cores: idle workers spin only briefly.
    pub shared_cores: bool,
    /// `--gpus`: the GPU ordinals ranks are placed on, rank `r` on `gpus[r % len]` (so one GPU
    /// can hold every rank). Empty: GPU 0.
    pub gpus: Vec<usize>,
}

/// Work done with a backend of whichever type the spec names.
pub trait WithBackend {
    type Out;
    fn run<B: Backend>(self, backend: Arc<B>) -> Result<Self::Out>;
}

impl BackendSpec {
    /// The CPU with `threads` threads.
    pub fn cpu(threads: usize) -> Self {
        Self {
            device: Device::Cpu,
            threads,
            shared_cores: false,
            gpus: Vec::new(),
        }
    }

    /// The GPU rank `rank` is placed on.
    pub fn gpu_for(&self, rank: usize) -> usize {
        if self.gpus.is_empty() {
            0
        } else {
            self.gpus[rank % self.gpus.len()]
        }
    }

    /// Runs `work` with rank `rank`'s backend (kernels for heads of `head_dim`).
    pub fn run<W: WithBackend>(&self, rank: usize, head_dim: usize, work: W) -> Result<W::Out> {
        match self.device {
            Device::Cpu => work.run(Arc::new(CpuBackend::for_rank(
                self.threads,
                self.shared_cores,
            ))),
            Device::Cuda => self.run_cuda(rank, head_dim, work),
        }
    }

    #[cfg(feature = "cuda")]
    fn run_cuda<W: WithBackend>(&self, rank: usize, head_dim: usize, work: W) -> Result<W::Out> {
        let found = super::cuda::probe::probe()?;
        let ordinal = self.gpu_for(rank);
        if ordinal >= found.devices {
            return Err(Error::CudaUnavailable(format!(
                "rank {rank} is placed on GPU {ordinal} (--gpus), but the driver sees {} GPU(s)",
                found.devices
            )));
        }
        let backend = super::cuda::backend::CudaBackend::new(ordinal, head_dim)?;
        tracing::info!("rank {rank}: CUDA backend on GPU {ordinal}");
        work.run(Arc::new(backend))
    }

    #[cfg(not(feature = "cuda"))]
    fn run_cuda<W: WithBackend>(&self, _rank: usize, _head_dim: usize, _work: W) -> Result<W::Out> {
        Err(Error::BackendNotCompiled("cuda"))
    }
}

/// Parses `--gpus 0,1,2`.
pub fn parse_gpus(s: &str) -> std::result::Result<Vec<usize>, String> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .map_err(|_| format!("--gpus: {p:?} is not a GPU ordinal"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Name;

    impl WithBackend for Name {
        type Out = &'static str;
        fn run<B: Backend>(self, backend: Arc<B>) -> Result<&'static str> {
            Ok(backend.name())
        }
    }

    #[test]
    fn ranks_are_placed_round_robin_on_the_listed_gpus() {
        let mut spec = BackendSpec::cpu(1);
        assert_eq!(spec.gpu_for(2), 0, "no list: GPU 0");
        spec.gpus = parse_gpus("0,1,2").unwrap();
        assert_eq!(
            (0..4).map(|r| spec.gpu_for(r)).collect::<Vec<_>>(),
            [0, 1, 2, 0]
        );
        spec.gpus = parse_gpus("3").unwrap();
        assert_eq!(spec.gpu_for(2), 3, "one GPU holds every rank");
        assert!(parse_gpus("0,x").is_err());
    }

    #[test]
    fn the_cpu_spec_runs_the_cpu_backend() {
        assert_eq!(BackendSpec::cpu(1).run(0, 64, Name).unwrap(), "cpu");
    }

    #[test]
    fn cuda_without_a_driver_is_an_error_not_a_panic() {
        let mut spec = BackendSpec::cpu(1);
        spec.device = Device::Cuda;
        if cfg!(feature = "cuda") && nvidia_driver_present() {
            return; // a machine with a GPU: covered by scripts/gpu-check.sh
        }
        let e = spec.run(0, 64, Name).unwrap_err().to_string();
        assert!(e.contains("cuda") || e.contains("CUDA"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    /// Whether this machine has a CUDA driver library (the GPU machine).
    fn nvidia_driver_present() -> bool {
        std::path::Path::new("/proc/driver/nvidia").exists()
    }
}
