//! The grant rule: whether a request may take a slot now. Admission's dispatch and the
//! prediction's simulation both ask it, so the queue the prediction plays forward is the queue
//! admission runs (see `docs/policy.md`, "Predictive admission").
//!
//! - at most `active_max` requests hold a slot; `batch` never takes the last free one (with
//!   `active_max = 1`, batch runs only while no interactive request waits);
//! - at most `heavy_active_max` heavy prompts (above `heavy_input_tokens`) are in prefill;
//! - at most `prefill_tokens_max` prompt tokens are admitted but not past their prefill (a
//!   longer prompt runs when nothing else prefills), counting, where the upstream prefills the
//!   least left first, only the prompts no longer than the asking one ([`prefill_ahead`]);
//! - while other tenants of its class are present, a tenant leaves each of them a slot and
//!   them all half the prefill budget.
//!
//! Among the waiters the rule admits, [`next_granted`] picks the one granted first:
//! interactive before batch, the least-served tenant first, then by arrival; a waiter that
//! yields (it would have pushed an admitted waiter past its deadline) waits until every
//! waiter up to the one it yields to is gone.

use crate::policy::PrefillOrder;

/// The admission limits in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    pub active_max: usize,
    pub prefill_tokens_max: usize,
    pub heavy_active_max: usize,
}

/// What the upstream holds and the queue shows, as the rule sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Slots held.
    pub active: usize,
    /// Heavy prompts not past their prefill.
    pub heavy_prefilling: usize,
    /// Prompt tokens not past their prefill that the asking request would wait behind
    /// ([`prefill_ahead`]).
    pub prefill_tokens: usize,
    /// Whether an interactive request waits.
    pub interactive_waiting: bool,
}

/// The asking tenant's part of what is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// Other tenants present in its class.
    pub others: usize,
    /// Slots its class's requests of this tenant hold.
    pub slots: usize,
    /// Their prompt tokens not past prefill.
    pub prefill_tokens: usize,
}

/// A request asking for a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub batch: bool,
    pub heavy: bool,
    pub prompt: usize,
}

impl Gate {
    /// Whether `ask` may take a slot now.
    pub fn admits(&self, held: &Held, share: &Share, ask: &Ask) -> bool {
        let max = self.active_max;
        let slot = match (ask.batch, max) {
            (false, _) => held.active < max,
            (true, 1) => held.active == 0 && !held.interactive_waiting,
            (true, _) => held.active + 1 < max,
        };
        let heavy = !ask.heavy || held.heavy_prefilling < self.heavy_active_max;
        if !(slot && heavy && self.fits_budget(held.prefill_tokens, ask.prompt)) {
            return false;
        }
        if share.others == 0 {
            return true;
        }
        let slots = share.slots < max.saturating_sub(share.others).max(1);
        let prefill = share.prefill_tokens == 0
            || share.prefill_tokens + ask.prompt <= self.prefill_tokens_max / 2;
        slots && prefill
    }

    /// Whether `prompt` more tokens fit beside `prefilling` (alone, any prompt does).
    pub fn fits_budget(&self, prefilling: usize, prompt: usize) -> bool {
        prefilling == 0 || prefilling + prompt <= self.prefill_tokens_max
    }
}

/// The prompt tokens in prefill (`prefilling`, one prompt's tokens each) that a prompt of
/// `prompt` tokens would wait behind in the upstream: all of them, or, where it prefills the
/// least left first, those of the prompts no longer than it. It goes ahead of the longer ones,
/// so they hold it back by nothing, and the budget need not hold it back for them: a 256-token
/// prompt beside an 8K prefill under a budget of 8,192 waited out the whole prefill (~25 s on 2
/// cores) for tokens it would never wait behind. A prompt as long as one prefilling still counts
/// it: two 8K prefills never run together under that budget.
pub fn prefill_ahead(
    order: PrefillOrder,
    prompt: usize,
    prefilling: impl IntoIterator<Item = usize>,
) -> usize {
    let passes = |p: usize| order == PrefillOrder::Shortest && p > prompt;
    prefilling.into_iter().filter(|&p| !passes(p)).sum()
}

/// A waiter's place in the grant order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Place {
    pub batch: bool,
    /// Its tenant's virtual token counter in its class.
    pub counter: f64,
    /// Arrival order (the waiter's id).
    pub seq: u64,
    /// Not granted while a waiter with a `seq` up to this one is queued.
    pub yields_to: Option<u64>,
}

impl Place {
    fn key(&self) -> (bool, f64, u64) {
        (self.batch, self.counter, self.seq)
    }
}

/// Whether `p` waits behind a waiter still among `places`.
fn yields(p: &Place, places: &[Place]) -> bool {
    p.yields_to
        .is_some_and(|to| places.iter().any(|q| q.seq <= to))
}

/// Whether an interactive waiter among `places` could be granted before batch (one that
/// yields to a batch waiter cannot: batch's last slot stays free for it otherwise).
pub fn interactive_waiting(places: &[Place]) -> bool {
    places.iter().any(|p| !p.batch && !yields(p, places))
}

/// The index of the waiter granted next among `places` (in any order), each with whether the
/// rule admits it now; `None` when none may run.
pub fn next_granted(places: &[(Place, bool)]) -> Option<usize> {
    let all: Vec<Place> = places.iter().map(|(p, _)| *p).collect();
    places
        .iter()
        .enumerate()
        .filter(|(_, (p, admitted))| *admitted && !yields(p, &all))
        .min_by(|(_, (a, _)), (_, (b, _))| {
            a.key()
                .partial_cmp(&b.key())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATE: Gate = Gate {
        active_max: 4,
        prefill_tokens_max: 8192,
        heavy_active_max: 1,
    };

    fn ask(batch: bool, prompt: usize) -> Ask {
        Ask {
            batch,
            heavy: prompt > 4096,
            prompt,
        }
    }

    #[test]
    fn each_limit_holds_alone() {
        let alone = Share::default();
        let three = Held {
            active: 3,
            ..Held::default()
        };
        // The last slot is interactive's.
        assert!(GATE.admits(&three, &alone, &ask(false, 100)));
        assert!(!GATE.admits(&three, &alone, &ask(true, 100)));
        // One heavy prefill at a time; the budget holds a long prompt behind others.
        let heavy = Held {
            active: 1,
            heavy_prefilling: 1,
            prefill_tokens: 5000,
            ..Held::default()
        };
        assert!(!GATE.admits(&heavy, &alone, &ask(false, 5000)));
        assert!(GATE.admits(&heavy, &alone, &ask(false, 3000)));
        assert!(!GATE.admits(&heavy, &alone, &ask(false, 3500)));
        // Alone, any prompt runs.
        assert!(GATE.admits(&Held::default(), &alone, &ask(false, 20_000)));
        // With other tenants present: a slot left to each (at least one for the asker), and half
        // the budget left to them all.
        for (others, share) in [(1, 3), (2, 2), (3, 1), (7, 1)] {
            for slots in 0..4 {
                let mine = Share {
                    others,
                    slots,
                    prefill_tokens: 0,
                };
                let admitted = GATE.admits(&Held::default(), &mine, &ask(false, 100));
                assert_eq!(
                    admitted,
                    slots < share,
                    "{others} others, {slots} slots held"
                );
            }
        }
        let held = Held {
            active: 1,
            prefill_tokens: 3000,
            ..Held::default()
        };
        let half = Share {
            others: 1,
            slots: 1,
            prefill_tokens: 3000,
        };
        assert!(!GATE.admits(&held, &half, &ask(false, 2000)));
        assert!(GATE.admits(&held, &half, &ask(false, 1000)));
    }

    #[test]
    fn the_budget_counts_only_the_prefills_a_prompt_waits_behind() {
        let prefilling = [8000, 300];
        // Oldest first: everything in prefill is ahead.
        assert_eq!(prefill_ahead(PrefillOrder::Oldest, 256, prefilling), 8300);
        // Least left first: a 256-token prompt passes both; a 1K one waits for the 300 only; an
        // 8K one for both (as long as the 8K one: it does not pass it).
        assert_eq!(prefill_ahead(PrefillOrder::Shortest, 256, prefilling), 0);
        assert_eq!(prefill_ahead(PrefillOrder::Shortest, 1000, prefilling), 300);
        assert_eq!(
            prefill_ahead(PrefillOrder::Shortest, 8000, prefilling),
            8300
        );
        let ahead = |prompt| Held {
            active: 2,
            prefill_tokens: prefill_ahead(PrefillOrder::Shortest, prompt, prefilling),
            ..Held::default()
        };
        assert!(GATE.admits(&ahead(256), &Share::default(), &ask(false, 256)));
        assert!(!GATE.admits(&ahead(8000), &Share::default(), &ask(false, 8000)));
    }

    #[test]
    fn interactive_then_least_served_then_first_come_and_a_yielder_waits() {
        let place = |batch, counter, seq, yields_to| Place {
            batch,
            counter,
            seq,
            yields_to,
        };
        let q = [
            (place(true, 0.0, 1, None), true),
            (place(false, 500.0, 2, None), true),
            (place(false, 100.0, 3, None), true),
            (place(false, 100.0, 4, Some(1)), true),
        ];
        assert_eq!(next_granted(&q), Some(2));
        // Not admitted: the next in order.
        let mut held_back = q;
        held_back[2].1 = false;
        assert_eq!(next_granted(&held_back), Some(1));
        // Seq 4 yields to seq 1 (batch): not before it, however it ranks.
        let q = [q[0], q[3]];
        assert_eq!(next_granted(&q), Some(0));
        assert_eq!(next_granted(&q[1..]), Some(0));
    }
}
