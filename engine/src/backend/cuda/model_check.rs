//! The GPU check's model-level part (`scripts/gpu-check.sh`, through `examples/gpu_check.rs`):
//! the seeded synthetic model ([`super::synthetic`]) on the CUDA backend against the CPU
//! backend, for 1 rank and for 3 ranks sharing GPU 0 (activations device → host → device between
//! them, as the pipeline passes them), then `bench` with and without decode graphs.
//!
//! - first-step logits: the largest difference relative to the CPU's logit range, and whether the
//!   top 5 agree;
//! - greedy decode of 32 tokens, one sequence and three sequences batched (a decode graph of 4
//!   with one padding row), against the CPU's tokens; and with graphs off, where one sequence's
//!   logits must be bit-identical to the graphed run's (the same kernels, the same split plan);
//! - `bench`: pp512 and pp8192, decode at batch 1, 8 and 64 with graphs off, on (the default
//!   buckets: 64 runs eagerly above them) and with buckets up to 64.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};

use super::backend::CudaBackend;
use super::graphs::GraphConfig;
use crate::backend::cpu::CpuBackend;
use crate::backend::Backend;
use crate::bench::{self, BenchConfig};
use crate::error::Result;
use crate::generate::Rng;
use crate::kv::{BlockPool, BlockTable, SeqRows};
use crate::model::gguf::GgufFile;
use crate::model::synthetic::{self, SMOLLM2_135M};
use crate::model::{Llama, ModelPart};
use crate::pipeline::LayerSplit;

const PROMPT: usize = 32;
const GREEDY: usize = 32;
/// Bound on the first-step logits' largest difference over the CPU's logit range.
const LOGIT_BOUND: f64 = 2e-2;

/// A model split over ranks, each part on its own backend.
struct Ranks<B: Backend> {
    parts: Vec<Llama<B>>,
}

/// One sequence's state across the ranks.
struct Run<B: Backend> {
    states: Vec<crate::model::ForwardState<B>>,
}

impl<B: Backend> Ranks<B> {
    fn load(gguf: &Arc<GgufFile>, n: usize, backend: impl Fn() -> Result<B>) -> Result<Self> {
        let split = LayerSplit::even(SMOLLM2_135M.layers, n)?;
        let parts = (0..n)
            .map(|r| Llama::load(gguf.clone(), Arc::new(backend()?), split.part(r)))
            .collect::<Result<_>>()?;
        Ok(Self { parts })
    }

    fn start(&self, blocks: usize) -> Result<Run<B>> {
        let states = self
            .parts
            .iter()
            .map(|p| p.new_state(blocks))
            .collect::<Result<_>>()?;
        Ok(Run { states })
    }

    /// One forward pass over the ranks: the logits of the last row of each sequence.
    fn step(&self, run: &mut Run<B>, ids: &[u32], seqs: &[SeqRows<'_>]) -> Result<Vec<f32>> {
        let first = &self.parts[0];
        let d = first.config().d_model;
        let mut hidden = first.alloc_hidden(ids.len());
        first.embed(ids, &mut hidden)?;
        let mut host = Vec::new();
        for (r, (part, st)) in self.parts.iter().zip(run.states.iter_mut()).enumerate() {
            if r > 0 {
                hidden = part.alloc_hidden(ids.len());
                part.backend().upload(&host, &mut hidden);
            }
            part.forward_blocks(st, seqs, &mut hidden, ids.len());
            if r + 1 < self.parts.len() {
                host = part.backend().download(&hidden, ids.len() * d);
            }
        }
        let emit: Vec<usize> = seqs.iter().map(|s| s.start + s.len - 1).collect();
        let st = run.states.last_mut().expect("a rank");
        Ok(self
            .parts
            .last()
            .expect("a rank")
            .logits(st, &hidden, &emit)?
            .into_owned())
    }

    /// The prompts' first-step logits, then `GREEDY` greedy tokens per prompt, all prompts in one
    /// batch; the last step's logits too.
    fn greedy(&self, prompts: &[Vec<u32>]) -> Result<Greedy> {
        let per_seq = (PROMPT + GREEDY + 1).div_ceil(crate::kv::BLOCK_SIZE);
        let mut pool = BlockPool::new(per_seq * prompts.len());
        let mut tables = Vec::new();
        for _ in prompts {
            let mut t = BlockTable::new();
            t.reserve(&mut pool, PROMPT + GREEDY + 1)?;
            tables.push(t);
        }
        let mut run = self.start(pool.n_blocks())?;
        let vocab = self.parts[0].config().vocab_size;
        // Prefill each prompt (one chunk each, in one batch).
        let ids: Vec<u32> = prompts.concat();
        let seqs: Vec<SeqRows<'_>> = tables
            .iter()
            .enumerate()
            .map(|(i, t)| SeqRows {
                start: i * PROMPT,
                len: PROMPT,
                pos: 0,
                blocks: t.blocks(),
            })
            .collect();
        let mut logits = self.step(&mut run, &ids, &seqs)?;
        let first = logits.clone();
        let mut tokens = vec![Vec::new(); prompts.len()];
        for step in 0..GREEDY {
            let next: Vec<u32> = logits.chunks_exact(vocab).map(argmax).collect();
            for (t, &n) in tokens.iter_mut().zip(&next) {
                t.push(n);
            }
            if step + 1 == GREEDY {
                break;
            }
            let seqs: Vec<SeqRows<'_>> = tables
                .iter()
                .enumerate()
                .map(|(i, t)| SeqRows {
                    start: i,
                    len: 1,
                    pos: PROMPT + step,
                    blocks: t.blocks(),
                })
                .collect();
            logits = self.step(&mut run, &next, &seqs)?;
        }
        Ok(Greedy {
            first,
            tokens,
            last: logits,
        })
    }
}

struct Greedy {
    first: Vec<f32>,
    tokens: Vec<Vec<u32>>,
    last: Vec<f32>,
}

fn argmax(l: &[f32]) -> u32 {
    l.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0 as u32
}

fn top5(l: &[f32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..l.len() as u32).collect();
    idx.sort_by(|&a, &b| l[b as usize].total_cmp(&l[a as usize]));
    idx.truncate(5);
    idx
}

/// The largest difference over the reference's range, and the first index where they differ.
fn compare(got: &[f32], want: &[f32]) -> (f64, f64) {
    let (lo, hi) = want
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let max = got
        .iter()
        .zip(want)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    (max / f64::from((hi - lo).max(1e-6)), max)
}

fn first_divergence(a: &[Vec<u32>], b: &[Vec<u32>]) -> Option<(usize, usize)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find_map(|(s, (x, y))| x.iter().zip(y).position(|(p, q)| p != q).map(|i| (s, i)))
}

/// A line printed and kept for the log.
fn say(line: String) {
    println!("{line}");
}

/// The checks so far, and how many failed.
#[derive(Default)]
pub(super) struct Checks {
    pub(super) list: Vec<Value>,
    pub(super) failed: usize,
}

impl Checks {
    /// Records one check, printing its line.
    pub(super) fn check(&mut self, name: &str, ok: bool, detail: Value) {
        say(format!(
            "{:<4} {name:<44} {detail}",
            if ok { "ok" } else { "FAIL" }
        ));
        self.failed += usize::from(!ok);
        self.list
            .push(json!({ "name": name, "pass": ok, "detail": detail }));
    }

    /// Runs one stage of checks: an error or a panic in it (a CUDA error surfaces as either)
    /// fails the stage as a check of its own, and the next stage still runs, so one first run on
    /// a GPU says as much as it can.
    pub(super) fn stage(&mut self, name: &str, f: impl FnOnce(&mut Self) -> Result<()>) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        let failure = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".into()),
        };
        self.check(&format!("{name}: ran to the end"), false, json!(failure));
    }
}

/// Runs the model-level checks, writing the synthetic model into `dir` (a temporary directory:
/// it is not a result); the JSON report and whether every check passed.
pub fn run(dir: &Path) -> Result<(Value, bool)> {
    let path = dir.join("sluice-synthetic-smollm2-135m.gguf");
    let t = Instant::now();
    synthetic::write(&path, &SMOLLM2_135M, 0x5eed_0135)?;
    say(format!(
        "model: synthetic SmolLM2-135M shapes (seed 0x5eed_0135) written in {:.1} s",
        t.elapsed().as_secs_f64()
    ));
    let gguf = Arc::new(GgufFile::open(&path)?);
    let _ = std::fs::remove_file(&path); // mapped: the pages stay until the model goes
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rng = Rng::new(42);
    let vocab = SMOLLM2_135M.vocab;
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..PROMPT)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect()
        })
        .collect();
    let cpu = Ranks::load(&gguf, 1, || Ok(CpuBackend::new(threads)))?;
    let want_one = cpu.greedy(&prompts[..1])?;
    let want_three = cpu.greedy(&prompts)?;
    let mut c = Checks::default();
    for ranks in [1, 3] {
        c.stage(&format!("{ranks} rank(s)"), |c| {
            let gpu = Ranks::load(&gguf, ranks, || CudaBackend::new(0, 64))?;
            for (label, want, n) in [("1 sequence", &want_one, 1), ("3 batched", &want_three, 3)] {
                let got = gpu.greedy(&prompts[..n])?;
                let (rel, abs) = compare(&got.first, &want.first);
                let tops: Vec<_> = got.first.chunks_exact(vocab).map(top5).collect();
                let want_tops: Vec<_> = want.first.chunks_exact(vocab).map(top5).collect();
                c.check(
                    &format!("{ranks} rank(s), {label}: first-step logits"),
                    rel <= LOGIT_BOUND && tops == want_tops,
                    json!({ "max_rel_to_range": rel, "max_abs": abs, "bound": LOGIT_BOUND,
                            "top5": tops, "cpu_top5": want_tops }),
                );
                let div = first_divergence(&got.tokens, &want.tokens);
                c.check(
                    &format!("{ranks} rank(s), {label}: greedy {GREEDY} tokens"),
                    div.is_none(),
                    json!({ "first_divergence": div.map(|(s, i)| json!({"seq": s, "token": i})),
                            "tokens": got.tokens, "cpu_tokens": want.tokens }),
                );
            }
            let stats = gpu.parts[0].backend().graph_stats();
            c.check(
                &format!("{ranks} rank(s): decode steps replayed from graphs"),
                stats.replays > 0 && stats.failures == 0,
                json!(format!("{stats:?}")),
            );
            Ok(())
        });
    }
    // Graphs off: the same tokens; bit-identical logits for one sequence (graph of 1, no
    // padding, the same split plan), within 1e-3 of the range for three (a graph of 4 splits the
    // KV as for 4 sequences, the eager step as for 3).
    c.stage("graphs on vs off", |c| {
        let on = Ranks::load(&gguf, 1, || CudaBackend::new(0, 64))?;
        let off_cfg = GraphConfig { buckets: vec![] };
        let off = Ranks::load(&gguf, 1, || {
            CudaBackend::with_graphs(0, 64, off_cfg.clone())
        })?;
        for (n, exact) in [(1, true), (3, false)] {
            let (a, b) = (on.greedy(&prompts[..n])?, off.greedy(&prompts[..n])?);
            let (rel, abs) = compare(&a.last, &b.last);
            c.check(
                &format!("graphs on vs off, {n} sequence(s): last logits, tokens"),
                a.tokens == b.tokens && if exact { abs == 0.0 } else { rel <= 1e-3 },
                json!({ "max_abs": abs, "max_rel_to_range": rel, "exact": exact }),
            );
        }
        Ok(())
    });
    let mut benches = Vec::new();
    // (label, buckets, prefill lengths, decode batches)
    let runs = [
        ("graphs off", vec![], vec![512, 8192], vec![1, 8, 64]),
        ("graphs 1,2,4,8", vec![1, 2, 4, 8], vec![], vec![1, 8, 64]),
        (
            "graphs up to 64",
            vec![1, 2, 4, 8, 16, 32, 64],
            vec![],
            vec![64],
        ),
    ];
    for (label, buckets, prefill, batches) in runs {
        c.stage(&format!("bench {label}"), |_| {
            let cfg = GraphConfig { buckets };
            let model = Llama::load(
                gguf.clone(),
                Arc::new(CudaBackend::with_graphs(0, 64, cfg)?),
                ModelPart::full(SMOLLM2_135M.layers),
            )?;
            let bc = BenchConfig {
                prefill_tokens: prefill,
                decode_tokens: 128,
                decode_batches: batches,
                depths: vec![0],
                repetitions: 3,
            };
            let report = bench::run(&model, &bc)?;
            for p in &report.prefill {
                say(format!(
                    "bench {label}: pp{} {:.0} tok/s ({:.3} s)",
                    p.tokens, p.tok_s, p.seconds
                ));
            }
            for d in &report.decode {
                say(format!(
                    "bench {label}: tg128 batch {} {:.0} tok/s ({:.0} per sequence)",
                    d.batch, d.tok_s, d.per_seq_tok_s
                ));
            }
            let stats = model.backend().graph_stats();
            say(format!("bench {label}: {stats:?}"));
            benches
                .push(json!({ "label": label, "report": report, "graphs": format!("{stats:?}") }));
            Ok(())
        });
    }
    let pass = c.failed == 0;
    Ok((json!({ "checks": c.list, "bench": benches }), pass))
}
