//! Predicting time to first token (see `docs/policy.md`, "Predictive admission").
//!
//! - [`model`]: the upstream's cost model (prefill time, decode step time), seeded from the
//!   policy and refitted online.
//! - [`fit`]: the online least squares behind it.
//! - [`busy`]: the time some prefill ran, which decode observations leave out.
//! - [`simulate`]: the upstream played forward under the model: a request's predicted time to
//!   first token from the work running and the queue ahead of it.
//! - [`history`]: predicted against actual, for the error gauge and the status page's chart.

pub mod busy;
pub mod fit;
pub mod history;
pub mod model;
pub mod simulate;

pub use busy::PrefillClock;
pub use history::{History, Pair, Point};
pub use model::{CostModel, Parameters, DECODE_TERMS, PREFILL_TERMS};
pub use simulate::{time_to_first_token, Gate, Pending, Running};
