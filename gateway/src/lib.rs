//! Sluice's gateway: an admission-controlled HTTPS front door for LLM serving.

pub mod bundled;
pub mod policy;
