//! Fixed-shape requests: a prompt of exactly N tokens, M output tokens, `/v1/completions`.

use std::sync::Arc;

use super::{Check, Job, JobSource};
use crate::client::Api;
use crate::error::Result;
use crate::prompts::{PromptSource, Shape};
use crate::request;

/// Requests of one shape; with `repeat`, every request sends the same prompt (the
/// deployment's repeated-long-input run: a prefix cache may serve it, a leak shows).
#[derive(Clone)]
pub struct ShapeJobs {
    pub prompts: Arc<dyn PromptSource>,
    pub model: String,
    pub shape: Shape,
    pub repeat: bool,
    /// Added to request numbers, so that scenarios of one run never share a prompt.
    pub base: u64,
}

impl std::fmt::Debug for ShapeJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShapeJobs({}, repeat {})", self.shape.label, self.repeat)
    }
}

impl JobSource for ShapeJobs {
    fn job(&self, n: u64) -> Result<Job> {
        let request = self.base + if self.repeat { 0 } else { n };
        let prompt = self.prompts.prompt(self.shape.input, request)?;
        Ok(Job {
            api: Api::Completions,
            body: request::completion(&self.model, &prompt, self.shape.output),
            check: Check::None,
            kind: self.shape.label.clone(),
        })
    }
}
