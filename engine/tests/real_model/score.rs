//! The forward pass against llama.cpp by teacher forcing (see shared/golden/README.md).

use sluice_engine::backend::cpu::kernels::simd_level;
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

/// The two checks above at every instruction-set level below this process's, each in a run of
/// this test binary with `SLUICE_SIMD` forcing the level (the level is read once per process):
/// the levels' kernels round differently, and each must stay within the golden bounds.
#[test]
fn golden_holds_at_every_lower_simd_level() {
    let exe = std::env::current_exe().expect("test binary");
    for level in simd_level().lower() {
        let run = std::process::Command::new(&exe)
            .args([
                "--exact",
                "score::teacher_forced_argmax_matches_llama_cpp",
                "score::first_step_logits_match_llama_cpp",
                "--test-threads",
                "1",
                "--nocapture",
            ])
            .env("SLUICE_SIMD", level.name())
            .output()
            .expect("run the test binary");
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
