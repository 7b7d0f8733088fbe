//! The admission state: active slots, the heavy-input lane, and the bounded FIFO of requests
//! waiting for a slot.
//!
//! Rules (the policy's `[admission]` table):
//! - at most `active_max` requests hold a slot; at most `heavy_active_max` of them are heavy
//!   (prompt above `heavy_input_tokens`);
//! - `batch` requests never take the last free slot (with `active_max = 1`, batch runs only
//!   while no interactive request waits), and are shed first: an interactive arrival at a
//!   full queue evicts the newest waiting batch request;
//! - waiters are granted slots interactive first, then batch, FIFO within a class; a waiter
//!   that cannot run yet (heavy lane busy) does not block the ones behind it;
//! - after every change the queue is dispatched until no waiter can run, so a new arrival
//!   that finds a slot it may take can have it without overtaking anyone who could have run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::drain::DrainRate;
use crate::error::GatewayError;
use crate::policy::{self, Class};

/// The limits admission enforces (a view of the policy's `[admission]` table).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub active_max: usize,
    pub queue_depth: usize,
    pub queue_wait_max: Duration,
    pub heavy_input_tokens: usize,
    pub heavy_active_max: usize,
}

impl From<&policy::Admission> for Limits {
    fn from(a: &policy::Admission) -> Self {
        Self {
            active_max: a.active_max,
            queue_depth: a.queue_depth,
            queue_wait_max: a.queue_wait_max,
            heavy_input_tokens: a.heavy_input_tokens,
            heavy_active_max: a.heavy_active_max,
        }
    }
}

/// What a request asks admission for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub class: Class,
    pub prompt_tokens: usize,
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
}

/// Shared admission state. Cheap to clone through `Arc`.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limits: Limits,
    /// The upstream's own ceiling (replicas up and not saturated), below `active_max`.
    capacity: Option<usize>,
    active: usize,
    heavy_active: usize,
    waiters: VecDeque<Waiter>,
    next_id: u64,
    drain: DrainRate,
    /// Tasks parked in `poll_ready` while the queue is full.
    ready_wakers: Vec<std::task::Waker>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    class: Class,
    heavy: bool,
    tx: oneshot::Sender<Result<Permit, GatewayError>>,
}

/// A held slot. Dropping it frees the slot and lets the next waiter in.
#[derive(Debug)]
pub struct Permit {
    admission: Option<Arc<Admission>>,
    heavy: bool,
    granted_at: Instant,
}

impl Permit {
    /// When the slot was granted (the start of upstream time).
    pub fn granted_at(&self) -> Instant {
        self.granted_at
    }

    /// Whether the request counts against the heavy-input lane.
    pub fn is_heavy(&self) -> bool {
        self.heavy
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            let mut st = admission.lock();
            st.release(self.heavy);
            st.dispatch(&admission);
        }
    }
}

/// The outcome of an arrival.
#[derive(Debug)]
pub enum Arrival {
    Granted(Permit),
    /// In the queue: await the receiver (with the deadline), or [`Admission::leave`].
    Queued {
        id: u64,
        rx: oneshot::Receiver<Result<Permit, GatewayError>>,
        deadline: Instant,
    },
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                limits,
                capacity: None,
                active: 0,
                heavy_active: 0,
                waiters: VecDeque::new(),
                next_id: 0,
                drain: DrainRate::default(),
                ready_wakers: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
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
    /// slot, a free queue place, or a batch waiter an interactive arrival may evict.
    pub fn accepting(&self, waker: &std::task::Waker) -> bool {
        let mut st = self.lock();
        let ok = st.active < st.active_max()
            || st.waiters.len() < st.limits.queue_depth
            || st.waiters.iter().any(|w| w.class == Class::Batch);
        if !ok && !st.ready_wakers.iter().any(|w| w.will_wake(waker)) {
            st.ready_wakers.push(waker.clone());
        }
        ok
    }

    /// An arrival: a slot now, a queue place, or `overloaded`.
    pub fn arrive(self: &Arc<Self>, ticket: Ticket) -> Result<Arrival, GatewayError> {
        let mut st = self.lock();
        let heavy = ticket.prompt_tokens > st.limits.heavy_input_tokens;
        if st.can_run(ticket.class, heavy) {
            return Ok(Arrival::Granted(st.grant(self, heavy)));
        }
        if st.waiters.len() >= st.limits.queue_depth {
            let evict = match ticket.class {
                Class::Interactive => st.waiters.iter().rposition(|w| w.class == Class::Batch),
                Class::Batch => None,
            };
            match evict.and_then(|i| st.waiters.remove(i)) {
                Some(w) => {
                    let err = st.overloaded(Class::Batch);
                    let _ = w.tx.send(Err(err));
                }
                None => return Err(st.overloaded(ticket.class)),
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = st.next_id;
        st.next_id += 1;
        st.waiters.push_back(Waiter {
            id,
            class: ticket.class,
            heavy,
            tx,
        });
        Ok(Arrival::Queued {
            id,
            rx,
            deadline: Instant::now() + st.limits.queue_wait_max,
        })
    }

    /// Takes waiter `id` out of the queue (it timed out or its client went away); false when it
    /// was no longer there (granted or shed in the meantime: its receiver holds the answer).
    pub fn leave(&self, id: u64) -> bool {
        let mut st = self.lock();
        let before = st.waiters.len();
        st.waiters.retain(|w| w.id != id);
        let left = st.waiters.len() != before;
        if left {
            st.wake_ready();
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
        }
    }
}

impl State {
    /// The ceiling in force: the policy's, lowered by the upstream's capacity.
    fn active_max(&self) -> usize {
        self.capacity
            .map_or(self.limits.active_max, |c| c.min(self.limits.active_max))
    }

    fn can_run(&self, class: Class, heavy: bool) -> bool {
        let max = self.active_max();
        let slot = match class {
            Class::Interactive => self.active < max,
            Class::Batch if max == 1 => {
                self.active == 0 && !self.waiters.iter().any(|w| w.class == Class::Interactive)
            }
            Class::Batch => self.active + 1 < max,
        };
        slot && (!heavy || self.heavy_active < self.limits.heavy_active_max)
    }

    fn grant(&mut self, admission: &Arc<Admission>, heavy: bool) -> Permit {
        self.active += 1;
        self.heavy_active += usize::from(heavy);
        Permit {
            admission: Some(admission.clone()),
            heavy,
            granted_at: Instant::now(),
        }
    }

    fn release(&mut self, heavy: bool) {
        self.active -= 1;
        self.heavy_active -= usize::from(heavy);
        self.drain.record(Instant::now());
    }

    /// Grants slots to waiters until none can run: interactive first, then batch.
    fn dispatch(&mut self, admission: &Arc<Admission>) {
        for class in [Class::Interactive, Class::Batch] {
            let mut i = 0;
            while i < self.waiters.len() {
                let w = &self.waiters[i];
                if w.class != class || !self.can_run(w.class, w.heavy) {
                    i += 1;
                    continue;
                }
                let Some(w) = self.waiters.remove(i) else {
                    break;
                };
                let permit = self.grant(admission, w.heavy);
                if let Err(Ok(mut permit)) = w.tx.send(Ok(permit)) {
                    // The waiter is gone (its client left): undo the grant here, under the
                    // lock, instead of letting the permit's drop take the lock again.
                    permit.admission = None;
                    self.active -= 1;
                    self.heavy_active -= usize::from(permit.heavy);
                }
            }
        }
        self.wake_ready();
    }

    fn wake_ready(&mut self) {
        for w in self.ready_wakers.drain(..) {
            w.wake();
        }
    }

    /// `overloaded`, with a `Retry-After` from how fast the queue drains.
    fn overloaded(&self, class: Class) -> GatewayError {
        let ahead = self.waiters.len() + 1;
        let retry_after = self
            .drain
            .time_for(ahead, Instant::now())
            .unwrap_or(self.limits.queue_wait_max)
            .clamp(
                Duration::from_secs(1),
                self.limits.queue_wait_max.max(Duration::from_secs(1)),
            );
        GatewayError::Overloaded { class, retry_after }
    }
}
