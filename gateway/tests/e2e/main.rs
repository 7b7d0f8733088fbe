//! End-to-end tests of the gateway over HTTPS: against a scripted upstream (`scripted`) and
//! against the real bundled engine (`bundled`).

mod access_log;
mod bundled;
mod common;
mod engine;
mod faults;
mod fields_count;
mod hostile;
mod otlp;
mod peer;
mod policy_edits;
mod predictive;
mod process;
mod reload;
mod replicas;
mod scripted;
mod shared;
mod upstream_faults;
mod vllm;
