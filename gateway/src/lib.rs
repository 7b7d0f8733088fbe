//! Sluice's gateway: an admission-controlled HTTPS front door for LLM serving.
//!
//! - [`app`]: the shared parts and the function that builds the tower stack.
//! - [`middleware`]: the stack's layers, one module each.
//! - [`forward`]: the upstream client and where requests go.
//! - [`error`]: the one mapping from a refusal to its status and OpenAI-shaped body.
//! - [`policy`]: the policy file, its validation and reload.
//! - [`predict`]: the upstream's cost model and the time-to-first-token prediction.
//! - [`server`], [`routes`], [`tls`]: listening, routing, certificates.
//! - [`shared`]: the ceiling, rate limits and budgets several gateways share through Redis.
//! - [`bundled`]: the supervised bundled engine.
//! - [`ui`]: the status page (`/ui`).

/// The boxed future of the stack's services (and of anything else that must name one).
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

pub mod alerts;
pub mod app;
pub mod body;
pub mod bundled;
pub mod error;
pub mod forward;
pub mod fuzzing;
pub mod middleware;
pub mod policy;
pub mod predict;
pub mod routes;
pub mod server;
pub mod shared;
pub mod telemetry;
pub mod tls;
pub mod ui;
