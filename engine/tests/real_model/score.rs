//! The forward pass against llama.cpp by teacher forcing (see shared/golden/README.md).

use sluice_engine::backend::cpu::kernels::SimdLevel;
use sluice_engine::generate::score;
use sluice_engine::kv::{SeqRows, BLOCK_SIZE};

use crate::common::{golden, ids, shared};

#[test]
fn teacher_forced_argmax_matches_llama_cpp() {
    let s = shared();
    let (mut hits, mut total) = (0, 0);
    let mut worst = (1.0f64, String::new());
    for rec in golden("greedy.jsonl") {
        let prompt = ids(&rec["prompt_tokens"]);
        let gen = ids(&rec["greedy_tokens"]);
        let all: Vec<u32> = prompt.iter().chain(&gen).copied().collect();
        let scores = score(&s.llama, &all).expect("score");
        let mut rec_hits = 0;
        for (k, &want) in gen.iter().enumerate() {
            if scores.positions[prompt.len() - 1 + k].argmax == want {
                rec_hits += 1;
            }
        }
        let frac = rec_hits as f64 / gen.len() as f64;
        eprintln!(
            "{:>5.1}% of {:>2} golden tokens: {:?}",
            frac * 100.0,
            gen.len(),
            rec["prompt"].as_str().unwrap_or("")
        );
        if frac < worst.0 {
            worst = (frac, rec["prompt"].to_string());
        }
        hits += rec_hits;
        total += gen.len();
    }
    let overall = hits as f64 / total as f64;
    eprintln!(
        "overall {:.1}% of {total}; worst record {:.1}% ({})",
        overall * 100.0,
        worst.0 * 100.0,
        worst.1
    );
    assert!(
        overall >= 0.95,
        "argmax matches llama.cpp at {:.1}% of positions (need 95%)",
        overall * 100.0
    );
    assert!(
        worst.0 >= 0.85,
        "record {} matches at {:.1}% (need 85%)",
        worst.1,
        worst.0 * 100.0
    );
}

#[test]
fn first_step_logits_match_llama_cpp() {
    let s = shared();
    let vocab = s.llama.config().vocab_size;
    let mut max_err = 0.0f32;
    for rec in golden("greedy.jsonl") {
        let prompt = ids(&rec["prompt_tokens"]);
        let top5: Vec<(u32, f32)> = rec["first_step_top5"]
            .as_array()
            .expect("top5")
            .iter()
            .map(|p| {
                (
                    p[0].as_u64().expect("id") as u32,
                    p[1].as_f64().expect("logit") as f32,
                )
            })
            .collect();
        let blocks: Vec<u32> = (0..prompt.len().div_ceil(BLOCK_SIZE) as u32).collect();
        let mut st = s.llama.new_state(blocks.len()).expect("state");
        let seq = SeqRows {
            start: 0,
            len: prompt.len(),
            pos: 0,
            blocks: &blocks,
        };
        let logits = s
            .llama
            .forward(&mut st, &prompt, &[seq], &[prompt.len() - 1])
            .expect("forward");
        assert_eq!(logits.len(), vocab);
        for &(id, want) in &top5 {
            let err = (logits[id as usize] - want).abs();
            max_err = max_err.max(err);
            assert!(
                err <= 1.0,
                "{:?}: logit of {id} is {} vs llama.cpp {want}",
                rec["prompt"],
                logits[id as usize]
            );
        }
        if top5[0].1 - top5[1].1 >= 0.5 {
            let ours = sluice_engine::generate::argmax(&logits);
            assert_eq!(
                ours,
                top5[0].0,
                "{:?}: top-1 differs where llama.cpp leads by {}",
                rec["prompt"],
                top5[0].1 - top5[1].1
            );
        }
    }
    eprintln!("largest first-step logit difference from llama.cpp: {max_err:.3}");
}

/// Runs `tests` of this test binary, one at a time, in a process whose kernels `SLUICE_SIMD`
/// caps at `level` (the level is read once per process).
fn run_at(level: SimdLevel, tests: &[&str]) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().expect("test binary"))
        .arg("--exact")
        .args(tests)
        .args(["--test-threads", "1", "--nocapture"])
        .env("SLUICE_SIMD", level.name())
        .output()
        .expect("run the test binary")
}

/// The two checks above at every other instruction-set level this CPU runs, each in a run of
/// this test binary with `SLUICE_SIMD` forcing the level (the level is read once per process):
/// the levels' kernels round differently, and each must stay within the golden bounds.
#[test]
fn golden_holds_at_every_other_simd_level() {
    for level in SimdLevel::alternatives() {
        let run = run_at(
            level,
            &[
                "score::teacher_forced_argmax_matches_llama_cpp",
                "score::first_step_logits_match_llama_cpp",
            ],
        );
        let err = String::from_utf8_lossy(&run.stderr);
        let out = String::from_utf8_lossy(&run.stdout);
        for line in err
            .lines()
            .filter(|l| l.starts_with("overall") || l.starts_with("largest"))
        {
            eprintln!("{}: {line}", level.name());
        }
        assert!(
            run.status.success() && out.contains("2 passed"),
            "golden checks at SLUICE_SIMD={}:\n{out}\n{err}",
            level.name()
        );
    }
}

/// The golden records' tokens (600), then the same again until 2,048 tokens: the mean negative
/// log-likelihood of the first copy and of the rest, whose every token can be found by
/// attending 600 positions back.
fn repeated_golden_nll() -> (f64, f64) {
    let once: Vec<u32> = golden("greedy.jsonl")
        .iter()
        .flat_map(|r| {
            let mut t = ids(&r["prompt_tokens"]);
            t.extend(ids(&r["greedy_tokens"]));
            t
        })
        .collect();
    let tokens: Vec<u32> = once.iter().cycle().take(2048).copied().collect();
    let scores = score(&shared().llama, &tokens).expect("score");
    let nll = |r: std::ops::Range<usize>| {
        let n = r.len() as f64;
        -r.map(|i| scores.positions[i].next_logprob.expect("logprob") as f64)
            .sum::<f64>()
            / n
    };
    (nll(0..once.len() - 1), nll(once.len()..tokens.len() - 1))
}

/// A long context is read, not just fitted: past 600 tokens the text repeats, and the model
/// (through attention 600 to 2,000 positions back) predicts the copy.
#[test]
fn a_long_context_repeat_is_predicted() {
    let (first, repeat) = repeated_golden_nll();
    eprintln!("long nll first {first:.5} repeat {repeat:.5}");
    assert!(
        repeat < first / 4.0,
        "the repeat costs {repeat:.3} nats a token against {first:.3} for the first copy"
    );
}

/// [`a_long_context_repeat_is_predicted`] at every other level from AVX2 up that this CPU runs:
/// each level's likelihoods within 0.02 nats a token of this level's (the levels round
/// differently, and `avx512bf16` rounds attention's factors to bf16; at 4,096 tokens of the
/// docs it moved the mean by 0.005).
#[test]
fn long_context_likelihood_agrees_across_simd_levels() {
    let (first, repeat) = repeated_golden_nll();
    for level in SimdLevel::alternatives().filter(|l| l.name() != "scalar") {
        let run = run_at(level, &["score::a_long_context_repeat_is_predicted"]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "at {}:\n{err}", level.name());
        let line = err
            .lines()
            .find_map(|l| l.strip_prefix("long nll first "))
            .expect("the nll line");
        let got: Vec<f64> = line
            .split(" repeat ")
            .map(|x| x.trim().parse().expect("a number"))
            .collect();
        eprintln!(
            "{}: first {:.5} repeat {:.5} (here {first:.5} {repeat:.5})",
            level.name(),
            got[0],
            got[1]
        );
        assert!(
            (got[0] - first).abs() <= 0.02 && (got[1] - repeat).abs() <= 0.02,
            "at {}: {got:?} against {first} {repeat}",
            level.name()
        );
    }
}
