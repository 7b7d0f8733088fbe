//! The policy file: what the gateway enforces, loaded from TOML, validated whole, and swapped
//! atomically on reload.
//!
//! - [`schema`]: the keys, their types and defaults.
//! - [`validate`]: the rules across keys (ranges, consistency).
//! - [`load`]: reading a file into a [`LoadedPolicy`] (hash, load time), errors with line and
//!   column.

mod duration;
pub mod load;
pub mod schema;
pub mod store;
pub mod validate;

pub use load::{LoadedPolicy, PolicyError};
pub use store::PolicyStore;
pub use schema::{
    Admin, Admission, Alerts, Class, Limits, Policy, Server, Tenant, Upstream, UpstreamKind,
};
