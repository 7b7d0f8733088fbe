//! A request holding a slot, as admission follows it: its prompt, what was predicted for it,
//! and when its first and later tokens went by (the cost model learns from these).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::Class;
use crate::predict::Beside;

#[derive(Clone, Debug)]
pub(super) struct Flight {
    pub class: Class,
    pub tenant: Arc<str>,
    pub prompt: usize,
    /// Counted in the heavy lane until its prefill ends.
    pub heavy: bool,
    pub max_tokens: usize,
    pub stream: bool,
    /// Arrival at admission, and the slot's grant.
    pub arrived: Instant,
    pub granted: Instant,
    /// When the upstream had it ([`super::Permit::upstream_start`]), if marked: time held at
    /// the shared ceiling or in forward's retries after the grant is not prefill.
    pub started: Option<Instant>,
    /// Predicted on arrival: arrival → first token.
    pub predicted: Duration,
    /// Predicted at the grant: grant → first token, and the own prefill within it (s).
    pub predicted_upstream: f64,
    pub own_prefill: f64,
    /// How many times its own time its prefill was predicted to take at the grant, for the
    /// shorter prompts still to come ([`crate::predict::Preemption`]): kept, so that what it
    /// and the waiters behind it were told does not move as those arrivals come and go.
    pub stretch: f64,
    /// Where its prefill was predicted to run, at the grant: the other flights' context, and
    /// the share beside decodes then expected.
    pub beside_at_grant: Beside,
    /// The decode clock's reading when its upstream time started (`State::decode_clock`): the
    /// share of its prefill beside decodes is measured from here.
    pub decode_clock_at_start: Duration,
    pub first: Option<Instant>,
    /// Seconds of the upstream's prefill time credited to it so far (`State::credit_prefill`:
    /// the time goes to the prefill the upstream's order runs).
    pub prefill_spent: f64,
    /// Flights and their context when the first token came.
    pub running_at_first: usize,
    pub context_at_first: usize,
    /// Output tokens seen so far, and how many of them came while some prefill ran.
    pub tokens: usize,
    pub tokens_beside_prefill: usize,
    /// The prefill clock's reading at the first token ([`crate::predict::BusyClock`]).
    pub prefill_clock_at_first: Duration,
}

impl Flight {
    /// Tokens of context it holds in the upstream now.
    pub fn context(&self) -> usize {
        self.prompt + self.tokens
    }

    /// When its upstream time started: the mark, or else the grant.
    pub fn upstream_from(&self) -> Instant {
        self.started.unwrap_or(self.granted)
    }
}
