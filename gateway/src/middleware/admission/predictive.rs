//! Predictive admission: each arrival's time to first token predicted from the work running
//! and the queue around it ([`crate::predict`]); refused at once when it misses its deadline,
//! re-checked while it waits; and the cost model refitted from every stream.
//!
//! One prediction serves the arrival and the re-check ([`State::first_tokens`]: the upstream
//! played forward under the grant rule admission itself follows), so a waiter is refused after
//! waiting only when the upstream turned out slower than the model said.
//!
//! - **Deadline.** The class's (`admission.interactive_ttft_deadline`, `batch_ttft_deadline`),
//!   lowered by `x-sluice-ttft-deadline-ms`. A prompt that cannot meet it even on an idle
//!   upstream is held to [`ALONE_SLACK`] times its idle prediction instead: served when the
//!   upstream is all but quiet, never refused forever.
//! - **Margin.** An arrival is admitted only if its prediction, lengthened by how far recent
//!   first tokens came later than predicted ([`State::margin`]), meets its deadline; a waiter
//!   is refused only once the prediction itself misses. An error the model has shown recently
//!   is then spent at arrival, not after waiting.
//! - **Promises.** An arrival whose place in the grant order (interactive first, the
//!   least-served tenant first) would push an admitted waiter past its deadline yields to it:
//!   it waits behind every waiter up to that one. If it then misses its own deadline it is
//!   refused; the waiter keeps what it was told.
//! - **Holds** (`admission.hold_for_returns`, off by default). An arrival that would make a
//!   request told to come back miss its deadline (when it returns at the time it was told) is
//!   refused: the room is that request's ([`super::hold`]).
//! - **A place in line for the refused.** A refusal's `Retry-After` is when the request would
//!   fit, and also waits for the prefills of the requests told before it to come back
//!   ([`State::told_to_return`]): a burst refused together is told to return one after another,
//!   not all at once to find room for only some; with holds on, it holds its room in every
//!   prediction until it comes back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::flight::Flight;
use super::hold::Hold;
use super::queue::{State, Ticket, Waiter};
use crate::error::{retry_after_secs, GatewayError, Stretched, Unmeetable};
use crate::policy::{Class, PrefillOrder};
use crate::predict::{self, Beside, Gate, Group, Pair, Parameters, Pending, Point, Running, Scene};

/// A prompt that cannot meet its deadline even alone is held to this many times its idle
/// prediction (with the arrival's margin, [`State::margin`]): served while the upstream is all
/// but quiet. At 2 (until 2026-12-06) an 8K prompt on Zen 3 (26 s alone against a 30 s
/// deadline) was admitted beside steady short traffic, took 33–37 s, missed anyway, and held
/// the short requests' prefills back for all of it (docs/capacity.md, item 5).
const ALONE_SLACK: f64 = 1.25;
/// The output share assumed before any stream ended: half of `max_tokens` (low, so a cold
/// model errs toward admitting).
pub const OUTPUT_SHARE_SEED: f64 = 0.5;
/// How much of a stream's output share the average takes in.
const OUTPUT_SHARE_GAIN: f64 = 0.2;
/// The least time a stream must have decoded beside other prefills to show its gap there: a
/// token or two in less says more about where the step boundaries fell than about the pace.
const BESIDE_PREFILL_MIN: Duration = Duration::from_millis(250);
/// A prefill running past its prediction by `x` is assumed to need this share of `x` more (so
/// the prediction stays continuous: exactly the model's until the prefill is late, then later
/// the later it is). The model's own time is kept to the end: a floor that bit earlier froze
/// every waiter's prediction for the prefill's last part (a 4K prefill's last 0.4 s).
const PREFILL_OVERRUN_SHARE: f64 = 0.5;
/// The margin of a prediction `p` is the [`MARGIN_QUANTILE`] of the last [`MARGIN_PAIRS`] first
/// tokens' lateness per root second ([`crate::predict::History::shortfall`]) times √max(p, 1 s),
/// at most [`MARGIN_MAX`] of `p` (beyond that the model is wrong, not noisy: its refit is the
/// fix). A share of `p` instead (as before 2026-12-02) lengthened a 26 s prediction by what 1 s
/// ones had been late, in share: behind an 8K prompt it refused short requests that met.
const MARGIN_PAIRS: usize = 32;
const MARGIN_QUANTILE: f64 = 0.8;
const MARGIN_MAX: f64 = 0.5;
/// The longest line of requests told to come back ([`State::told_to_return`]): under a long
/// overload the line would grow without end, and a longer wait says more about the overload
/// than about when this request fits (the OpenAI SDKs ignore a `Retry-After` over a minute).
const RETURN_LINE_MAX: Duration = Duration::from_secs(60);

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
    fn expected_output(&self, max_tokens: usize) -> f64 {
        (max_tokens as f64 * self.output_share).max(1.0)
    }

    /// The limits in force, as the grant rule takes them.
    pub(super) fn gate(&self) -> Gate {
        Gate {
            active_max: self.active_max(),
            prefill_tokens_max: self.limits.prefill_tokens_max,
            heavy_active_max: self.limits.heavy_active_max,
        }
    }

    /// Seconds from now to the first token of each waiter (in queue order), then of
    /// `arrival`'s, if one: the flights and the queue played forward
    /// ([`predict::first_tokens`]).
    pub(super) fn first_tokens(&self, arrival: Option<&Newcomer>) -> Vec<f64> {
        self.play(arrival, &self.waiters, true)
    }

    /// Seconds from now to the first token of a request granted now (behind the flights alone:
    /// the prefill fit learns from what this predicts).
    fn first_token_granted(&self, granted: &Newcomer) -> f64 {
        self.play(Some(granted), &VecDeque::new(), false)
            .last()
            .copied()
            .unwrap_or(0.0)
    }

    /// The prediction of `waiters`, then of `arrival`, with the holds if `holds`.
    fn play(
        &self,
        arrival: Option<&Newcomer>,
        waiters: &VecDeque<Waiter>,
        holds: bool,
    ) -> Vec<f64> {
        let now = Instant::now();
        let mut groups = Groups::default();
        // Each prefill's time so far: what was credited to it, and for the one the upstream's
        // order runs now, the time since the last credit.
        let (now_running, uncredited) = (self.prefilling_now(), self.uncredited(now));
        let running: Vec<Running> = self
            .by_grant()
            .into_iter()
            .map(|(id, f)| {
                let prefill_left = match f.first {
                    Some(_) => 0.0,
                    None => {
                        let extra = if now_running == Some(*id) {
                            uncredited
                        } else {
                            0.0
                        };
                        self.prefill_left(f, f.prefill_spent + extra) * f.stretch
                    }
                };
                Running {
                    prompt: f.context(),
                    prefill_left,
                    output_left: (self.expected_output(f.max_tokens) - f.tokens as f64).max(1.0),
                    group: groups.of(f.class, &f.tenant),
                    heavy: f.heavy && f.first.is_none(),
                }
            })
            .collect();
        let mut queue: Vec<Pending> = waiters
            .iter()
            .map(|w| Pending {
                yields_to: w.yields_to,
                ..self.pending(&mut groups, &w.ticket, w.class, w.heavy, w.id)
            })
            .collect();
        // The requests told to come back, each joining at its time ([`super::hold`]): after
        // the waiters, so that the answers stay in the waiters' order.
        let holds = match holds {
            true => self.live_holds(),
            false => Vec::new(),
        };
        for h in holds {
            let (t, heavy) = (&h.ticket, self.limits.is_heavy(h.ticket.prompt_tokens));
            queue.push(Pending {
                ready: h.back.saturating_duration_since(now).as_secs_f64(),
                ..self.pending(&mut groups, t, t.class, heavy, h.seq)
            });
        }
        if let Some(n) = arrival {
            let t = n.ticket;
            queue.push(Pending {
                yields_to: n.yields_to,
                ..self.pending(&mut groups, t, t.class, n.heavy, n.seq)
            });
        }
        let scene = Scene {
            gate: self.gate(),
            prefill_order: self.limits.prefill_order,
            output_weight: self.limits.fair_output_weight,
            groups: groups.resolve(self, arrival.map(|n| n.ticket)),
            running,
            queue,
            decoding: self.decoding_share(now),
            preemption: self.preemption(now),
        };
        predict::first_tokens(&self.model, &scene)
    }

    /// What shorter prompts still to come take from each prefill, where the upstream prefills
    /// the least left first ([`predict::Preemption`]): the last minute's grants at the prefill
    /// time the model gives them now (beside decodes for the share expected), less the
    /// requests still in prefill, which the prediction plays out as they are. A waiter's
    /// prefill is played at it; a flight's at what it was at the grant ([`Flight::stretch`]).
    fn preemption(&self, now: Instant) -> predict::Preemption {
        if self.limits.prefill_order != PrefillOrder::Shortest {
            return predict::Preemption::NONE;
        }
        let beside = Beside {
            context: 0,
            decoding: self.decoding_share(now),
        };
        let present = |id: u64| self.flights.get(&id).is_some_and(|f| f.first.is_none());
        self.recent_grants
            .preemption(now, present, |p| self.model.prefill(p, beside))
    }

    /// Seconds of prefill flight `f` has left after `spent` of it: the model's time less what
    /// was spent, and once that is past, [`PREFILL_OVERRUN_SHARE`] of how late it is.
    fn prefill_left(&self, f: &Flight, spent: f64) -> f64 {
        let own = self.model.prefill(f.prompt, f.beside_at_grant);
        let late = (spent - own).max(0.0);
        (own - spent)
            .max(PREFILL_OVERRUN_SHARE * late)
            .max(predict::PREFILL_LEFT_MIN)
    }

    /// The flights in grant order.
    fn by_grant(&self) -> Vec<(&u64, &Flight)> {
        let mut flights: Vec<(&u64, &Flight)> = self.flights.iter().collect();
        flights.sort_by_key(|(id, f)| (f.granted, **id));
        flights
    }

    /// The prefilling flight the upstream runs now under its prefill order
    /// ([`predict::prefill_next`], the simulation's rule). Prefill is taken as serial: the others
    /// wait, or were set aside for a shorter one.
    fn prefilling_now(&self) -> Option<u64> {
        let flights = self.by_grant();
        let left = flights.iter().map(|(_, f)| match f.first {
            Some(_) => 0.0,
            None => self.prefill_left(f, f.prefill_spent),
        });
        predict::prefill_next(self.limits.prefill_order, left).map(|i| *flights[i].0)
    }

    /// The share of a prefill starting now expected beside other requests' decodes: the larger
    /// of the share of recent time some request decoded, and the share of time at least one
    /// would decode if requests keep coming as in the last minute, each decoding its expected
    /// output at the gap beside a prefill (`1 − e^(−λD)`, as for a queue with a server for
    /// everyone). The second foresees what the first cannot: a long prefill slows the decodes
    /// beside it, so the requests that arrive during it decode beside it for longer (on Zen 3,
    /// 0.14 s a token there against 0.02 s alone); unseen gap: the first alone.
    fn decoding_share(&self, now: Instant) -> f64 {
        let recent = self.decode_clock.recent_share(now);
        let Some(gap) = self.model.decode_beside_prefill() else {
            return recent;
        };
        let at_once = self.recent_grants.decoding_at_once(now, gap);
        recent.max(1.0 - (-at_once).exp())
    }

    /// Where a prefill granted now would run: beside the flights' context, and beside decodes
    /// for the share [`Self::decoding_share`] expects.
    fn beside_now(&self, now: Instant) -> Beside {
        Beside {
            context: self.flights.values().map(Flight::context).sum(),
            decoding: self.decoding_share(now),
        }
    }

    /// Seconds since the upstream's prefill time was last credited.
    fn uncredited(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.prefill_credited)
            .as_secs_f64()
    }

    /// Credits the time since the last credit to the prefill the upstream runs now (none: it
    /// was idle, or only decoding). Called before every change to the flights.
    fn credit_prefill(&mut self, now: Instant) {
        let spent = self.uncredited(now);
        self.prefill_credited = now;
        if let Some(f) = self
            .prefilling_now()
            .and_then(|id| self.flights.get_mut(&id))
        {
            f.prefill_spent += spent;
        }
    }

    /// `ticket`'s request in `class` as the prediction's queue takes it, at place `seq` in the
    /// arrival order: waiting now, yielding to nobody.
    fn pending(
        &self,
        groups: &mut Groups,
        ticket: &Ticket,
        class: Class,
        heavy: bool,
        seq: u64,
    ) -> Pending {
        Pending {
            prompt: ticket.prompt_tokens,
            output: self.expected_output(ticket.max_tokens),
            group: groups.of(class, &ticket.tenant),
            batch: class == Class::Batch,
            heavy,
            seq,
            yields_to: None,
            ready: 0.0,
        }
    }

    /// The deadline `ticket` is held to under the limits in force.
    fn deadline(&self, ticket: &Ticket) -> HeldTo {
        let class_deadline = self.limits.deadline(ticket.class);
        let asked = ticket
            .deadline
            .map_or(class_deadline, |d| d.min(class_deadline));
        let by_request = asked < class_deadline;
        // With the margin an arrival is admitted under: on an idle upstream, a prompt that
        // cannot meet its deadline is always admitted, however late recent first tokens came.
        let alone = self.model.prefill(ticket.prompt_tokens, Beside::IDLE);
        let alone = secs(alone + self.margin(alone));
        let slack = alone.mul_f64(ALONE_SLACK);
        HeldTo {
            at: asked.max(slack),
            stretched: (slack > asked).then_some(Stretched {
                asked,
                by_request,
                alone,
            }),
        }
    }

    /// Seconds to add to a prediction of `predicted` seconds for how late recent first tokens
    /// came ([`MARGIN_QUANTILE`]): an arrival is admitted only if its prediction lengthened by
    /// this meets its deadline.
    pub(super) fn margin(&self, predicted: f64) -> f64 {
        let per_root_second = self
            .history
            .shortfall(Instant::now(), MARGIN_PAIRS, MARGIN_QUANTILE)
            .unwrap_or(0.0);
        (per_root_second * predicted.max(1.0).sqrt()).clamp(0.0, MARGIN_MAX * predicted)
    }

    /// The waiters (by id) that meet their deadline in `before` but not in `after`.
    fn pushed(&self, before: &[f64], after: &[f64]) -> Option<(u64, f64)> {
        self.waiters
            .iter()
            .zip(before.iter().zip(after))
            .filter(|(w, (b, a))| {
                let waited = w.arrived.elapsed().as_secs_f64();
                let d = self.deadline(&w.ticket).at.as_secs_f64();
                waited + **b <= d && waited + **a > d
            })
            .map(|(w, (b, _))| (w.id, *b))
            .reduce(|x, y| if y.0 > x.0 { y } else { x })
    }

    /// Among the holds that meet their deadline (counted from their time) in `before` but not
    /// in `after`, the latest first token in `before`, in seconds from now; `None` if no hold
    /// is pushed past its deadline. `before` and `after` are [`Self::first_tokens`] without and
    /// with an arrival: the waiters', then the holds', then the arrival's.
    fn held_from(&self, before: &[f64], after: &[f64]) -> Option<f64> {
        let now = Instant::now();
        let holds = self.live_holds();
        let n = self.waiters.len();
        // A hold that lapsed between the two predictions: no verdict from a misaligned pair.
        if before.len() != n + holds.len() || after.len() != n + holds.len() + 1 {
            return None;
        }
        holds
            .iter()
            .zip(before[n..].iter().zip(&after[n..]))
            .filter(|(h, (b, a))| {
                let ready = h.back.saturating_duration_since(now).as_secs_f64();
                let d = self.deadline(&h.ticket).at.as_secs_f64();
                **b - ready <= d && **a - ready > d
            })
            .map(|(_, (b, _))| *b)
            .reduce(f64::max)
    }

    /// An arrival's verdict: the deadline it is held to, its prediction, and the waiter it
    /// yields to; or `deadline_unmeetable`.
    pub(super) fn judge(
        &self,
        ticket: &Ticket,
        heavy: bool,
        seq: u64,
    ) -> Result<Judged, GatewayError> {
        let deadline = self.deadline(ticket);
        let mut newcomer = Newcomer {
            ticket,
            heavy,
            seq,
            yields_to: None,
        };
        let with = self.first_tokens(Some(&newcomer));
        let mut predicted = with.last().copied().unwrap_or(0.0);
        if !self.limits.predictive {
            return Ok(Judged {
                predicted: secs(predicted),
                yields_to: None,
            });
        }
        let before = self.first_tokens(None);
        let mut after = with;
        if let Some((to, first)) = self.pushed(&before, &after) {
            // It would break a waiter's promise: it goes behind it, or is refused.
            newcomer.yields_to = Some(to);
            after = self.first_tokens(Some(&newcomer));
            predicted = after.last().copied().unwrap_or(0.0);
            if self.pushed(&before, &after).is_some() {
                let wait = secs(first).max(Duration::from_secs(1));
                let why = Unmeetable::WouldDisplace;
                return Err(unmeetable(ticket, secs(predicted), deadline, wait, why));
            }
        }
        if let Some(first) = self.held_from(&before, &after) {
            // It would take the room of a request told to come back: it comes after it.
            let wait = secs(first).max(Duration::from_secs(1));
            return Err(unmeetable(
                ticket,
                secs(predicted),
                deadline,
                wait,
                Unmeetable::Held,
            ));
        }
        let margin = secs(self.margin(predicted));
        let padded = secs(predicted) + margin;
        if padded > deadline.at {
            let wait = padded.saturating_sub(deadline.at);
            let why = Unmeetable::Late { margin };
            return Err(unmeetable(ticket, secs(predicted), deadline, wait, why));
        }
        Ok(Judged {
            predicted: secs(predicted),
            yields_to: newcomer.yields_to,
        })
    }

    /// `err`'s `Retry-After` (a `deadline_unmeetable` for `ticket`) made a place in line
    /// ([`super::line::ReturnLine`]): no sooner than the prefills of the requests told to come
    /// back before it would be done, one after another (prefill is serial in the model), and
    /// this one's added behind them. Measured on the bundled engine (docs/capacity.md): eight
    /// clients at 1K tokens retrying as the OpenAI SDKs do got 15% of their retries in when each
    /// was told only when it alone would fit (they came back together), 29% with the line. A
    /// client that never comes back holds its place only until its prefill would be over.
    ///
    /// With `hold_for_returns` it then holds that room until it comes back ([`super::hold`]),
    /// in place `seq` of the grant order if it had one (a waiter refused while queued, or a
    /// request that had come back) or else in a new one.
    pub(super) fn told_to_return(
        &mut self,
        mut err: GatewayError,
        ticket: &Ticket,
        seq: Option<u64>,
    ) -> GatewayError {
        if let GatewayError::DeadlineUnmeetable {
            retry_after,
            line_full,
            ..
        } = &mut err
        {
            let prefill = secs(self.model.prefill(ticket.prompt_tokens, Beside::IDLE));
            (*retry_after, *line_full) = self.returns.place(*retry_after, prefill, RETURN_LINE_MAX);
            if self.limits.hold_for_returns {
                // Back when the client is told: `Retry-After` in whole seconds.
                let told = Duration::from_secs(retry_after_secs(*retry_after));
                let now = Instant::now();
                let hold = Hold {
                    seq: seq.unwrap_or_else(|| self.take_id()),
                    ticket: ticket.clone(),
                    back: now + told,
                };
                self.holds.keep(hold, self.limits.queue_depth, now);
            }
        }
        err
    }

    /// The holds in force (none while `hold_for_returns` is off).
    pub(super) fn live_holds(&self) -> Vec<&Hold> {
        match self.limits.hold_for_returns {
            true => self.holds.live(Instant::now()).collect(),
            false => Vec::new(),
        }
    }

    /// The first waiter (in queue order) whose prediction now misses its deadline, under the
    /// limits in force (a reload applies at the next re-check), and its answer: one prediction
    /// of the whole queue.
    pub(super) fn first_missed(&self) -> Option<(usize, GatewayError)> {
        if !self.limits.predictive || self.waiters.is_empty() {
            return None;
        }
        let left = self.first_tokens(None);
        self.waiters
            .iter()
            .zip(left)
            .enumerate()
            .find_map(|(i, (w, left))| {
                let deadline = self.deadline(&w.ticket);
                let predicted = w.arrived.elapsed() + secs(left);
                (predicted > deadline.at).then(|| {
                    let why = Unmeetable::Late {
                        margin: Duration::ZERO,
                    };
                    let err =
                        unmeetable(&w.ticket, predicted, deadline, predicted - deadline.at, why);
                    (i, err)
                })
            })
    }

    /// `ticket`'s tenant starts waiting or running in its class: lifted to the others' floor, or
    /// to where the class left off when nobody else waits or runs there ([`super::fair`]).
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
        self.credit_prefill(now);
        let alone = Newcomer {
            ticket,
            heavy,
            seq: self.next_id,
            yields_to: None,
        };
        // Granted now: behind the flights, before every waiter.
        let predicted_upstream = self.first_token_granted(&alone);
        let beside = self.beside_now(now);
        let own_prefill = self.model.prefill(ticket.prompt_tokens, beside);
        let stretch = self.preemption(now).stretch(ticket.prompt_tokens);
        let output = self.expected_output(ticket.max_tokens);
        self.recent_grants.push(predict::Grant {
            at: now,
            id,
            prompt: ticket.prompt_tokens,
            output,
        });
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
                started: None,
                predicted,
                predicted_upstream,
                own_prefill,
                stretch,
                beside_at_grant: beside,
                decode_clock_at_start: self.decode_clock.reading(now),
                first: None,
                prefill_spent: 0.0,
                running_at_first: 0,
                context_at_first: 0,
                tokens: 0,
                tokens_beside_prefill: 0,
                prefill_clock_at_first: Duration::ZERO,
            },
        );
    }

    /// The upstream has flight `id` now: its upstream time is taken from here, and what was
    /// predicted of it at the grant is predicted again as of now (behind the flights, as if
    /// granted now), so the prefill fit learns from the upstream's time alone. Before
    /// 2026-12-04 the time from the grant counted, and a wait at the shared ceiling or a 503
    /// retried by forward was learned as prefill. Ignored after the first token.
    pub(super) fn upstream_started(&mut self, id: u64) {
        self.credit_prefill(Instant::now());
        let Some(mut f) = self.flights.remove(&id) else {
            return;
        };
        if f.first.is_none() {
            let ticket = Ticket {
                class: f.class,
                prompt_tokens: f.prompt,
                tenant: f.tenant.clone(),
                max_tokens: f.max_tokens,
                deadline: None,
                stream: f.stream,
            };
            let alone = Newcomer {
                ticket: &ticket,
                heavy: f.heavy,
                seq: self.next_id,
                yields_to: None,
            };
            f.predicted_upstream = self.first_token_granted(&alone);
            let now = Instant::now();
            f.beside_at_grant = self.beside_now(now);
            f.own_prefill = self.model.prefill(f.prompt, f.beside_at_grant);
            f.stretch = self.preemption(now).stretch(f.prompt);
            f.decode_clock_at_start = self.decode_clock.reading(now);
            f.started = Some(now);
            f.prefill_spent = 0.0;
        }
        self.flights.insert(id, f);
    }

    /// Flight `id`'s first token: out of the prefill budget (and the heavy lane), and the
    /// prefill fit learns.
    pub(super) fn first_token(&mut self, id: u64) -> Option<Pair> {
        let now = Instant::now();
        self.credit_prefill(now);
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
        self.decode_clock.set(true, now);
        if !f.stream {
            return None;
        }
        let f = f.clone();
        let upstream = now
            .saturating_duration_since(f.upstream_from())
            .as_secs_f64();
        let prefill = (f.own_prefill + upstream - f.predicted_upstream).max(0.0);
        // Where it ran: the context predicted at the grant, and the share of its upstream time
        // that some other request decoded, as measured (its own decode starts only now).
        let decoded = self
            .decode_clock
            .reading(now)
            .saturating_sub(f.decode_clock_at_start);
        let beside = Beside {
            context: f.beside_at_grant.context,
            decoding: decoded.as_secs_f64() / upstream.max(f64::EPSILON),
        };
        // What the upstream spent on other requests first, as predicted.
        let others = (f.predicted_upstream - f.own_prefill).max(0.0);
        tracing::debug!(
            target: "sluice::predict",
            prompt = f.prompt,
            context = beside.context,
            decoding = beside.decoding,
            seconds = prefill,
            predicted = self.model.prefill(f.prompt, beside),
            others,
            "{}",
            predict::replay::MESSAGE
        );
        self.model
            .observe_prefill(f.prompt, beside, prefill, others);
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
        // And the gap between its tokens beside a prefill, when it decoded long enough beside
        // one to tell (none in that time is a gap of at least that time).
        if beside >= BESIDE_PREFILL_MIN {
            let tokens = f.tokens_beside_prefill.max(1) as f64;
            self.model
                .observe_decode_beside_prefill(beside.as_secs_f64() / tokens);
        }
        if f.tokens > 0 && f.max_tokens > 0 {
            let share = (f.tokens as f64 / f.max_tokens as f64).min(1.0);
            self.output_share += OUTPUT_SHARE_GAIN * (share - self.output_share);
        }
    }

    /// Flight `id` is gone without a word on its timing.
    pub(super) fn cancel_flight(&mut self, id: u64) -> Option<Flight> {
        self.credit_prefill(Instant::now());
        let f = self.flights.remove(&id)?;
        let decoding = self.flights.values().any(|f| f.first.is_some());
        self.decode_clock.set(decoding, Instant::now());
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

/// The deadline a request is held to, and why it is later than the one asked if it is.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeldTo {
    pub at: Duration,
    pub stretched: Option<Stretched>,
}

fn unmeetable(
    ticket: &Ticket,
    predicted: Duration,
    deadline: HeldTo,
    wait: Duration,
    why: Unmeetable,
) -> GatewayError {
    GatewayError::DeadlineUnmeetable {
        class: ticket.class,
        predicted,
        deadline: deadline.at,
        stretched: deadline.stretched,
        retry_after: wait.max(Duration::from_secs(1)),
        why,
        line_full: false,
    }
}

/// An arrival as the prediction places it.
pub(super) struct Newcomer<'a> {
    pub ticket: &'a Ticket,
    pub heavy: bool,
    /// Its place in arrival order.
    pub seq: u64,
    pub yields_to: Option<u64>,
}

/// An arrival's prediction (arrival → first token) and the waiter it yields to.
pub(super) struct Judged {
    pub predicted: Duration,
    pub yields_to: Option<u64>,
}

/// The tenants of a prediction, per class: an index each, then their counters.
#[derive(Default)]
struct Groups {
    keys: Vec<(Class, Arc<str>)>,
}

impl Groups {
    fn of(&mut self, class: Class, tenant: &Arc<str>) -> usize {
        match self
            .keys
            .iter()
            .position(|(c, t)| *c == class && t == tenant)
        {
            Some(i) => i,
            None => {
                self.keys.push((class, tenant.clone()));
                self.keys.len() - 1
            }
        }
    }

    /// Counters and the tenants present beside each, counting `arrival`'s as present.
    fn resolve(&self, st: &State, arrival: Option<&Ticket>) -> Vec<Group> {
        let newly_present = arrival.filter(|t| !st.fair.present(t.class, &t.tenant));
        self.keys
            .iter()
            .map(|(class, tenant)| {
                let joins = newly_present.is_some_and(|t| t.class == *class && t.tenant != *tenant);
                Group {
                    counter: st.fair.counter(*class, tenant),
                    others: st.fair.others_present(*class, tenant) + usize::from(joins),
                }
            })
            .collect()
    }
}
