//! Predicting time to first token (see `docs/policy.md`, "Predictive admission").
//!
//! - [`model`]: the upstream's cost model (prefill time, decode step time), seeded from the
//!   policy and refitted online.
//! - [`fit`]: the online least squares behind it.
//! - [`busy`]: the time some prefill ran, which decode observations leave out, and the share
//!   of time some request decoded, which slows a prefill.
//! - [`preempt`]: what shorter prompts arriving later take from a long prefill, where the
//!   upstream prefills the least left first.
//! - [`gate`]: the grant rule and order, shared by admission's dispatch and the simulation.
//! - [`simulate`]: the upstream played forward under the model: every waiter's predicted time
//!   to first token from the work running and the queue around it.
//! - [`history`]: predicted against actual, for the error gauge and the status page's chart.
//! - [`replay`]: the prefill fit replayed offline from the observations a gateway logged.

pub mod busy;
pub mod fit;
pub mod gate;
pub mod history;
pub mod model;
pub mod preempt;
pub mod replay;
pub mod simulate;

pub use busy::{BusyClock, Grant, RecentGrants};
pub use gate::{interactive_waiting, next_granted, prefill_ahead, Ask, Gate, Held, Place, Share};
pub use history::{History, Pair, Point};
pub use model::{Beside, CostModel, Parameters, DECODE_TERMS, PREFILL_TERMS};
pub use preempt::Preemption;
pub use simulate::{first_tokens, prefill_next, Group, Pending, Running, Scene, PREFILL_LEFT_MIN};
