//! The prediction: the upstream played forward under the cost model until a request's first
//! token.
//!
//! The running requests prefill one after another (oldest first), then decode together, one
//! token each per step, until one finishes and frees its slot; waiters are admitted in the
//! order admission would grant them, under the same two limits (`active_max` and the prefill
//! tokens in flight). Time jumps from event to event, so a prediction costs a few dozen steps
//! however long the outputs are.

use std::collections::VecDeque;

use super::model::CostModel;

/// A request holding a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Running {
    pub prompt: usize,
    /// Seconds of prefill left; 0 once its first token came.
    pub prefill_left: f64,
    /// Tokens it is still expected to generate.
    pub output_left: f64,
}

/// A request not yet holding a slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pending {
    pub prompt: usize,
    /// Tokens it is expected to generate.
    pub output: f64,
}

/// The admission limits the simulated queue is granted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    pub active_max: usize,
    pub prefill_tokens_max: usize,
}

/// When events happen: the steps of a prediction are bounded (a queue of a few dozen waiters
/// needs one per grant, prefill and completion).
const STEPS_MAX: usize = 10_000;

/// Seconds from now until `me`'s first token, when `ahead` are granted before it.
pub fn time_to_first_token(
    model: &CostModel,
    gate: Gate,
    running: &[Running],
    ahead: &[Pending],
    me: Pending,
) -> f64 {
    let mut run: Vec<(Running, bool)> = running.iter().map(|r| (*r, false)).collect();
    let mut queue: VecDeque<(Pending, bool)> = ahead.iter().map(|p| (*p, false)).collect();
    queue.push_back((me, true));
    let mut t = 0.0;
    for _ in 0..STEPS_MAX {
        // Grants, in order, while the front fits.
        while let Some(&(front, is_me)) = queue.front() {
            let prefilling: usize = run
                .iter()
                .filter(|(r, _)| r.prefill_left > 0.0)
                .map(|(r, _)| r.prompt)
                .sum();
            let slot = run.len() < gate.active_max.max(1);
            let budget = prefilling == 0 || prefilling + front.prompt <= gate.prefill_tokens_max;
            if !(slot && budget) {
                break;
            }
            queue.pop_front();
            let context = context_of(&run);
            let prefill_left = model.prefill(front.prompt, context).max(1e-6);
            run.push((
                Running {
                    prompt: front.prompt,
                    prefill_left,
                    output_left: front.output.max(1.0),
                },
                is_me,
            ));
        }
        // The oldest prefill runs next.
        if let Some(i) = run.iter().position(|(r, _)| r.prefill_left > 0.0) {
            t += run[i].0.prefill_left;
            run[i].0.prefill_left = 0.0;
            if run[i].1 {
                return t;
            }
            // Its first token is its first output token.
            run[i].0.output_left -= 1.0;
            run.retain(|(r, _)| r.output_left > 0.0);
            continue;
        }
        if run.is_empty() {
            // Nothing runs yet the front does not fit: it would run alone.
            let Some((front, is_me)) = queue.pop_front() else {
                return t;
            };
            run.push((
                Running {
                    prompt: front.prompt,
                    prefill_left: model.prefill(front.prompt, 0).max(1e-6),
                    output_left: front.output.max(1.0),
                },
                is_me,
            ));
            continue;
        }
        // Everyone decodes until the next one finishes.
        let steps = run
            .iter()
            .map(|(r, _)| r.output_left)
            .fold(f64::INFINITY, f64::min)
            .max(0.0)
            .ceil();
        t += steps * model.decode_step(run.len(), context_of(&run));
        for (r, _) in &mut run {
            r.output_left -= steps;
            r.prompt += steps as usize;
        }
        run.retain(|(r, _)| r.output_left > 0.0);
    }
    t
}

fn context_of(run: &[(Running, bool)]) -> usize {
    run.iter().map(|(r, _)| r.prompt).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Cost;

    /// Prefill 1 s per 1K tokens; decode 10 ms per step.
    fn model() -> CostModel {
        CostModel::new(&Cost {
            prefill_base_ms: 0.0,
            prefill_ms_per_1k: 1000.0,
            prefill_ms_per_1k_squared: 0.0,
            prefill_ms_per_1k_per_10k_running: 0.0,
            decode_base_ms: 10.0,
            decode_ms_per_seq: 0.0,
            decode_ms_per_10k_context: 0.0,
            refit: false,
        })
    }

    const GATE: Gate = Gate {
        active_max: 2,
        prefill_tokens_max: 8192,
    };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn an_idle_upstream_costs_only_the_prefill() {
        let m = model();
        let me = Pending {
            prompt: 500,
            output: 100.0,
        };
        assert!(close(time_to_first_token(&m, GATE, &[], &[], me), 0.5));
    }

    #[test]
    fn prefills_ahead_come_first_and_a_full_upstream_waits_for_a_finish() {
        let m = model();
        let me = Pending {
            prompt: 1000,
            output: 10.0,
        };
        // One running, 2 s of prefill left: it goes first.
        let busy = [Running {
            prompt: 2000,
            prefill_left: 2.0,
            output_left: 50.0,
        }];
        assert!(close(time_to_first_token(&m, GATE, &busy, &[], me), 3.0));
        // Both slots decoding, 30 and 80 tokens left: the first frees in 0.3 s.
        let full = [
            Running {
                prompt: 100,
                prefill_left: 0.0,
                output_left: 30.0,
            },
            Running {
                prompt: 100,
                prefill_left: 0.0,
                output_left: 80.0,
            },
        ];
        assert!(close(time_to_first_token(&m, GATE, &full, &[], me), 1.3));
        // A waiter ahead (0.2 s prefill, 10 tokens) takes that slot; the next frees when the
        // waiter ends: 0.3 + 0.2 + 9 steps... = 0.3 + 0.2 + 0.09, then my 1 s.
        let ahead = [Pending {
            prompt: 200,
            output: 10.0,
        }];
        let t = time_to_first_token(&m, GATE, &full, &ahead, me);
        assert!(close(t, 0.3 + 0.2 + 0.09 + 1.0), "{t}");
    }

    #[test]
    fn the_prefill_budget_holds_a_long_prompt_behind_the_ones_prefilling() {
        let m = model();
        let gate = Gate {
            active_max: 4,
            prefill_tokens_max: 4096,
        };
        let prefilling = [Running {
            prompt: 3000,
            prefill_left: 3.0,
            output_left: 5.0,
        }];
        let me = Pending {
            prompt: 2000,
            output: 5.0,
        };
        // 3000 + 2000 > 4096: admitted only once the first is past its prefill; serial
        // prefill makes that the same 5 s here, and a prompt larger than the budget runs alone.
        assert!(close(
            time_to_first_token(&m, gate, &prefilling, &[], me),
            5.0
        ));
        let huge = Pending {
            prompt: 6000,
            output: 5.0,
        };
        assert!(close(time_to_first_token(&m, gate, &[], &[], huge), 6.0));
    }
}
