//! The prediction: the upstream played forward under the cost model until every waiter's first
//! token.
//!
//! The running requests prefill one after another (in the upstream's order, [`PrefillOrder`]:
//! the oldest first, or the least left first, so that a shorter prompt granted later goes ahead
//! of a longer one's rest), the ones past theirs decoding beside each prefill at the gap the
//! streams showed there ([`CostModel::decode_beside_prefill`]; unseen, they wait it out), then
//! decode together, one
//! token each per step, until one finishes and frees its slot; waiters are granted in the
//! order admission grants them, under the same rule ([`super::gate`]): one function answers
//! both an arrival and a waiter's re-check, so the two agree unless the upstream turns out
//! slower than the model. Time jumps from event to event, so a prediction costs a few dozen
//! steps however long the outputs are. A waiter may join later than now (a request told to come
//! back, [`Pending::ready`]): it is granted nothing before then, and its arrival is an event.

use super::gate::{
    interactive_waiting, next_granted, prefill_ahead, Ask, Gate, Held, Place, Share,
};
use super::model::{Beside, CostModel};
use super::preempt::Preemption;
use crate::policy::PrefillOrder;

/// A request holding a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Running {
    pub prompt: usize,
    /// Seconds of prefill left; 0 once its first token came.
    pub prefill_left: f64,
    /// Tokens it is still expected to generate.
    pub output_left: f64,
    /// Its tenant in its class, an index into [`Scene::groups`].
    pub group: usize,
    pub heavy: bool,
}

/// A request waiting for a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pending {
    pub prompt: usize,
    /// Tokens it is expected to generate.
    pub output: f64,
    pub group: usize,
    pub batch: bool,
    pub heavy: bool,
    /// Arrival order, and the waiter it yields to ([`Place`]).
    pub seq: u64,
    pub yields_to: Option<u64>,
    /// Seconds from now until it is there to be granted (0: it waits now).
    pub ready: f64,
}

/// A tenant in a class: its virtual token counter and the other tenants present beside it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Group {
    pub counter: f64,
    pub others: usize,
}

/// What the prediction starts from: the limits, the running requests (in grant order), the
/// waiters (in any order) and the tenants' counters.
#[derive(Clone, Debug, PartialEq)]
pub struct Scene {
    pub gate: Gate,
    /// The order the upstream prefills its running prompts in.
    pub prefill_order: PrefillOrder,
    /// What an output token adds to its tenant's counter.
    pub output_weight: f64,
    pub groups: Vec<Group>,
    pub running: Vec<Running>,
    pub queue: Vec<Pending>,
    /// The share of a prefill expected beside other requests' decodes
    /// ([`crate::predict::Beside::decoding`]; admission's `State::decoding_share`).
    pub decoding: f64,
    /// What shorter prompts still to arrive take from each prefill ([`Preemption::NONE`] where
    /// the upstream prefills the oldest first): a waiter's prefill is played at its stretch.
    pub preemption: Preemption,
}

/// The least prefill a running request can have left and still count as prefilling (0 counts
/// as past it).
pub const PREFILL_LEFT_MIN: f64 = 1e-6;

/// Output left below this counts as none: a request decoding beside a prefill ends when the
/// simulation says it does, not a rounding error later.
const OUTPUT_LEFT_MIN: f64 = 1e-9;

/// The steps of a prediction are bounded (a queue of a few dozen waiters needs one per grant,
/// prefill and completion).
const STEPS_MAX: usize = 10_000;

/// A running request in the simulation, and which waiter it was (if one).
#[derive(Clone, Copy)]
struct Slot {
    r: Running,
    waiter: Option<usize>,
}

/// Seconds from now until each of `scene.queue`'s first token, in the queue's order.
pub fn first_tokens(model: &CostModel, scene: &Scene) -> Vec<f64> {
    let mut counters: Vec<f64> = scene.groups.iter().map(|g| g.counter).collect();
    let mut run: Vec<Slot> = scene
        .running
        .iter()
        .map(|r| Slot {
            r: *r,
            waiter: None,
        })
        .collect();
    let mut queue: Vec<(Pending, usize)> = scene.queue.iter().copied().zip(0..).collect();
    let mut out = vec![f64::NAN; queue.len()];
    let mut left = queue.len();
    let mut t = 0.0;
    for _ in 0..STEPS_MAX {
        // Grants, as admission's dispatch makes them, while one may run.
        while let Some(i) = next(scene, &counters, &run, &queue, t) {
            let (p, k) = queue.remove(i);
            grant(model, scene, &mut run, &mut counters, p, k);
        }
        if left == 0 {
            break;
        }
        // The prefill the upstream's order picks runs next, until its first token (its first
        // output token) or until a request decoding beside it ends, whichever comes first.
        if let Some(i) = prefill_next(scene.prefill_order, run.iter().map(|s| s.r.prefill_left)) {
            let gap = model.decode_beside_prefill();
            let ends = gap.map_or(f64::INFINITY, |g| g * fewest_left_decoding(&run));
            let dt = run[i].r.prefill_left.min(ends);
            t += dt;
            if let Some(g) = gap {
                decode_beside(&mut run, &mut counters, scene.output_weight, dt / g);
            }
            if dt < run[i].r.prefill_left {
                run[i].r.prefill_left -= dt;
            } else {
                run[i].r.prefill_left = 0.0;
                if let Some(k) = run[i].waiter {
                    out[k] = t;
                    left -= 1;
                }
                run[i].r.output_left -= 1.0;
                counters[run[i].r.group] += scene.output_weight;
            }
            run.retain(|s| s.r.output_left > OUTPUT_LEFT_MIN);
            continue;
        }
        // The next waiter to join later, if one.
        let joins = queue
            .iter()
            .map(|(p, _)| p.ready)
            .filter(|&r| r > t)
            .fold(f64::INFINITY, f64::min);
        if run.is_empty() {
            let there = joined(&queue, t);
            if there.is_empty() {
                // Nobody runs or waits yet: on to the next to join.
                t = joins;
                continue;
            }
            // Nothing runs, yet no waiter may: the first in order runs alone.
            let places: Vec<(Place, bool)> = there
                .iter()
                .map(|&i| (place(&queue[i].0, &counters), true))
                .collect();
            let Some(i) = next_granted(&places) else {
                break;
            };
            let (p, k) = queue.remove(there[i]);
            grant(model, scene, &mut run, &mut counters, p, k);
            continue;
        }
        // Everyone decodes until the next one finishes, or the next waiter joins.
        let step = model.decode_step(run.len(), context_of(&run));
        let mut steps = run
            .iter()
            .map(|s| s.r.output_left)
            .fold(f64::INFINITY, f64::min)
            .max(0.0)
            .ceil();
        if joins.is_finite() && step > 0.0 {
            steps = steps.min(((joins - t) / step).ceil().max(1.0));
        }
        t += steps * step;
        for s in &mut run {
            s.r.output_left -= steps;
            s.r.prompt += steps as usize;
            counters[s.r.group] += scene.output_weight * steps;
        }
        run.retain(|s| s.r.output_left > OUTPUT_LEFT_MIN);
    }
    out.into_iter()
        .map(|v| if v.is_nan() { t } else { v })
        .collect()
}

/// Which of the requests holding slots, in grant order with `left` seconds of prefill each (0:
/// past it), prefills next under `order`: the oldest with any left, or the one with the least
/// (the oldest among equals). The simulation's rule, and the admission state's for the prefill
/// under way, so that the two agree.
pub fn prefill_next(order: PrefillOrder, left: impl IntoIterator<Item = f64>) -> Option<usize> {
    let mut prefilling = left.into_iter().enumerate().filter(|&(_, l)| l > 0.0);
    match order {
        PrefillOrder::Oldest => prefilling.next(),
        // `min_by` keeps the first of equal elements: the oldest.
        PrefillOrder::Shortest => prefilling.min_by(|(_, a), (_, b)| a.total_cmp(b)),
    }
    .map(|(i, _)| i)
}

fn place(p: &Pending, counters: &[f64]) -> Place {
    Place {
        batch: p.batch,
        counter: counters[p.group],
        seq: p.seq,
        yields_to: p.yields_to,
    }
}

/// The indices of the waiters in `queue` that have joined by `t`: who has not is not in the
/// grant order yet (nor does it hold anyone back).
fn joined(queue: &[(Pending, usize)], t: f64) -> Vec<usize> {
    (0..queue.len())
        .filter(|&i| queue[i].0.ready <= t)
        .collect()
}

/// The waiter granted next (an index into `queue`), under the rule admission's dispatch follows.
fn next(
    scene: &Scene,
    counters: &[f64],
    run: &[Slot],
    queue: &[(Pending, usize)],
    t: f64,
) -> Option<usize> {
    let (gate, groups) = (&scene.gate, &scene.groups);
    let prefilling = run.iter().filter(|s| s.r.prefill_left > 0.0);
    let there = joined(queue, t);
    let order: Vec<Place> = there
        .iter()
        .map(|&i| place(&queue[i].0, counters))
        .collect();
    let (active, interactive_waiting) = (run.len(), interactive_waiting(&order));
    let heavy_prefilling = prefilling.clone().filter(|s| s.r.heavy).count();
    let places: Vec<(Place, bool)> = there
        .iter()
        .map(|&i| &queue[i].0)
        .zip(order)
        .map(|(p, place)| {
            let mine = run.iter().filter(|s| s.r.group == p.group);
            let share = Share {
                others: groups[p.group].others,
                slots: mine.clone().count(),
                prefill_tokens: mine
                    .filter(|s| s.r.prefill_left > 0.0)
                    .map(|s| s.r.prompt)
                    .sum(),
            };
            let ask = Ask {
                batch: p.batch,
                heavy: p.heavy,
                prompt: p.prompt,
            };
            let prompts = prefilling.clone().map(|s| s.r.prompt);
            let held = Held {
                active,
                heavy_prefilling,
                prefill_tokens: prefill_ahead(scene.prefill_order, p.prompt, prompts),
                interactive_waiting,
            };
            (place, gate.admits(&held, &share, &ask))
        })
        .collect();
    next_granted(&places).map(|i| there[i])
}

fn grant(
    model: &CostModel,
    scene: &Scene,
    run: &mut Vec<Slot>,
    counters: &mut [f64],
    p: Pending,
    waiter: usize,
) {
    counters[p.group] += p.prompt as f64;
    let beside = Beside {
        context: context_of(run),
        decoding: scene.decoding,
    };
    let own = model.prefill(p.prompt, beside);
    let prefill_left = (own * scene.preemption.stretch(p.prompt)).max(PREFILL_LEFT_MIN);
    run.push(Slot {
        r: Running {
            prompt: p.prompt,
            prefill_left,
            output_left: p.output.max(1.0),
            group: p.group,
            heavy: p.heavy,
        },
        waiter: Some(waiter),
    });
}

/// The fewest tokens any request past its prefill has left (infinite: none is).
fn fewest_left_decoding(run: &[Slot]) -> f64 {
    run.iter()
        .filter(|s| s.r.prefill_left <= 0.0)
        .map(|s| s.r.output_left)
        .fold(f64::INFINITY, f64::min)
}

/// `tokens` decode steps (a fraction of one counts) for every request past its prefill, beside
/// a prefill.
fn decode_beside(run: &mut [Slot], counters: &mut [f64], output_weight: f64, tokens: f64) {
    for s in run.iter_mut().filter(|s| s.r.prefill_left <= 0.0) {
        s.r.output_left -= tokens;
        counters[s.r.group] += output_weight * tokens;
    }
}

fn context_of(run: &[Slot]) -> usize {
    run.iter().map(|s| s.r.prompt).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Cost;

    /// Prefill 1 s per 1K tokens; decode 10 ms per step.
    fn model() -> CostModel {
        CostModel::new(&model_cost())
    }

    fn model_cost() -> Cost {
        Cost {
            prefill_base_ms: 0.0,
            prefill_ms_per_1k: 1000.0,
            prefill_ms_per_1k_squared: 0.0,
            prefill_ms_per_1k_per_10k_running: 0.0,
            prefill_ms_per_1k_beside_decodes: 0.0,
            prefill_ms_per_1k_squared_beside_decodes: 0.0,
            decode_base_ms: 10.0,
            decode_ms_per_seq: 0.0,
            decode_ms_per_10k_context: 0.0,
            refit: false,
        }
    }

    const GATE: Gate = Gate {
        active_max: 2,
        prefill_tokens_max: 8192,
        heavy_active_max: 1,
    };

    fn running(prompt: usize, prefill_left: f64, output_left: f64) -> Running {
        Running {
            prompt,
            prefill_left,
            output_left,
            group: 0,
            heavy: false,
        }
    }

    fn pending(seq: u64, prompt: usize, output: f64) -> Pending {
        Pending {
            prompt,
            output,
            group: 0,
            batch: false,
            heavy: prompt > 4096,
            seq,
            yields_to: None,
            ready: 0.0,
        }
    }

    fn scene(gate: Gate, running: &[Running], queue: &[Pending]) -> Scene {
        Scene {
            gate,
            prefill_order: PrefillOrder::Oldest,
            output_weight: 1.0,
            groups: vec![Group::default(); 2],
            running: running.to_vec(),
            queue: queue.to_vec(),
            decoding: 0.0,
            preemption: Preemption::NONE,
        }
    }

    /// The last waiter's time to first token.
    fn last(gate: Gate, running: &[Running], queue: &[Pending]) -> f64 {
        *first_tokens(&model(), &scene(gate, running, queue))
            .last()
            .expect("a waiter")
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn an_idle_upstream_costs_only_the_prefill() {
        assert!(close(last(GATE, &[], &[pending(0, 500, 100.0)]), 0.5));
    }

    #[test]
    fn prefills_ahead_come_first_and_a_full_upstream_waits_for_a_finish() {
        let me = pending(9, 1000, 10.0);
        // One running, 2 s of prefill left: it goes first.
        let busy = [running(2000, 2.0, 50.0)];
        assert!(close(last(GATE, &busy, &[me]), 3.0));
        // Both slots decoding, 30 and 80 tokens left: the first frees in 0.3 s.
        let full = [running(100, 0.0, 30.0), running(100, 0.0, 80.0)];
        assert!(close(last(GATE, &full, &[me]), 1.3));
        // A waiter ahead (0.2 s prefill, 10 tokens) takes that slot; the next frees when the
        // waiter ends: 0.3 + 0.2 + 9 steps = 0.3 + 0.2 + 0.09, then my 1 s. Every waiter's
        // time comes out of the one run, in the queue's order.
        let both = first_tokens(&model(), &scene(GATE, &full, &[me, pending(1, 200, 10.0)]));
        assert!(close(both[1], 0.5), "{both:?}");
        assert!(close(both[0], 0.3 + 0.2 + 0.09 + 1.0), "{both:?}");
    }

    #[test]
    fn a_waiter_that_joins_later_is_granted_from_then_on() {
        let later = |ready| Pending {
            ready,
            ..pending(0, 500, 10.0)
        };
        // An idle upstream: its 0.5 s prefill starts when it joins at 2 s.
        assert!(close(last(GATE, &[], &[later(2.0)]), 2.5));
        // A slot free beside a 1 s decode: it is granted when it joins (the decode step that
        // is under way at 0.305 s ends at 0.31 s), not when the decode ends.
        let decoding = [running(100, 0.0, 100.0)];
        assert!(close(last(GATE, &decoding, &[later(0.305)]), 0.81));
        // Both slots decoding, one free at 0.3 s. A waiter that joins at 0.1 s with the
        // earlier place takes it (0.3 + 0.5 s); the one there now waits for the next finish
        // (0.8 + 9 steps) and its 0.2 s prefill. Joining at 0.4 s, it comes too late.
        let full = [running(100, 0.0, 30.0), running(100, 0.0, 80.0)];
        let t = |ready| {
            first_tokens(
                &model(),
                &scene(GATE, &full, &[later(ready), pending(1, 200, 10.0)]),
            )
        };
        let early = t(0.1);
        assert!(close(early[0], 0.8) && close(early[1], 1.09), "{early:?}");
        let late = t(0.4);
        assert!(close(late[1], 0.5), "{late:?}");
    }

    #[test]
    fn with_the_least_left_first_a_short_prefill_goes_ahead_of_a_long_one_under_way() {
        let me = pending(9, 250, 10.0);
        let long = [running(4000, 3.0, 50.0)];
        let at = |order| {
            let s = Scene {
                prefill_order: order,
                ..scene(GATE, &long, &[me, pending(10, 3500, 10.0)])
            };
            first_tokens(&model(), &s)
        };
        // Oldest first: behind the 3 s left, then the 3.5 s one behind both (1 slot left of 2:
        // it waits for the first to end its decode).
        let oldest = at(PrefillOrder::Oldest);
        assert!(close(oldest[0], 3.25), "{oldest:?}");
        // Least left first: the short one at once; the long one's 3 s go before the 3.5 s.
        let shortest = at(PrefillOrder::Shortest);
        assert!(close(shortest[0], 0.25), "{shortest:?}");
        assert!(shortest[1] > 3.25 + 3.5 - 1e-9, "{shortest:?}");
    }

    #[test]
    fn a_waiter_s_prefill_is_stretched_by_the_shorter_prompts_still_to_come() {
        // Shorter prompts took a fifth of the upstream over the last minute: a 4K prompt's 4 s
        // of prefill take 5 s, and a 100-token one (nothing shorter came) keeps its 0.1 s.
        let fifth = Preemption::new([(100, 12.0)], 60.0);
        let t = |queue: &[Pending]| {
            let s = Scene {
                preemption: fifth.clone(),
                ..scene(GATE, &[], queue)
            };
            first_tokens(&model(), &s)
        };
        assert!(close(t(&[pending(0, 4000, 10.0)])[0], 5.0));
        assert!(close(t(&[pending(0, 100, 10.0)])[0], 0.1));
    }

    #[test]
    fn requests_decode_beside_a_prefill_at_the_gap_the_streams_showed() {
        // Both slots held: a 4K prompt with 4 s of prefill left, a request with 20 tokens to go.
        let full = [running(4000, 4.0, 10.0), running(100, 0.0, 20.0)];
        let me = pending(9, 500, 10.0);
        let at = |m: &CostModel, order| {
            let s = Scene {
                prefill_order: order,
                ..scene(GATE, &full, &[me])
            };
            first_tokens(m, &s)[0]
        };
        // Unseen: the decode waits out the prefill, and the first slot frees when the 4K
        // prompt's 9 more tokens are done (4 + 0.09 s); then my 0.5 s.
        assert!(close(at(&model(), PrefillOrder::Oldest), 4.59));
        // A token every 0.1 s beside a prefill: the 20 tokens end at 2 s, halfway through it.
        let mut m = CostModel::new(&Cost {
            refit: true,
            ..model_cost()
        });
        m.observe_decode_beside_prefill(0.1);
        // Oldest first, my prefill still follows the 4K one's; least left first, it goes
        // ahead of that one's last 2 s.
        assert!(close(at(&m, PrefillOrder::Oldest), 4.5));
        assert!(close(at(&m, PrefillOrder::Shortest), 2.5));
    }

    #[test]
    fn the_prefill_budget_holds_a_long_prompt_behind_the_ones_prefilling() {
        let gate = Gate {
            active_max: 4,
            prefill_tokens_max: 4096,
            heavy_active_max: 1,
        };
        let prefilling = [running(3000, 3.0, 5.0)];
        // 3000 + 2000 > 4096: admitted only once the first is past its prefill; serial
        // prefill makes that the same 5 s here, and a prompt larger than the budget runs alone.
        assert!(close(
            last(gate, &prefilling, &[pending(0, 2000, 5.0)]),
            5.0
        ));
        assert!(close(last(gate, &[], &[pending(0, 6000, 5.0)]), 6.0));
    }

    #[test]
    fn a_waiter_the_budget_holds_back_is_passed_as_dispatch_passes_it() {
        // 1000 tokens prefilling; an 8000-token prompt waits for the budget, and a short one
        // behind it goes first, as admission grants it.
        let prefilling = [running(1000, 1.0, 5.0)];
        let t = first_tokens(
            &model(),
            &scene(
                GATE,
                &prefilling,
                &[pending(0, 8000, 5.0), pending(1, 100, 5.0)],
            ),
        );
        assert!(close(t[1], 1.1), "{t:?}");
        // The long one: its slot frees at 1.1 + 4 steps; the short ends its decode 0.04 s later,
        // then 8 s of its own prefill.
        assert!(close(t[0], 1.1 + 0.04 + 8.0), "{t:?}");
    }

    #[test]
    fn interactive_goes_before_batch_and_a_yielder_waits_its_turn() {
        let full = [running(100, 0.0, 10.0), running(100, 0.0, 20.0)];
        let mut batch = pending(0, 100, 10.0);
        batch.batch = true;
        let interactive = pending(1, 100, 10.0);
        // Batch never takes the last slot: it waits for both to end, after the interactive one.
        let t = first_tokens(&model(), &scene(GATE, &full, &[batch, interactive]));
        assert!(close(t[1], 0.1 + 0.1), "{t:?}");
        assert!(t[0] > t[1], "{t:?}");
        // Yielding to the batch waiter, the interactive one goes after it.
        let mut yielder = interactive;
        yielder.yields_to = Some(0);
        let y = first_tokens(&model(), &scene(GATE, &full, &[batch, yielder]));
        assert!(y[1] > y[0], "{y:?}");
    }
}
