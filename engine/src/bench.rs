//! `sluice-engine bench`: prefill and batched-decode throughput, measured like llama-bench
//! (pp512: one 512-token prompt; tg128: 128 tokens generated from an empty context). Several
//! prompt lengths give several prefill rows (`--prompt 512,4096,8192`, as `llama-bench -p`), and
//! several context depths several decode rows (`--depth 0,4096,8192`, as `llama-bench -d`: the
//! tokens are generated after that many tokens of context, whose prefill is not timed).

use std::time::Instant;

use serde::Serialize;

use crate::backend::Backend;
use crate::error::Result;
use crate::generate::{argmax, Rng};
use crate::kv::{BlockPool, BlockTable, SeqRows, BLOCK_SIZE};
use crate::model::{ForwardState, Llama};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Prompt lengths, one prefill row each (the first is the report's `prefill_tok_s`).
    pub prefill_tokens: Vec<usize>,
    pub decode_tokens: usize,
    pub decode_batches: Vec<usize>,
    /// Context depths: each sequence of a batch decodes after this many tokens of context of its
    /// own (one decode row per depth and batch; the contexts' prefill is not timed).
    pub depths: Vec<usize>,
    /// Repetitions of each measurement; the median is reported.
    pub repetitions: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            prefill_tokens: vec![512],
            decode_tokens: 128,
            decode_batches: vec![1, 4, 8],
            depths: vec![0],
            repetitions: 3,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct DecodeResult {
    pub batch: usize,
    /// Tokens of context each sequence decoded after.
    pub depth: usize,
    /// Tokens per second over the whole batch.
    pub tok_s: f64,
    /// Tokens per second seen by one sequence.
    pub per_seq_tok_s: f64,
}

/// One prompt length's prefill.
#[derive(Clone, Debug, Serialize)]
pub struct PrefillResult {
    pub tokens: usize,
    /// Median tokens per second.
    pub tok_s: f64,
    /// Median seconds for the whole prompt.
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub backend: &'static str,
    /// The first prompt length and its rate.
    pub prefill_tokens: usize,
    pub prefill_tok_s: f64,
    /// Every prompt length.
    pub prefill: Vec<PrefillResult>,
    pub decode_tokens: usize,
    pub decode: Vec<DecodeResult>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Pseudo-random token ids, as llama-bench uses: no cache can make them cheap.
fn random_tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

pub fn run<B: Backend>(model: &Llama<B>, cfg: &BenchConfig) -> Result<BenchReport> {
    let mut rng = Rng::new(0x5eed);
    let reps = cfg.repetitions.max(1);

    let mut prefill = Vec::new();
    for &n in &cfg.prefill_tokens {
        // One KV cache for the prompt length, first touched by an untimed run of the whole
        // prompt: llama-bench's method (a full-length warm-up prompt, then its repetitions on the
        // one context, cleared between them), and a server's, which keeps its pool. Otherwise the
        // first touch of a fresh cache's pages (kernel page zeroing: 5% of a 4,096-token
        // prefill) is timed.
        let mut pass = PrefillPass::new(model, n)?;
        pass.run(model, &mut rng)?;
        let mut secs = Vec::new();
        for _ in 0..reps {
            secs.push(pass.run(model, &mut rng)?);
        }
        let seconds = median(secs);
        prefill.push(PrefillResult {
            tokens: n,
            tok_s: n as f64 / seconds,
            seconds,
        });
    }

    let mut decode = Vec::new();
    // `--decode-tokens 0` measures prefill only.
    let batches = if cfg.decode_tokens == 0 {
        &[][..]
    } else {
        &cfg.decode_batches[..]
    };
    let widest = batches.iter().copied().max().unwrap_or(0);
    for &depth in cfg.depths.iter().filter(|_| widest > 0) {
        // One KV cache for every batch and repetition at this depth, as a server keeps its pool
        // (and llama-bench its context): pages are only first touched by the contexts' prefill
        // and the first run. The widest batch's contexts serve the narrower ones.
        let seqs = DecodeSeqs::new(widest, cfg.decode_tokens, depth)?;
        let mut state = model.new_state(seqs.pool.n_blocks())?;
        seqs.prefill_contexts(model, &mut state, &mut rng)?;
        for &batch in batches {
            let mut runs = Vec::new();
            for _ in 0..reps {
                runs.push(seqs.run(model, &mut state, &mut rng, batch)?);
            }
            let tok_s = median(runs);
            decode.push(DecodeResult {
                batch,
                depth,
                tok_s,
                per_seq_tok_s: tok_s / batch as f64,
            });
        }
    }
    let first = prefill.first().map_or((0, 0.0), |p| (p.tokens, p.tok_s));
    Ok(BenchReport {
        backend: model.backend().name(),
        prefill_tokens: first.0,
        prefill_tok_s: first.1,
        prefill,
        decode_tokens: cfg.decode_tokens,
        decode,
    })
}

/// One `n`-token prompt's forward pass, on a KV cache kept across passes.
struct PrefillPass<B: Backend> {
    table: BlockTable,
    state: ForwardState<B>,
    n: usize,
}

impl<B: Backend> PrefillPass<B> {
    fn new(model: &Llama<B>, n: usize) -> Result<Self> {
        let mut pool = BlockPool::new(n.div_ceil(BLOCK_SIZE));
        let mut table = BlockTable::new();
        table.reserve(&mut pool, n)?;
        let state = model.new_state(pool.n_blocks())?;
        Ok(Self { table, state, n })
    }

    /// Seconds for a pass over `n` fresh random tokens from position 0 (overwriting the cache of
    /// a previous pass).
    fn run(&mut self, model: &Llama<B>, rng: &mut Rng) -> Result<f64> {
        prompt_pass(model, &mut self.state, rng, self.table.blocks(), self.n)
    }
}

/// One prompt of `n` fresh random tokens from position 0 into the cache `blocks` (logits of the
/// last token only); seconds for its forward pass (the tokens are drawn before the clock starts).
fn prompt_pass<B: Backend>(
    model: &Llama<B>,
    state: &mut ForwardState<B>,
    rng: &mut Rng,
    blocks: &[u32],
    n: usize,
) -> Result<f64> {
    let ids = random_tokens(rng, n, model.config().vocab_size);
    let seq = SeqRows {
        start: 0,
        len: n,
        pos: 0,
        blocks,
    };
    let t = Instant::now();
    model.forward(state, &ids, &[seq], &[n - 1])?;
    Ok(t.elapsed().as_secs_f64())
}

/// Up to `widest` sequences that each decode `steps` tokens after `depth` tokens of context of
/// their own (as a server's sequences each have theirs: a batch streams every sequence's keys and
/// values), one row per sequence per forward pass.
struct DecodeSeqs {
    pool: BlockPool,
    tables: Vec<BlockTable>,
    steps: usize,
    depth: usize,
}

impl DecodeSeqs {
    fn new(widest: usize, steps: usize, depth: usize) -> Result<Self> {
        let per_seq = (depth + steps + 1).div_ceil(BLOCK_SIZE);
        let mut pool = BlockPool::new(per_seq * widest);
        let mut tables = Vec::with_capacity(widest);
        for _ in 0..widest {
            let mut t = BlockTable::new();
            t.reserve(&mut pool, depth + steps + 1)?;
            tables.push(t);
        }
        Ok(Self {
            pool,
            tables,
            steps,
            depth,
        })
    }

    /// Each sequence's context: an untimed prefill of `depth` random tokens.
    fn prefill_contexts<B: Backend>(
        &self,
        model: &Llama<B>,
        state: &mut ForwardState<B>,
        rng: &mut Rng,
    ) -> Result<()> {
        if self.depth == 0 {
            return Ok(());
        }
        for table in &self.tables {
            prompt_pass(model, state, rng, table.blocks(), self.depth)?;
        }
        Ok(())
    }

    /// The first `batch` sequences decode from position `depth` (overwriting the cache of a
    /// previous run past their contexts); tokens per second.
    fn run<B: Backend>(
        &self,
        model: &Llama<B>,
        state: &mut ForwardState<B>,
        rng: &mut Rng,
        batch: usize,
    ) -> Result<f64> {
        let vocab = model.config().vocab_size;
        let mut ids = random_tokens(rng, batch, vocab);
        let emit: Vec<usize> = (0..batch).collect();
        let t = Instant::now();
        for step in 0..self.steps {
            let seqs: Vec<SeqRows<'_>> = self.tables[..batch]
                .iter()
                .enumerate()
                .map(|(i, t)| SeqRows {
                    start: i,
                    len: 1,
                    pos: self.depth + step,
                    blocks: t.blocks(),
                })
                .collect();
            let logits = model.forward(state, &ids, &seqs, &emit)?;
            for (id, l) in ids.iter_mut().zip(logits.chunks_exact(vocab)) {
                *id = argmax(l);
            }
        }
        Ok((batch * self.steps) as f64 / t.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::model::tiny::{tiny_gguf, TINY};
    use crate::model::ModelPart;

    /// One decode row per depth and batch, in that order, each tagged with its depth; none when
    /// no token is decoded.
    #[test]
    fn decode_rows_per_depth_and_batch() {
        let model = Llama::load(
            Arc::new(tiny_gguf(3)),
            Arc::new(CpuBackend::new(1)),
            ModelPart::full(TINY.layers),
        )
        .unwrap();
        let cfg = BenchConfig {
            prefill_tokens: vec![8],
            decode_tokens: 3,
            decode_batches: vec![1, 2],
            depths: vec![0, 40],
            repetitions: 1,
        };
        let report = run(&model, &cfg).unwrap();
        let rows: Vec<(usize, usize)> = report.decode.iter().map(|d| (d.depth, d.batch)).collect();
        assert_eq!(rows, [(0, 1), (0, 2), (40, 1), (40, 2)]);
        assert!(report
            .decode
            .iter()
            .all(|d| d.tok_s.is_finite() && d.tok_s > 0.0));
        let none = BenchConfig {
            decode_tokens: 0,
            ..cfg
        };
        assert!(run(&model, &none).unwrap().decode.is_empty());
    }
}
