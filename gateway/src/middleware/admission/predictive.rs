//! Predictive admission: each arrival's time to first token predicted from the work running
//! and the queue ahead of it ([`crate::predict`]); refused at once when it misses its deadline,
//! re-checked while it waits; and the cost model refitted from every stream.
//!
//! The deadline is the class's (`admission.interactive_ttft_deadline`, `batch_ttft_deadline`),
//! lowered by `x-sluice-ttft-deadline-ms`. A prompt that cannot meet it even on an idle
//! upstream is held to twice its idle prediction instead: served when the upstream is quiet,
//! never refused forever.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::flight::Flight;
use super::queue::{State, Ticket};
use crate::error::GatewayError;
use crate::predict::{self, Gate, Pair, Parameters, Pending, Point, Running};

/// The output share assumed before any stream ended: half of `max_tokens` (low, so a cold
/// model errs toward admitting).
pub const OUTPUT_SHARE_SEED: f64 = 0.5;
/// How much of a stream's output share the average takes in.
const OUTPUT_SHARE_GAIN: f64 = 0.2;
/// A prefill running longer than predicted is assumed to have at least this share left.
const PREFILL_LEFT_MIN: f64 = 0.1;

/// What `/metrics` and the status page show of the prediction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredictionView {
    pub predictive: bool,
    pub parameters: Parameters,
    /// Median of (predicted − actual) / actual over the last five minutes.
    pub median_error: Option<f64>,
    pub output_share: f64,
    pub points: Vec<Point>,
}

impl State {
    fn expected_output(&self, ticket: &Ticket) -> f64 {
        (ticket.max_tokens as f64 * self.output_share).max(1.0)
    }

    fn gate(&self) -> Gate {
        Gate {
            active_max: self.active_max(),
            prefill_tokens_max: self.limits.prefill_tokens_max,
        }
    }

    /// The flights as the simulation sees them.
    fn running(&self, now: Instant) -> Vec<Running> {
        let mut flights: Vec<&Flight> = self.flights.values().collect();
        flights.sort_by_key(|f| f.granted);
        flights
            .into_iter()
            .map(|f| {
                let prefill_left = match f.first {
                    Some(_) => 0.0,
                    None => {
                        let spent = now.saturating_duration_since(f.granted).as_secs_f64();
                        (f.own_prefill - spent).max(PREFILL_LEFT_MIN * f.own_prefill)
                    }
                };
                let expected = (f.max_tokens as f64 * self.output_share).max(1.0);
                Running {
                    prompt: f.context(),
                    prefill_left,
                    output_left: (expected - f.tokens as f64).max(1.0),
                }
            })
            .collect()
    }

    /// Seconds from now to `ticket`'s first token, behind the waiters granted before it
    /// (`me`: its own place in the queue; none for an arrival, which goes last among equals).
    fn predict(&self, ticket: &Ticket, me: Option<u64>) -> f64 {
        let now = Instant::now();
        let key = self.order(ticket.class, &ticket.tenant, me.unwrap_or(u64::MAX));
        let mut ahead: Vec<_> = self
            .waiters
            .iter()
            .filter(|w| Some(w.id) != me)
            .map(|w| (self.order(w.class, &w.ticket.tenant, w.id), w))
            .filter(|(k, _)| k < &key)
            .collect();
        ahead.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        let ahead: Vec<Pending> = ahead
            .into_iter()
            .map(|(_, w)| Pending {
                prompt: w.ticket.prompt_tokens,
                output: self.expected_output(&w.ticket),
            })
            .collect();
        let mine = Pending {
            prompt: ticket.prompt_tokens,
            output: self.expected_output(ticket),
        };
        predict::time_to_first_token(&self.model, self.gate(), &self.running(now), &ahead, mine)
    }

    /// The deadline `ticket` is held to under the limits in force.
    fn deadline(&self, ticket: &Ticket) -> Duration {
        let class_deadline = self.limits.deadline(ticket.class);
        let asked = ticket
            .deadline
            .map_or(class_deadline, |d| d.min(class_deadline));
        let alone = self.model.prefill(ticket.prompt_tokens, 0);
        asked.max(secs(2.0 * alone))
    }

    /// The deadline `ticket` is held to and its prediction, or `deadline_unmeetable`.
    pub(super) fn judge(&self, ticket: &Ticket) -> Result<(Duration, Duration), GatewayError> {
        let deadline = self.deadline(ticket);
        let predicted = secs(self.predict(ticket, None));
        if self.limits.predictive && predicted > deadline {
            return Err(unmeetable(ticket, predicted, deadline));
        }
        Ok((deadline, predicted))
    }

    /// Waiter `id`'s answer once its prediction misses its deadline (under the limits in
    /// force: a reload applies at the next re-check).
    pub(super) fn recheck(&self, id: u64) -> Option<GatewayError> {
        if !self.limits.predictive {
            return None;
        }
        let w = self.waiters.iter().find(|w| w.id == id)?;
        let deadline = self.deadline(&w.ticket);
        let predicted = w.arrived.elapsed() + secs(self.predict(&w.ticket, Some(id)));
        (predicted > deadline).then(|| unmeetable(&w.ticket, predicted, deadline))
    }

    /// `ticket`'s tenant starts waiting or running in its class: lifted to the others' floor.
    pub(super) fn backlogged(&mut self, ticket: &Ticket) {
        let class = ticket.class;
        let tenant = &*ticket.tenant;
        let active: Vec<&str> = self
            .waiters
            .iter()
            .filter(|w| w.class == class)
            .map(|w| &*w.ticket.tenant)
            .chain(
                self.flights
                    .values()
                    .filter(|f| f.class == class)
                    .map(|f| &*f.tenant),
            )
            .collect();
        if !active.contains(&tenant) {
            let active: Vec<String> = active.into_iter().map(str::to_owned).collect();
            self.fair
                .lift(class, tenant, active.iter().map(String::as_str));
        }
    }

    pub(super) fn start_flight(
        &mut self,
        id: u64,
        ticket: &Ticket,
        heavy: bool,
        arrived: Instant,
        predicted: Duration,
    ) {
        let now = Instant::now();
        let mine = Pending {
            prompt: ticket.prompt_tokens,
            output: self.expected_output(ticket),
        };
        let predicted_upstream =
            predict::time_to_first_token(&self.model, self.gate(), &self.running(now), &[], mine);
        let context: usize = self.flights.values().map(Flight::context).sum();
        let own_prefill = self.model.prefill(ticket.prompt_tokens, context);
        self.fair
            .charge(ticket.class, &ticket.tenant, ticket.prompt_tokens as f64);
        self.prefill_tokens += ticket.prompt_tokens;
        self.prefill_clock.set(self.prefill_tokens > 0, now);
        self.flights.insert(
            id,
            Flight {
                class: ticket.class,
                tenant: ticket.tenant.clone(),
                prompt: ticket.prompt_tokens,
                heavy,
                max_tokens: ticket.max_tokens,
                stream: ticket.stream,
                arrived,
                granted: now,
                predicted,
                predicted_upstream,
                own_prefill,
                context_at_grant: context,
                first: None,
                running_at_first: 0,
                context_at_first: 0,
                tokens: 0,
                tokens_beside_prefill: 0,
                prefill_clock_at_first: Duration::ZERO,
            },
        );
    }

    /// Flight `id`'s first token: out of the prefill budget (and the heavy lane), and the
    /// prefill fit learns.
    pub(super) fn first_token(&mut self, id: u64) -> Option<Pair> {
        let now = Instant::now();
        let running = self.flights.len();
        let context: usize = self.flights.values().map(Flight::context).sum();
        let f = self.flights.get_mut(&id)?;
        if f.first.is_some() {
            return None;
        }
        f.first = Some(now);
        f.running_at_first = running;
        f.context_at_first = context - f.context();
        self.prefill_tokens -= f.prompt;
        self.heavy_active -= usize::from(f.heavy);
        self.prefill_clock.set(self.prefill_tokens > 0, now);
        f.prefill_clock_at_first = self.prefill_clock.reading(now);
        if !f.stream {
            return None;
        }
        let f = f.clone();
        let upstream = now.saturating_duration_since(f.granted).as_secs_f64();
        let prefill = (f.own_prefill + upstream - f.predicted_upstream).max(0.0);
        self.model
            .observe_prefill(f.prompt, f.context_at_grant, prefill);
        let pair = Pair {
            at: now,
            predicted: f.predicted,
            actual: now.saturating_duration_since(f.arrived),
        };
        self.history.record(pair);
        Some(pair)
    }

    /// `n` more output tokens of flight `id`: charged to its tenant.
    pub(super) fn tokens(&mut self, id: u64, n: usize) {
        let weight = self.limits.fair_output_weight;
        let beside_prefill = self.prefill_clock.busy();
        if let Some(f) = self.flights.get_mut(&id) {
            f.tokens += n;
            if beside_prefill {
                f.tokens_beside_prefill += n;
            }
            let (class, tenant) = (f.class, f.tenant.clone());
            self.fair.charge(class, &tenant, weight * n as f64);
        }
    }

    /// Flight `id` ended: the decode fit and the output share learn from a stream.
    pub(super) fn end_flight(&mut self, id: u64) {
        let Some(f) = self.cancel_flight(id) else {
            return;
        };
        let (Some(first), true) = (f.first, f.stream) else {
            return;
        };
        // The steps outside any prefill: the time, and the gaps between tokens, beside one
        // were the prefill's (see `predict::busy`).
        let now = Instant::now();
        let beside = (self.prefill_clock.reading(now)).saturating_sub(f.prefill_clock_at_first);
        let decoding = now.saturating_duration_since(first).saturating_sub(beside);
        let gaps = (f.tokens.saturating_sub(1)).saturating_sub(f.tokens_beside_prefill);
        if gaps >= 2 && !decoding.is_zero() {
            let step = decoding.as_secs_f64() / gaps as f64;
            let running = (f.running_at_first + self.flights.len() + 1).div_ceil(2);
            self.model
                .observe_decode(running, f.context_at_first + f.context(), step);
        }
        if f.tokens > 0 && f.max_tokens > 0 {
            let share = (f.tokens as f64 / f.max_tokens as f64).min(1.0);
            self.output_share += OUTPUT_SHARE_GAIN * (share - self.output_share);
        }
    }

    /// Flight `id` is gone without a word on its timing.
    pub(super) fn cancel_flight(&mut self, id: u64) -> Option<Flight> {
        let f = self.flights.remove(&id)?;
        if f.first.is_none() {
            self.prefill_tokens -= f.prompt;
            self.heavy_active -= usize::from(f.heavy);
            self.prefill_clock
                .set(self.prefill_tokens > 0, Instant::now());
        }
        Some(f)
    }

    pub(super) fn prediction_view(&self) -> PredictionView {
        let now = Instant::now();
        PredictionView {
            predictive: self.limits.predictive,
            parameters: self.model.parameters(),
            median_error: self.history.median_error(now),
            output_share: self.output_share,
            points: self.history.points(now),
        }
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.clamp(0.0, 1e7))
}

fn unmeetable(ticket: &Ticket, predicted: Duration, deadline: Duration) -> GatewayError {
    GatewayError::DeadlineUnmeetable {
        class: ticket.class,
        predicted,
        deadline,
        retry_after: predicted
            .saturating_sub(deadline)
            .max(Duration::from_secs(1)),
    }
}
