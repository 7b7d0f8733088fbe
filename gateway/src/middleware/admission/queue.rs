//! The admission state: active slots, the heavy-input lane, and the bounded FIFO of requests
//! waiting for a slot.
//!
//! Rules (the policy's `[admission]` table):
//! - at most `active_max` requests hold a slot; at most `heavy_active_max` heavy ones (prompt
//!   above `heavy_input_tokens`) are in their prefill at once — the heavy lane is a case of
//!   the prefill budget below, counted in requests;
//! - `batch` requests never take the last free slot (with `active_max = 1`, batch runs only
//!   while no interactive request waits), and are shed first: an interactive arrival at a
//!   full queue evicts the newest waiting batch request;
//! - waiters are granted slots interactive first, then batch, FIFO within a class; a waiter
//!   that cannot run yet (heavy lane busy) does not block the ones behind it;
//! - after every change the queue is dispatched until no waiter can run, so a new arrival
//!   that finds a slot it may take can have it without overtaking anyone who could have run:
//!   a slot or a prefill freed, a waiter gone (one that others yield to, or the interactive
//!   waiter that held batch off the last slot), new limits or capacity, and, for what changes
//!   with time alone (a tenant's presence lapsing after [`super::fair::PRESENT_FOR`]), every
//!   re-check tick ([`super::wait::RECHECK_EVERY`]);
//! - at most `prefill_tokens_max` prompt tokens are admitted but not yet past their prefill
//!   (a longer prompt runs when nothing else prefills): four 8K prefills never run at once;
//!   where the upstream prefills the least left first, a prompt counts only the prompts in
//!   prefill no longer than itself, which it would wait behind ([`prefill_ahead`]);
//! - within a class, the tenant with the lowest virtual token counter goes first ([`super::fair`]);
//! - with `predictive`, an arrival whose predicted time to first token misses its deadline is
//!   refused at once with `deadline_unmeetable` ([`super::predictive`]), and so is a waiter as
//!   soon as its prediction misses; an arrival that would push an admitted waiter past its
//!   deadline yields to it (or is refused).
//!
//! The slot rules and the grant order are [`crate::predict::gate`]'s, which the prediction
//! plays forward too.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::drain::DrainRate;
use super::fair::Fairness;
use super::flight::Flight;
use super::hold::Holds;
use super::line::ReturnLine;
use super::wait::RECHECK_EVERY;
use crate::error::GatewayError;
use crate::policy::{self, Class, Cost, PrefillOrder};
use crate::predict::{
    interactive_waiting, next_granted, prefill_ahead, Ask, BusyClock, CostModel, Held, History,
    Place, RecentGrants, Share,
};

/// The limits admission enforces (a view of the policy's `[admission]` table).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub active_max: usize,
    pub queue_depth: usize,
    pub queue_wait_max: Duration,
    pub heavy_input_tokens: usize,
    pub heavy_active_max: usize,
    pub predictive: bool,
    pub interactive_ttft_deadline: Duration,
    pub batch_ttft_deadline: Duration,
    pub prefill_tokens_max: usize,
    pub fair_output_weight: f64,
    pub hold_for_returns: bool,
    pub cost: Cost,
    /// The upstream's prefill order, which the prediction plays.
    pub prefill_order: PrefillOrder,
}

impl From<&policy::Admission> for Limits {
    fn from(a: &policy::Admission) -> Self {
        Self {
            active_max: a.active_max,
            queue_depth: a.queue_depth,
            queue_wait_max: a.queue_wait_max,
            heavy_input_tokens: a.heavy_input_tokens,
            heavy_active_max: a.heavy_active_max,
            predictive: a.predictive,
            interactive_ttft_deadline: a.interactive_ttft_deadline,
            batch_ttft_deadline: a.batch_ttft_deadline,
            prefill_tokens_max: a.prefill_tokens_max,
            fair_output_weight: a.fair_output_weight,
            hold_for_returns: a.hold_for_returns,
            cost: a.cost.clone(),
            prefill_order: PrefillOrder::default(),
        }
    }
}

impl From<&policy::Policy> for Limits {
    /// `[admission]`, and the upstream's prefill order.
    fn from(p: &policy::Policy) -> Self {
        Self {
            prefill_order: p.upstream.prefill_order(),
            ..Self::from(&p.admission)
        }
    }
}

impl Limits {
    /// Whether a prompt of `prompt_tokens` takes the heavy lane.
    pub fn is_heavy(&self, prompt_tokens: usize) -> bool {
        prompt_tokens > self.heavy_input_tokens
    }

    /// The policy's deadline for `class`.
    pub fn deadline(&self, class: Class) -> Duration {
        match class {
            Class::Interactive => self.interactive_ttft_deadline,
            Class::Batch => self.batch_ttft_deadline,
        }
    }
}

/// What a request asks admission for.
#[derive(Clone, Debug, PartialEq)]
pub struct Ticket {
    pub class: Class,
    pub prompt_tokens: usize,
    /// The tenant whose fair share it comes from (`"anonymous"` when the gateway runs open).
    pub tenant: Arc<str>,
    /// The most tokens it may generate.
    pub max_tokens: usize,
    /// A deadline the client asked for (`x-sluice-ttft-deadline-ms`); only ever lowers the
    /// class's.
    pub deadline: Option<Duration>,
    /// Whether the response streams (only streams time their first token and their steps).
    pub stream: bool,
}

impl Ticket {
    /// A streamed request of `class` with `prompt_tokens`, from the anonymous tenant, with up to
    /// 128 output tokens.
    pub fn new(class: Class, prompt_tokens: usize) -> Self {
        Self {
            class,
            prompt_tokens,
            tenant: Arc::from("anonymous"),
            max_tokens: 128,
            deadline: None,
            stream: true,
        }
    }
}

/// A snapshot of the admission state (for metrics, `/readyz` and the status page).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub active: usize,
    pub heavy_active: usize,
    pub queued_interactive: usize,
    pub queued_batch: usize,
    pub active_max: usize,
    pub queue_depth: usize,
    /// Prompt tokens admitted and not yet past their prefill, and the bound.
    pub prefill_tokens: usize,
    pub prefill_tokens_max: usize,
    /// Requests told to come back whose room the prediction holds ([`super::hold`]).
    pub holds: usize,
}

/// Shared admission state. Cheap to clone through `Arc`.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) limits: Limits,
    /// The upstream's own ceiling (replicas up and not saturated), below `active_max`.
    capacity: Option<usize>,
    active: usize,
    /// Heavy requests not yet past their prefill.
    pub(super) heavy_active: usize,
    pub(super) waiters: VecDeque<Waiter>,
    pub(super) next_id: u64,
    drain: DrainRate,
    /// Tasks parked in `poll_ready` while the queue is full.
    ready_wakers: Vec<std::task::Waker>,
    /// The requests holding a slot, by permit id.
    pub(super) flights: HashMap<u64, Flight>,
    /// Prompt tokens of the flights not yet past their prefill, and how long there were any.
    pub(super) prefill_tokens: usize,
    pub(super) prefill_clock: BusyClock,
    /// How long some flight was decoding (past its first token): the share of a prefill
    /// beside decodes, measured and predicted ([`crate::predict::Beside`]).
    pub(super) decode_clock: BusyClock,
    /// The requests granted over the last minute and the output each is expected to decode:
    /// how much the arrivals will decode beside a prefill (`State::decoding_share`).
    pub(super) recent_grants: RecentGrants,
    /// Until when the upstream's prefill time has been credited to the flights
    /// ([`Flight::prefill_spent`], `State::credit_prefill`).
    pub(super) prefill_credited: Instant,
    pub(super) fair: Fairness,
    pub(super) model: CostModel,
    pub(super) history: History,
    /// Output tokens generated as a share of `max_tokens`, averaged over recent streams.
    pub(super) output_share: f64,
    /// When a re-check tick last re-checked (and dispatched) the queue.
    swept: Instant,
    /// The requests told to come back by `deadline_unmeetable`, each holding the line for its
    /// prefill ([`State::told_to_return`]).
    pub(super) returns: ReturnLine,
    /// Room kept in the prediction for the requests told to come back by `deadline_unmeetable`
    /// ([`super::hold`]).
    pub(super) holds: Holds,
    /// The requests shed with a full queue (`overloaded`), each holding it for one departure.
    sheds: ReturnLine,
}

#[derive(Debug)]
pub(super) struct Waiter {
    pub id: u64,
    pub class: Class,
    pub heavy: bool,
    pub ticket: Ticket,
    pub arrived: Instant,
    /// Its prediction on arrival.
    pub predicted: Duration,
    /// Not granted while a waiter up to this id is queued ([`crate::predict::Place`]).
    pub yields_to: Option<u64>,
    tx: oneshot::Sender<Result<Permit, GatewayError>>,
}

/// A held slot. Dropping it frees the slot and lets the next waiter in.
#[derive(Debug)]
pub struct Permit {
    admission: Option<Arc<Admission>>,
    id: u64,
    heavy: bool,
    granted_at: Instant,
    predicted: Duration,
}

impl Permit {
    /// When the slot was granted.
    pub fn granted_at(&self) -> Instant {
        self.granted_at
    }

    /// The flight's id: grants are numbered in the order they were made.
    #[cfg(test)]
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Whether the request counts against the heavy-input lane.
    pub fn is_heavy(&self) -> bool {
        self.heavy
    }

    /// The predicted time to first token, from arrival at admission.
    pub fn predicted(&self) -> Duration {
        self.predicted
    }

    /// The response's first token went by (its prefill is over): its prompt leaves the
    /// prefill budget. Returns the prediction and what it got, for a stream.
    pub fn first_token(&self) -> Option<crate::predict::Pair> {
        let admission = self.admission.as_ref()?;
        let mut st = admission.lock();
        let pair = st.first_token(self.id);
        st.dispatch(admission);
        pair
    }

    /// A handle that marks when the upstream has the request (after the shared ceiling's lease,
    /// or at a retry): its prefill is timed from there, not from the grant; the latest mark
    /// before the first token counts. For the stages below admission (the admission service
    /// puts one in the request's extensions).
    pub fn upstream_start(&self) -> UpstreamStart {
        UpstreamStart {
            admission: self
                .admission
                .as_ref()
                .map_or_else(Weak::new, Arc::downgrade),
            id: self.id,
        }
    }

    /// `n` more output tokens went by.
    pub fn tokens(&self, n: usize) {
        if let Some(admission) = &self.admission {
            admission.lock().tokens(self.id, n);
        }
    }
}

/// Marks when the upstream started on a granted request ([`Permit::upstream_start`]): a
/// request extension from the admission service, for the stages between it and the upstream
/// (the shared ceiling marks once it holds its lease). Once the permit is gone, a no-op.
#[derive(Clone, Debug)]
pub struct UpstreamStart {
    admission: Weak<Admission>,
    id: u64,
}

impl UpstreamStart {
    pub fn mark(&self) {
        if let Some(admission) = self.admission.upgrade() {
            admission.lock().upstream_started(self.id);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            let mut st = admission.lock();
            st.release(self.id);
            st.dispatch(&admission);
        }
    }
}

/// Wakes nothing. A caller that never parks on a Pending `poll_ready` polls with it
/// ([`super::Shed`]), and [`Admission::accepting`] keeps no copy of it; before 2026-12-04 the
/// task's waker of every request shed was kept until the next dispatch.
struct NeverParked;

impl std::task::Wake for NeverParked {
    fn wake(self: Arc<Self>) {}
}

static NEVER_PARKED: std::sync::LazyLock<Arc<NeverParked>> =
    std::sync::LazyLock::new(|| Arc::new(NeverParked));

/// The waker of a caller that never parks (known by its data pointer: comparing wakers'
/// vtables, as `will_wake` does, is not reliable for a const one such as `Waker::noop`).
pub(super) fn never_parked() -> std::task::Waker {
    std::task::Waker::from(NEVER_PARKED.clone())
}

fn is_never_parked(waker: &std::task::Waker) -> bool {
    std::ptr::eq(waker.data(), Arc::as_ptr(&NEVER_PARKED).cast::<()>())
}

/// The outcome of an arrival.
#[derive(Debug)]
pub enum Arrival {
    Granted(Permit),
    /// In the queue since `arrived`: await the receiver (until `arrived` +
    /// [`Admission::queue_wait_max`], read again at each re-check: a reload applies to the
    /// waiters too), or [`Admission::leave`].
    Queued {
        id: u64,
        rx: oneshot::Receiver<Result<Permit, GatewayError>>,
        arrived: Instant,
    },
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                capacity: None,
                active: 0,
                heavy_active: 0,
                waiters: VecDeque::new(),
                next_id: 0,
                drain: DrainRate::default(),
                ready_wakers: Vec::new(),
                flights: HashMap::new(),
                prefill_tokens: 0,
                prefill_clock: BusyClock::default(),
                decode_clock: BusyClock::default(),
                recent_grants: RecentGrants::default(),
                prefill_credited: Instant::now(),
                fair: Fairness::default(),
                model: CostModel::new(&limits.cost),
                history: History::default(),
                output_share: super::predictive::OUTPUT_SHARE_SEED,
                swept: Instant::now(),
                returns: ReturnLine::new(),
                holds: Holds::default(),
                sheds: ReturnLine::new(),
                limits,
            }),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent between statements, so a panic elsewhere never leaves it
        // half-updated: keep going with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.lock().limits.clone()
    }

    /// Applies new limits: raising `active_max` admits waiters now; lowering it only stops
    /// admitting until the count falls (running requests are never touched); a shorter queue
    /// sheds its newest waiters (batch first) with `overloaded`.
    pub fn set_limits(self: &Arc<Self>, limits: Limits) {
        let mut st = self.lock();
        if st.limits.cost != limits.cost {
            // A new calibration: the fit starts again from it.
            st.model = CostModel::new(&limits.cost);
        }
        st.limits = limits;
        while st.waiters.len() > st.limits.queue_depth {
            let victim = st
                .waiters
                .iter()
                .rposition(|w| w.class == Class::Batch)
                .unwrap_or(st.waiters.len() - 1);
            if let Some(w) = st.waiters.remove(victim) {
                let err = st.overloaded(w.class);
                let _ = w.tx.send(Err(err));
            }
        }
        st.dispatch(self);
        st.wake_ready();
    }

    /// The upstream's ceiling: at most `capacity` slots even if `active_max` allows more
    /// (`None`: `active_max` alone). Lowering it never touches running requests.
    pub fn set_capacity(self: &Arc<Self>, capacity: Option<usize>) {
        let mut st = self.lock();
        st.capacity = capacity;
        st.dispatch(self);
        st.wake_ready();
    }

    /// Whether an arrival could be queued or granted now (`poll_ready`'s answer): a free
    /// slot, a free queue place, or a batch waiter an interactive arrival may evict. When not,
    /// `waker` is woken at the next change (tower's contract for a Pending `poll_ready`), unless
    /// it is [`never_parked`]'s: [`super::Shed`] asks with that, since it never parks.
    pub fn accepting(&self, waker: &std::task::Waker) -> bool {
        let mut st = self.lock();
        let ok = st.active < st.active_max()
            || st.waiters.len() < st.limits.queue_depth
            || st.waiters.iter().any(|w| w.class == Class::Batch);
        if !ok && !is_never_parked(waker) && !st.ready_wakers.iter().any(|w| w.will_wake(waker)) {
            st.ready_wakers.push(waker.clone());
        }
        ok
    }

    /// An arrival: a slot now, a queue place, `overloaded`, or (predictive) a refusal at once
    /// when its deadline cannot be met.
    pub fn arrive(self: &Arc<Self>, ticket: Ticket) -> Result<Arrival, GatewayError> {
        let mut st = self.lock();
        if !st.waiters.is_empty() && st.active < st.active_max() {
            // Whoever time alone has let run since the last tick goes first.
            st.dispatch(self);
        }
        let heavy = st.limits.is_heavy(ticket.prompt_tokens);
        st.backlogged(&ticket);
        // A request told to come back takes its place in the order again ([`super::hold`]).
        let returning = match st.limits.hold_for_returns {
            true => st.holds.take(&ticket, Instant::now()),
            false => None,
        };
        let seq = returning.unwrap_or(st.next_id);
        let judged = match st.judge(&ticket, heavy, seq) {
            Ok(judged) => judged,
            Err(err) => return Err(st.told_to_return(err, &ticket, returning)),
        };
        let predicted = judged.predicted;
        st.fair.seen(ticket.class, &ticket.tenant);
        if judged.yields_to.is_none() && st.may_run(&ticket, heavy) {
            let arrived = Instant::now();
            return Ok(Arrival::Granted(
                st.grant(self, &ticket, heavy, arrived, predicted),
            ));
        }
        let mut evicted = false;
        if st.waiters.len() >= st.limits.queue_depth {
            let evict = match ticket.class {
                Class::Interactive => st.waiters.iter().rposition(|w| w.class == Class::Batch),
                Class::Batch => None,
            };
            match evict.and_then(|i| st.waiters.remove(i)) {
                Some(w) => {
                    let err = st.overloaded(Class::Batch);
                    let _ = w.tx.send(Err(err));
                    evicted = true;
                }
                None => return Err(st.overloaded(ticket.class)),
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = returning.unwrap_or_else(|| st.take_id());
        let arrived = Instant::now();
        st.waiters.push_back(Waiter {
            id,
            class: ticket.class,
            heavy,
            ticket,
            arrived,
            predicted,
            yields_to: judged.yields_to,
            tx,
        });
        if evicted {
            // A waiter gone: the ones that yielded to it, or that batch held off the last slot,
            // may run now, not at their next re-check tick (the arrival too, in its turn).
            st.dispatch(self);
        }
        Ok(Arrival::Queued { id, rx, arrived })
    }

    /// The longest wait for a slot under the limits in force.
    pub fn queue_wait_max(&self) -> Duration {
        self.lock().limits.queue_wait_max
    }

    /// A waiter's re-check tick; at most once per [`RECHECK_EVERY`], whoever ticks, it re-checks
    /// the whole queue: one prediction refuses every waiter that now misses its deadline
    /// (`deadline_unmeetable`, through its channel: it leaves the queue), and while a slot is
    /// free the queue is dispatched (a waiter held back by a tenant whose presence has since
    /// lapsed may run now). Each waiter ticks every [`RECHECK_EVERY`], so every one is re-checked
    /// at least that often. Before 2026-12-04 every waiter's tick ran its own prediction of the
    /// whole queue: with 512 waiters, 1.5 s of work under the lock every 250 ms.
    pub fn recheck(self: &Arc<Self>) {
        let mut st = self.lock();
        let now = Instant::now();
        if now.duration_since(st.swept) < RECHECK_EVERY {
            return;
        }
        st.swept = now;
        let mut refused = false;
        // In queue order, predicted again after each refusal (the ones behind it may meet now).
        while let Some((i, err)) = st.first_missed() {
            if let Some(w) = st.waiters.remove(i) {
                let err = st.told_to_return(err, &w.ticket, Some(w.id));
                let _ = w.tx.send(Err(err));
            }
            refused = true;
        }
        if refused || st.active < st.active_max() {
            st.dispatch(self);
        }
    }

    #[cfg(test)]
    pub(super) fn ready_wakers(&self) -> usize {
        self.lock().ready_wakers.len()
    }

    /// The cost model's coefficients, the prediction error and the recent pairs.
    pub fn prediction(&self) -> super::predictive::PredictionView {
        self.lock().prediction_view()
    }

    /// Takes waiter `id` out of the queue (it timed out or its client went away), and lets in
    /// whoever it held back; false when it was no longer there (granted or shed in the
    /// meantime: its receiver holds the answer).
    pub fn leave(self: &Arc<Self>, id: u64) -> bool {
        let mut st = self.lock();
        let before = st.waiters.len();
        st.waiters.retain(|w| w.id != id);
        let left = st.waiters.len() != before;
        if left {
            st.dispatch(self);
        }
        left
    }

    /// The `overloaded` answer for a `class` arrival now.
    pub fn overloaded(&self, class: Class) -> GatewayError {
        self.lock().overloaded(class)
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.lock().waiters.len()
    }

    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        let batch = st
            .waiters
            .iter()
            .filter(|w| w.class == Class::Batch)
            .count();
        Snapshot {
            active: st.active,
            heavy_active: st.heavy_active,
            queued_interactive: st.waiters.len() - batch,
            queued_batch: batch,
            active_max: st.active_max(),
            queue_depth: st.limits.queue_depth,
            prefill_tokens: st.prefill_tokens,
            prefill_tokens_max: st.limits.prefill_tokens_max,
            holds: st.live_holds().len(),
        }
    }
}

impl State {
    /// The ceiling in force: the policy's, lowered by the upstream's capacity.
    pub(super) fn active_max(&self) -> usize {
        self.capacity
            .map_or(self.limits.active_max, |c| c.min(self.limits.active_max))
    }

    /// Whether an interactive waiter could be granted before batch ([`interactive_waiting`]).
    fn interactive_waiting(&self) -> bool {
        let order: Vec<Place> = self.waiters.iter().map(|w| self.place(w)).collect();
        interactive_waiting(&order)
    }

    /// Whether `ticket` may take a slot and its prompt's prefill tokens now (the rule of
    /// [`crate::predict::gate`]).
    pub(super) fn may_run(&self, ticket: &Ticket, heavy: bool) -> bool {
        self.may_run_beside(ticket, heavy, self.interactive_waiting())
    }

    /// [`Self::may_run`], given whether an interactive waiter could be granted before batch
    /// (the same for every waiter of one dispatch round: computed once, not once per waiter).
    fn may_run_beside(&self, ticket: &Ticket, heavy: bool, interactive_waiting: bool) -> bool {
        let prefilling = (self.flights.values())
            .filter(|f| f.first.is_none())
            .map(|f| f.prompt);
        let held = Held {
            active: self.active,
            heavy_prefilling: self.heavy_active,
            prefill_tokens: prefill_ahead(
                self.limits.prefill_order,
                ticket.prompt_tokens,
                prefilling,
            ),
            interactive_waiting,
        };
        let (slots, prefill_tokens) = self
            .flights
            .values()
            .filter(|f| f.class == ticket.class && f.tenant == ticket.tenant)
            .fold((0, 0), |(n, p), f| {
                (n + 1, p + if f.first.is_none() { f.prompt } else { 0 })
            });
        let share = Share {
            others: self.fair.others_present(ticket.class, &ticket.tenant),
            slots,
            prefill_tokens,
        };
        let ask = Ask {
            batch: ticket.class == Class::Batch,
            heavy,
            prompt: ticket.prompt_tokens,
        };
        self.gate().admits(&held, &share, &ask)
    }

    fn grant(
        &mut self,
        admission: &Arc<Admission>,
        ticket: &Ticket,
        heavy: bool,
        arrived: Instant,
        predicted: Duration,
    ) -> Permit {
        self.active += 1;
        self.heavy_active += usize::from(heavy);
        let id = self.take_id();
        self.start_flight(id, ticket, heavy, arrived, predicted);
        Permit {
            admission: Some(admission.clone()),
            id,
            heavy,
            granted_at: Instant::now(),
            predicted,
        }
    }

    fn release(&mut self, id: u64) {
        self.active -= 1;
        self.end_flight(id);
        self.drain.record(Instant::now());
    }

    /// A new number in arrival order (waiters, grants and holds share it).
    pub(super) fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Where a waiter stands in the grant order.
    pub(super) fn place(&self, w: &Waiter) -> Place {
        Place {
            batch: w.class == Class::Batch,
            counter: self.fair.counter(w.class, &w.ticket.tenant),
            seq: w.id,
            yields_to: w.yields_to,
        }
    }

    /// Grants slots to waiters until none can run, in [`next_granted`]'s order: interactive
    /// first, then batch; within a class the least-served tenant first, FIFO within a tenant.
    fn dispatch(&mut self, admission: &Arc<Admission>) {
        loop {
            let interactive_waiting = self.interactive_waiting();
            let places: Vec<(Place, bool)> = self
                .waiters
                .iter()
                .map(|w| {
                    let may = self.may_run_beside(&w.ticket, w.heavy, interactive_waiting);
                    (self.place(w), may)
                })
                .collect();
            let next = next_granted(&places);
            let Some(w) = next.and_then(|i| self.waiters.remove(i)) else {
                break;
            };
            let permit = self.grant(admission, &w.ticket, w.heavy, w.arrived, w.predicted);
            if let Err(Ok(mut permit)) = w.tx.send(Ok(permit)) {
                // The waiter is gone (its client left): undo the grant here, under the
                // lock, instead of letting the permit's drop take the lock again.
                permit.admission = None;
                self.active -= 1;
                self.cancel_flight(permit.id);
            }
        }
        self.wake_ready();
    }

    fn wake_ready(&mut self) {
        for w in self.ready_wakers.drain(..) {
            w.wake();
        }
    }

    /// `overloaded`, with a `Retry-After` from how fast the queue drains: a place in line
    /// behind the requests shed before it (one departure each, [`ReturnLine`]), no longer
    /// than `queue_wait_max`.
    fn overloaded(&mut self, class: Class) -> GatewayError {
        let now = Instant::now();
        let longest = self.limits.queue_wait_max.max(Duration::from_secs(1));
        let ahead = self.waiters.len() + 1;
        let retry_after = match (self.drain.time_for(ahead, now), self.drain.time_for(1, now)) {
            (Some(wait), Some(each)) => self.sheds.place(wait, each, longest).0,
            _ => self.limits.queue_wait_max,
        };
        let retry_after = retry_after.clamp(Duration::from_secs(1), longest);
        GatewayError::Overloaded { class, retry_after }
    }
}
