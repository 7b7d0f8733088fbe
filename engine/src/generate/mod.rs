//! Generating text for one sequence, and scoring a sequence by teacher forcing.

mod defaults;
mod grammar;
mod numbers;
mod sampling;
mod score;
mod stop;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use defaults::GenerationDefaults;
pub use grammar::{Constraint, GrammarSpec, Grammars};
pub use sampling::{
    argmax, log_prob, token_logprob, Rng, Sampler, SamplingParams, Shaping, TokenLogprob,
};
pub use score::{score, PositionScore, Scores};
pub use stop::StopMatcher;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::{BlockPool, BlockTable, SeqRows};
use crate::model::detok::StreamDecoder;
use crate::model::tokenizer::Tokenizer;
use crate::model::Llama;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Text that ends generation (not included in the output).
    pub stop: Vec<String>,
}

/// Why generation ended, in OpenAI's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens`, or the end of the context window.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids, including a final end-of-turn token if one was sampled.
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

/// Tokens per second, or 0 for an empty interval.
pub fn tokens_per_sec(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// Runs `prompt` through `model` and samples up to `params.max_tokens` tokens, calling
/// `on_text` with each piece of text as soon as it is complete UTF-8 and cannot be part of a
/// stop string.
pub fn generate<B: Backend>(
    model: &Llama<B>,
    tokenizer: &Arc<Tokenizer>,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    let ctx = model.config().context_length;
    if params.max_tokens == 0 {
        return Err(Error::InvalidRequest(
            "max_tokens must be at least 1".into(),
        ));
    }
    if prompt.is_empty() {
        return Err(Error::InvalidRequest("the prompt is empty".into()));
    }
    if prompt.len() >= ctx {
        return Err(Error::InvalidRequest(format!(
            "the prompt has {} tokens; the context window is {ctx}",
            prompt.len()
        )));
    }
    let total = (prompt.len() + params.max_tokens).min(ctx);
    let mut pool = BlockPool::new(total.div_ceil(crate::kv::BLOCK_SIZE));
    let mut table = BlockTable::new();
    table.reserve(&mut pool, total)?;
    let mut state = model.new_state(pool.n_blocks())?;
    let mut sampler = Sampler::new(params.sampling.clone());
    let mut decoder = StreamDecoder::new(tokenizer.clone());
    let mut stops = StopMatcher::new(params.stop.clone());
    let mut out = Generation {
        tokens: Vec::new(),
        text: String::new(),
        finish: FinishReason::Length,
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
    };
    let mut emit = |piece: &str, out: &mut Generation| {
        if !piece.is_empty() {
            on_text(piece);
            out.text.push_str(piece);
        }
    };

    let t0 = Instant::now();
    let seq = SeqRows {
        start: 0,
        len: prompt.len(),
        pos: 0,
        blocks: table.blocks(),
    };
    let mut logits = model
        .forward(&mut state, prompt, &[seq], &[prompt.len() - 1])?
        .into_owned();
    out.prefill_time = t0.elapsed();

    let t1 = Instant::now();
    let mut pos = prompt.len();
    let mut cut_by_stop_string = false;
    loop {
        let id = sampler.sample(&logits);
        out.tokens.push(id);
        if tokenizer.is_stop(id) {
            out.finish = FinishReason::Stop;
            break;
        }
        if let Some(piece) = decoder.push(id) {
            let (safe, hit) = stops.push(&piece);
            emit(&safe, &mut out);
            if hit {
                out.finish = FinishReason::Stop;
                cut_by_stop_string = true;
                break;
            }
        }
        if out.tokens.len() >= params.max_tokens || pos >= total {
            break;
        }
        let seq = SeqRows {
            start: 0,
            len: 1,
            pos,
            blocks: table.blocks(),
        };
        logits = model.forward(&mut state, &[id], &[seq], &[0])?.into_owned();
        pos += 1;
    }
    out.decode_time = t1.elapsed();
    if !cut_by_stop_string {
        let (rest, _) = stops.push(&decoder.flush());
        emit(&rest, &mut out);
        let held = stops.finish();
        emit(&held, &mut out);
    }
    Ok(out)
}
