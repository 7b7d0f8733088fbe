//! The soak's mix: each request drawn from weighted scenarios, reproducibly from the seed.

use std::sync::Arc;

use super::{Job, JobSource};
use crate::error::Result;
use crate::rng::Rng;

/// Request `n` comes from part `i` with probability `weight_i / Σ weights`.
#[derive(Clone)]
pub struct MixJobs {
    pub parts: Vec<(u32, Arc<dyn JobSource>)>,
    pub seed: u64,
}

impl std::fmt::Debug for MixJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let weights: Vec<u32> = self.parts.iter().map(|(w, _)| *w).collect();
        write!(f, "MixJobs({weights:?})")
    }
}

impl JobSource for MixJobs {
    fn job(&self, n: u64) -> Result<Job> {
        let total: u32 = self.parts.iter().map(|(w, _)| w).sum();
        let mut pick = Rng::new(self.seed, n).below(total.max(1) as usize) as u32;
        for (weight, part) in &self.parts {
            if pick < *weight {
                return part.job(n);
            }
            pick -= weight;
        }
        // Unreachable with a positive total; an empty mix is a caller's bug.
        Err(crate::error::Error::Config("an empty mix".into()))
    }
}
