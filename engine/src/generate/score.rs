//! Teacher forcing: run a whole token sequence once and describe each next-token distribution.

use super::sampling::{argmax, log_prob};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::{BlockPool, BlockTable, SeqRows, BLOCK_SIZE};
use crate::model::Llama;

/// The next-token distribution after tokens `0..=i`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PositionScore {
    pub argmax: u32,
    /// The five most likely tokens with their logits, best first.
    pub top5: Vec<(u32, f32)>,
    /// Log-probability of the actual token `i + 1` (`None` for the last position).
    pub next_logprob: Option<f32>,
}

/// [`score`]'s answer: one entry per input token, and the perplexity of tokens `1..`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scores {
    pub positions: Vec<PositionScore>,
    pub perplexity: Option<f64>,
}

/// Runs `tokens` through the model in one forward pass and scores every position.
pub fn score<B: Backend>(model: &Llama<B>, tokens: &[u32]) -> Result<Scores> {
    let n = tokens.len();
    if n == 0 {
        return Err(Error::InvalidRequest("no tokens to score".into()));
    }
    if n > model.config().context_length {
        return Err(Error::InvalidRequest(format!(
            "{n} tokens exceed the context window of {}",
            model.config().context_length
        )));
    }
    let mut pool = BlockPool::new(n.div_ceil(BLOCK_SIZE));
    let mut table = BlockTable::new();
    table.reserve(&mut pool, n)?;
    let mut state = model.new_state(pool.n_blocks())?;
    let seq = SeqRows {
        start: 0,
        len: n,
        pos: 0,
        blocks: table.blocks(),
    };
    let rows: Vec<usize> = (0..n).collect();
    let logits = model.forward(&mut state, tokens, &[seq], &rows)?;
    let vocab = model.config().vocab_size;
    let mut positions = Vec::with_capacity(n);
    let mut nll = 0.0f64;
    for (i, l) in logits.chunks_exact(vocab).enumerate() {
        let mut idx: Vec<u32> = (0..vocab as u32).collect();
        let k = 5.min(vocab);
        idx.select_nth_unstable_by(k - 1, |&a, &b| l[b as usize].total_cmp(&l[a as usize]));
        let mut top5: Vec<(u32, f32)> = idx[..k].iter().map(|&t| (t, l[t as usize])).collect();
        top5.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let next_logprob = tokens.get(i + 1).map(|&t| log_prob(l, t as usize));
        nll -= next_logprob.unwrap_or(0.0) as f64;
        positions.push(PositionScore {
            argmax: argmax(l),
            top5,
            next_logprob,
        });
    }
    let perplexity = (n > 1).then(|| (nll / (n - 1) as f64).exp());
    Ok(Scores {
        positions,
        perplexity,
    })
}
