//! Holds: room kept in every prediction for the requests told to come back.
//!
//! A `deadline_unmeetable` refusal tells its client when it would fit ([`super::line`]). Until
//! 2026-12-06 nothing kept that room: arrivals between the refusal and the return were judged
//! as if the refused request did not exist, took the room it had been told of, and below
//! capacity four in ten retries found their place gone (docs/capacity.md). Now each refusal
//! leaves a [`Hold`]: until it lapses, every prediction counts the request as a waiter that
//! joins at the time it was told, in the place in the grant order its refusal gave it (ahead of
//! the requests that arrived after it). A later arrival is then judged with that work ahead of
//! it, and refused or promised accordingly; the request that comes back takes its hold and its
//! place. A request takes a hold of the same tenant, class, prompt tokens and `max_tokens`, from
//! a second before the time told on; nobody else's hold can be taken. A hold nobody takes
//! lapses [`GRACE`] after its time, and there are at most as many holds as queue places (a
//! burst of refusals beyond that is told when to come back, without holds).

use std::time::Duration;

use tokio::time::Instant;

use super::queue::Ticket;

/// How long after its time a hold waits for its request.
pub const GRACE: Duration = Duration::from_secs(2);
/// How much before its time a request may take its hold (`Retry-After` is whole seconds).
const EARLY: Duration = Duration::from_secs(1);

/// A refused request expected back at `back`, in the grant order at `seq`.
#[derive(Debug)]
pub(super) struct Hold {
    pub seq: u64,
    pub ticket: Ticket,
    pub back: Instant,
}

impl Hold {
    /// Whether nobody took it in time: [`GRACE`] after its time has passed at `now`.
    fn lapsed(&self, now: Instant) -> bool {
        self.back + GRACE <= now
    }
}

/// The holds not yet taken, oldest first.
#[derive(Debug, Default)]
pub(super) struct Holds {
    list: Vec<Hold>,
}

impl Holds {
    /// Keeps `hold`, unless `most` are kept already.
    pub fn keep(&mut self, hold: Hold, most: usize, now: Instant) {
        self.lapse(now);
        if self.list.len() < most {
            self.list.push(hold);
        }
    }

    /// The place of the hold `ticket` comes back to, if one is due: taken, it is held no more.
    pub fn take(&mut self, ticket: &Ticket, now: Instant) -> Option<u64> {
        self.lapse(now);
        let i = self.list.iter().position(|h| {
            now + EARLY >= h.back
                && h.ticket.tenant == ticket.tenant
                && h.ticket.class == ticket.class
                && h.ticket.prompt_tokens == ticket.prompt_tokens
                && h.ticket.max_tokens == ticket.max_tokens
        })?;
        Some(self.list.remove(i).seq)
    }

    /// The holds in force at `now`.
    pub fn live(&self, now: Instant) -> impl Iterator<Item = &Hold> {
        self.list.iter().filter(move |h| !h.lapsed(now))
    }

    fn lapse(&mut self, now: Instant) {
        self.list.retain(|h| !h.lapsed(now));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::policy::Class;

    fn ticket(tenant: &str, prompt: usize) -> Ticket {
        Ticket {
            tenant: Arc::from(tenant),
            max_tokens: 100,
            ..Ticket::new(Class::Interactive, prompt)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_its_own_request_takes_a_hold_from_a_second_before_its_time_until_it_lapses() {
        let mut holds = Holds::default();
        let start = Instant::now();
        let back = start + Duration::from_secs(5);
        let hold = |seq, tenant| Hold {
            seq,
            ticket: ticket(tenant, 250),
            back,
        };
        holds.keep(hold(7, "a"), 2, start);
        holds.keep(hold(8, "b"), 2, start);
        // Full: a third is not kept.
        holds.keep(hold(9, "c"), 2, start);
        assert_eq!(holds.live(start).count(), 2);
        // Too early, and not the same request (tenant, class, prompt or max_tokens).
        let at = |s: f64| start + Duration::from_secs_f64(s);
        assert_eq!(holds.take(&ticket("a", 250), at(3.9)), None);
        assert_eq!(holds.take(&ticket("c", 250), at(4.5)), None);
        assert_eq!(holds.take(&ticket("a", 251), at(4.5)), None);
        let batch = Ticket {
            class: Class::Batch,
            ..ticket("a", 250)
        };
        assert_eq!(holds.take(&batch, at(4.5)), None);
        let longer = Ticket {
            max_tokens: 101,
            ..ticket("a", 250)
        };
        assert_eq!(holds.take(&longer, at(4.5)), None);
        // Its own, once; then it is held no more.
        assert_eq!(holds.take(&ticket("a", 250), at(4.5)), Some(7));
        assert_eq!(holds.take(&ticket("a", 250), at(4.5)), None);
        // The other lapses `GRACE` after its time.
        assert_eq!(
            holds.live(back + GRACE - Duration::from_millis(1)).count(),
            1
        );
        assert_eq!(holds.live(back + GRACE).count(), 0);
        assert_eq!(holds.take(&ticket("b", 250), back + GRACE), None);
    }
}
