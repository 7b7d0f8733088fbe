//! One rank's share of a micro-batch: its blocks, and on the last rank the head and sampling.

use std::collections::HashMap;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::generate::{token_logprob, Sampler, SamplingParams};
use crate::kv::SeqRows;
use crate::model::{ForwardState, Llama};
use crate::transport::message::{SampleSpec, Sampled, SeqChunk, TokenMask};

/// A model part with its KV store, ready to run micro-batches in order.
pub struct Stage<B: Backend> {
    model: Llama<B>,
    state: ForwardState<B>,
    hidden: B::Buf,
    hidden_rows: usize,
    /// Per-sequence samplers (the last rank only), kept until the sequence is released.
    samplers: HashMap<u64, Sampler>,
}

impl<B: Backend> std::fmt::Debug for Stage<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("part", self.model.part())
            .finish()
    }
}

/// The batch rows of each sequence, in order.
pub fn seq_rows(seqs: &[SeqChunk]) -> Vec<SeqRows<'_>> {
    let mut start = 0;
    seqs.iter()
        .map(|s| {
            let r = SeqRows {
                start,
                len: s.len as usize,
                pos: s.pos as usize,
                blocks: &s.blocks,
            };
            start += s.len as usize;
            r
        })
        .collect()
}

impl<B: Backend> Stage<B> {
    pub fn new(model: Llama<B>, kv_blocks: usize) -> Result<Self> {
        let state = model.new_state(kv_blocks)?;
        let hidden = model.alloc_hidden(1);
        Ok(Self {
            model,
            state,
            hidden,
            hidden_rows: 1,
            samplers: HashMap::new(),
        })
    }

    pub fn model(&self) -> &Llama<B> {
        &self.model
    }

    /// Token slots in this stage's KV store.
    pub fn kv_tokens(&self) -> usize {
        self.state.kv_spec().n_blocks * crate::kv::BLOCK_SIZE
    }

    pub fn kv_bytes(&self) -> u64 {
        self.state.kv_spec().bytes() as u64
    }

    fn ensure_rows(&mut self, rows: usize) {
        if rows > self.hidden_rows {
            self.hidden_rows = rows.next_power_of_two();
            self.hidden = self.model.alloc_hidden(self.hidden_rows);
        }
    }

    /// Checks a micro-batch against this stage before touching memory: rows add up, every
    /// sequence has rows, positions are covered by block tables that fit the KV store (in
    /// `usize`: a peer's `pos + len` past `u32::MAX` must not wrap under the table).
    fn check(&self, seqs: &[SeqChunk], rows: usize) -> Result<()> {
        let n_blocks = self.state.kv_spec().n_blocks as u32;
        let total: usize = seqs.iter().map(|s| s.len as usize).sum();
        if total != rows {
            return Err(Error::InvalidRequest(format!(
                "micro-batch has {rows} rows, its sequences {total}"
            )));
        }
        for s in seqs {
            if s.len == 0 {
                return Err(Error::InvalidRequest(format!(
                    "sequence {} has no rows in the micro-batch",
                    s.seq
                )));
            }
            let need = s.pos as usize + s.len as usize;
            if s.blocks.len() * crate::kv::BLOCK_SIZE < need
                || s.blocks.iter().any(|&b| b >= n_blocks)
            {
                return Err(Error::InvalidRequest(format!(
                    "sequence {} has a block table that does not fit",
                    s.seq
                )));
            }
        }
        Ok(())
    }

    /// The first rank: embeds `ids` and runs this stage's blocks.
    pub fn run_tokens(&mut self, seqs: &[SeqChunk], ids: &[u32]) -> Result<()> {
        self.check(seqs, ids.len())?;
        self.ensure_rows(ids.len());
        self.model.embed(ids, &mut self.hidden)?;
        self.model.forward_blocks(
            &mut self.state,
            &seq_rows(seqs),
            &mut self.hidden,
            ids.len(),
        );
        Ok(())
    }

    /// A later rank: takes the previous rank's activations and runs this stage's blocks.
    pub fn run_hidden(&mut self, seqs: &[SeqChunk], hidden: &[f32]) -> Result<()> {
        let d = self.model.config().d_model;
        let rows = hidden.len() / d;
        if rows * d != hidden.len() {
            return Err(Error::InvalidRequest(format!(
                "activations of {} values are not rows of {d}",
                hidden.len()
            )));
        }
        self.check(seqs, rows)?;
        self.ensure_rows(rows);
        self.model.backend().upload(hidden, &mut self.hidden);
        self.model
            .forward_blocks(&mut self.state, &seq_rows(seqs), &mut self.hidden, rows);
        Ok(())
    }

    /// The activations after this stage, `rows × d_model`, to send on.
    pub fn hidden(&self, rows: usize) -> Vec<f32> {
        self.model
            .backend()
            .download(&self.hidden, rows * self.model.config().d_model)
    }

    /// The last rank: samples the last row of each sequence that asks for it.
    pub fn sample(&mut self, batch: u64, seqs: &[SeqChunk]) -> Result<Sampled> {
        let mut out = Sampled {
            batch,
            tokens: Vec::new(),
            logprobs: Vec::new(),
        };
        let mut emit = Vec::new();
        let mut row = 0;
        for s in seqs {
            row += s.len as usize;
            if s.sample.is_some() {
                emit.push(row - 1);
            }
        }
        if emit.is_empty() {
            return Ok(out);
        }
        let logits = self.model.logits(&mut self.state, &self.hidden, &emit)?;
        let vocab = self.model.config().vocab_size;
        let mut masked = Vec::new();
        for ((seq, spec), raw) in seqs
            .iter()
            .filter_map(|s| s.sample.as_ref().map(|p| (s.seq, p)))
            .zip(logits.chunks_exact(vocab))
        {
            // A copy only for a sequence whose step masks tokens out.
            let l = if spec.suppress.is_empty() && spec.allow.is_none() {
                raw
            } else {
                masked.clear();
                masked.extend_from_slice(raw);
                mask(&mut masked, spec);
                &masked[..]
            };
            let sampler = self.samplers.entry(seq).or_insert_with(|| {
                let mut s = Sampler::with_shaping(params(spec), spec.shaping.clone());
                s.set_prompt(&spec.prompt);
                s
            });
            let id = sampler.sample(l);
            out.tokens.push((seq, id));
            if let Some(n) = spec.logprobs {
                out.logprobs.push((seq, token_logprob(raw, id, n as usize)));
            }
        }
        Ok(out)
    }

    /// Forgets the sequences' samplers (their KV blocks are simply reused).
    pub fn release(&mut self, seqs: &[u64]) {
        for s in seqs {
            self.samplers.remove(s);
        }
    }
}

/// Masks out the suppressed tokens and those the step's grammar mask does not allow.
fn mask(logits: &mut [f32], spec: &SampleSpec) {
    for &id in &spec.suppress {
        if let Some(v) = logits.get_mut(id as usize) {
            *v = f32::NEG_INFINITY;
        }
    }
    match &spec.allow {
        None => {}
        Some(TokenMask::Only(ids)) => {
            let kept: Vec<(usize, f32)> = ids
                .iter()
                .filter_map(|&i| logits.get(i as usize).map(|&l| (i as usize, l)))
                .collect();
            logits.fill(f32::NEG_INFINITY);
            for (i, l) in kept {
                logits[i] = l;
            }
        }
        Some(TokenMask::Except { ids, .. }) => {
            for &i in ids {
                if let Some(v) = logits.get_mut(i as usize) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        Some(TokenMask::Bits(words)) => {
            for (i, l) in logits.iter_mut().enumerate() {
                if words.get(i / 64).is_none_or(|w| w >> (i % 64) & 1 == 0) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

fn params(spec: &SampleSpec) -> SamplingParams {
    SamplingParams {
        temperature: spec.temperature,
        top_k: spec.top_k as usize,
        top_p: spec.top_p,
        seed: Some(spec.seed),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::model::tiny::{tiny_gguf, TINY};
    use crate::model::ModelPart;

    fn stage() -> Stage<CpuBackend> {
        let model = Llama::load(
            Arc::new(tiny_gguf(5)),
            Arc::new(CpuBackend::new(1)),
            ModelPart::full(TINY.layers),
        )
        .expect("model");
        Stage::new(model, 4).expect("stage")
    }

    fn chunk(len: u32, pos: u32, blocks: Vec<u32>) -> SeqChunk {
        SeqChunk {
            seq: 1,
            len,
            pos,
            blocks,
            sample: None,
        }
    }

    #[test]
    fn a_peer_s_chunks_that_do_not_fit_are_refused_not_run() {
        let mut s = stage();
        let d = s.model().config().d_model;
        // pos + len past u32::MAX wrapped to 0 under an empty block table, then indexed out of
        // the KV store.
        let wraps = [chunk(1, u32::MAX, vec![])];
        assert!(s.run_hidden(&wraps, &vec![0.0; d]).is_err());
        // A sequence with no rows (one that asked for a sample underflowed its row index in
        // `sample`, which runs after this check).
        assert!(s.run_hidden(&[chunk(0, 0, vec![0])], &[]).is_err());
        // What fits runs.
        assert!(s.run_hidden(&[chunk(1, 0, vec![0])], &vec![0.0; d]).is_ok());
    }
}
