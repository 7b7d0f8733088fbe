//! The policy file: what the gateway enforces, loaded from TOML, validated whole, and swapped
//! atomically on reload.
//!
//! - [`schema`]: the keys, their types and defaults.
//! - [`validate`]: the rules across keys (ranges, consistency).
//! - [`load`]: reading a file into a [`LoadedPolicy`] (hash, load time), errors with line and
//!   column; [`load::check_file`] for `sluice policy check`.
//! - [`guard`]: what a reload must pass beyond validity (access never widens silently; keys
//!   that need a restart are held).
//! - [`reload`]: the file watcher and SIGHUP that swap a new policy in.
//! - [`store`]: the policy in force, shared by every layer.

mod duration;
pub mod guard;
pub mod load;
pub mod redact;
pub mod reload;
pub mod schema;
pub mod store;
pub mod validate;

#[cfg(test)]
mod tests;

pub use guard::Guard;
pub use load::{check_file, check_reload, LoadedPolicy, PolicyError};
pub use reload::{spawn_reloader, ReloadHandle};
pub use schema::{
    Admin, Admission, Alerts, Class, Cost, Limits, Policy, PrefillOrder, Server, Shared,
    SharedFail, Tenant, Traces, Upstream, UpstreamKind,
};
pub use store::{PolicyStore, Snapshot};
