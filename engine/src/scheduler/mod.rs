//! The scheduler on rank 0: waiting and running queues, chunked prefill under a per-step token
//! budget, micro-batches kept in flight so every pipeline stage computes at once, preemption
//! by recomputation when the KV pool runs out, and immediate release of aborted requests.
//!
//! It is vLLM's v1 design without separate prefill and decode phases: each sequence's
//! `num_scheduled` catches up with its tokens, a chunk at a time. A micro-batch's grammar
//! masks are computed on another thread while rank 0 runs its blocks (`masks`).

mod handle;
mod masks;
mod sequence;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub use handle::{EngineConfig, EngineHandle, Input};
pub use masks::PendingMasks;
pub use sequence::{Progress, Sequence};

use masks::MaskWorker;

use crate::api::{EngineError, MetricsSnapshot};
use crate::generate::{FinishReason, TokenLogprob};
use crate::kv::{BlockPool, BLOCK_SIZE};
use crate::model::tokenizer::Tokenizer;
use crate::transport::message::{Forward, SampleSpec, Sampled, SeqChunk};

/// Limits the scheduler works within.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Sequences holding KV and being computed at once (`--max-running`).
    pub max_running: usize,
    /// Rows per micro-batch (`--max-batch-tokens`): a long prompt is prefilled in chunks of
    /// at most this many tokens, so running decodes keep getting turns.
    pub max_batch_tokens: usize,
    /// Micro-batches in the pipeline at once (`--micro-batches`: one per rank, or one when the
    /// ranks share their cores).
    pub max_in_flight: usize,
    pub kv_blocks: usize,
    /// The order prefill chunks take the budget in (`--prefill-order`).
    pub prefill_order: PrefillOrder,
    /// Tokens of long prompts (those that do not fit one micro-batch) a micro-batch takes at
    /// most while any request decodes (`--decode-chunk-tokens`): a decode step, in the same
    /// micro-batch or queued behind it at a rank, then waits for a short chunk, not a full
    /// one, and the running requests keep their pace beside a long prefill. A prompt that fits
    /// one micro-batch still goes whole.
    pub decode_chunk_tokens: usize,
    /// The context at which a long prompt's chunk is half of `max_batch_tokens`
    /// (`--chunk-context-tokens`; 0: off). A chunk at position `p` takes at most
    /// `max_batch_tokens × K / (K + p)` tokens, so that every chunk costs about what a full one
    /// does at the start of the prompt: each of its tokens attends over the whole context
    /// before it, and a full chunk deep in a 4K prompt took ~3× one at its start. A request
    /// that arrives meanwhile waits for the chunk in flight, so this bounds its wait.
    pub chunk_context_tokens: usize,
}

/// The fewest tokens [`SchedulerConfig::chunk_context_tokens`] cuts a long prompt's chunk to:
/// below it, reading the weights and the hops between ranks outweigh the attention saved. A cut
/// chunk is whole KV blocks.
const CONTEXT_CHUNK_FLOOR: usize = 64;

/// The order in which the running prompts' prefill chunks take a micro-batch's token budget
/// (after the decode steps, which go oldest first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillOrder {
    /// The oldest first (first come, first served, as vLLM's scheduler): a prompt admitted
    /// while a long one prefills waits out the rest of that prefill (a 256-token prompt behind
    /// a 4K one waited up to 9 s on 2 cores).
    #[default]
    Oldest,
    /// The fewest prompt tokens left first, the oldest first among equals: a short prompt takes
    /// its chunk's turn at once, and the long one the rest of the budget and the turns after.
    /// While a prompt that fits one micro-batch is in its prefill, no micro-batch takes a chunk
    /// of a longer one (which would otherwise share the cores with it from the other
    /// micro-batch in flight). It orders the chunks, not the admission into the running set, so
    /// a long prompt waits at most for the shorter ones admitted beside it.
    Shortest,
}

/// A micro-batch ready for rank 0: the header every rank sees and rank 0's token ids.
#[derive(Debug)]
pub struct MicroBatch {
    pub forward: Forward,
    pub ids: Vec<u32>,
    /// The grammar masks being computed for the header: rank 0 runs its blocks first, then
    /// fills them in ([`PendingMasks::fill`]) before the header leaves.
    pub masks: Option<PendingMasks>,
}

/// Counters kept by the scheduler.
#[derive(Clone, Debug, Default)]
struct Counters {
    prompt_tokens: u64,
    generation_tokens: u64,
    finished_stop: u64,
    finished_length: u64,
    aborted: u64,
    failed: u64,
    preemptions: u64,
}

/// A micro-batch in the pipeline.
#[derive(Debug)]
struct Flight {
    members: Vec<u64>,
    /// The members that asked for a token: the last rank's answer must hold one for each, and
    /// nothing else.
    sampled: Vec<u64>,
    sent: std::time::Instant,
}

/// Why a rank's answer to a micro-batch cannot be taken: the pipeline is broken.
#[derive(Debug, thiserror::Error)]
pub enum BadAnswer {
    #[error("an answer to micro-batch {0}, which is not in flight")]
    NotInFlight(u64),
    #[error("micro-batch {batch}'s answer has tokens for {got:?}, not for {asked:?}")]
    WrongTokens {
        batch: u64,
        asked: Vec<u64>,
        got: Vec<u64>,
    },
}

/// The scheduler's state; the engine thread drives it (see `handle`).
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    tokenizer: Arc<Tokenizer>,
    stop_ids: Vec<u32>,
    pool: BlockPool,
    waiting: VecDeque<Sequence>,
    /// Running sequences, oldest first.
    running: Vec<Sequence>,
    /// Micro-batches in flight: their sequences, which of them asked for a token, and when.
    in_flight: HashMap<u64, Flight>,
    next_batch: u64,
    /// Sequences whose samplers and tables the ranks can forget.
    released: Vec<u64>,
    counters: Counters,
    /// Computes grammar masks beside the forward; `None`: before it, on this thread.
    masks: Option<MaskWorker>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, tokenizer: Arc<Tokenizer>) -> Self {
        let stop_ids = tokenizer.stop_ids();
        Self {
            pool: BlockPool::new(cfg.kv_blocks),
            cfg,
            tokenizer,
            stop_ids,
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: HashMap::new(),
            next_batch: 0,
            released: Vec::new(),
            counters: Counters::default(),
            masks: MaskWorker::start(),
        }
    }

    /// Computes every grammar mask on the engine thread as the batch is built, before the
    /// forward, instead of beside it (the same masks, later: for comparison).
    pub fn without_mask_overlap(mut self) -> Self {
        self.masks = None;
        self
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn kv_tokens(&self) -> usize {
        self.pool.n_blocks() * BLOCK_SIZE
    }

    pub fn kv_tokens_used(&self) -> usize {
        (self.pool.n_blocks() - self.pool.n_free()) * BLOCK_SIZE
    }

    pub fn n_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.in_flight.is_empty()
    }

    /// Queues a new sequence.
    pub fn add(&mut self, seq: Sequence) {
        // Counted once here, so a preempted request's recomputation does not count twice.
        self.counters.prompt_tokens += seq.n_prompt as u64;
        self.waiting.push_back(seq);
    }

    /// Sequence ids the ranks may forget, collected since the last call.
    pub fn take_released(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.released)
    }

    fn release(&mut self, mut seq: Sequence) {
        seq.table.release(&mut self.pool);
        self.released.push(seq.id);
    }

    /// Drops every sequence whose client went away, freeing its KV blocks at once.
    pub fn abort_disconnected(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].client_gone() {
                let seq = self.running.remove(i);
                self.counters.aborted += 1;
                self.release(seq);
            } else {
                i += 1;
            }
        }
        // A waiting sequence may have been preempted after sampling: the last rank still
        // keeps its sampler, so it is released like a running one.
        let (gone, waiting) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|s| s.client_gone());
        self.waiting = waiting;
        for seq in gone {
            self.counters.aborted += 1;
            self.release(seq);
        }
    }

    /// Fails every request (a rank went down); the ranks' state is gone with it.
    pub fn fail_all(&mut self, err: &EngineError) {
        for seq in self.running.drain(..).chain(self.waiting.drain(..)) {
            seq.fail(err.clone());
            self.counters.failed += 1;
        }
        self.pool = BlockPool::new(self.cfg.kv_blocks);
        self.in_flight.clear();
        self.released.clear();
    }

    /// Moves waiting sequences to running while there is room and KV for their prompts.
    /// The blocks a sequence admitted here will take are set aside as it is admitted, so two
    /// prompts are never let in against the same free blocks.
    fn admit(&mut self) {
        // Free, less what the running prompts still need for the rest of their prefill (a
        // chunk reserves only its own blocks: a long prompt admitted on an earlier call would
        // otherwise be counted free again, and the next one let in against its blocks).
        let owed: usize = self
            .running
            .iter()
            .map(|s| s.table.blocks_needed(s.tokens.len()))
            .sum();
        let mut free = self.pool.n_free().saturating_sub(owed);
        while self.running.len() < self.cfg.max_running {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            let need = seq.table.blocks_needed(seq.tokens.len());
            if need > free && !self.running.is_empty() {
                break; // new work waits for KV blocks
            }
            free = free.saturating_sub(need);
            let mut seq = self.waiting.pop_front().expect("front exists");
            seq.scheduled_at.get_or_insert_with(std::time::Instant::now);
            self.running.push(seq);
        }
    }

    /// Frees the blocks of the newest running sequence newer than `keep` that is not in flight,
    /// and sends it back to the waiting queue to be recomputed.
    fn preempt_newest(&mut self, keep: usize) -> bool {
        let victim = (keep + 1..self.running.len())
            .rev()
            .find(|&i| self.running[i].in_flight == 0);
        let Some(i) = victim else { return false };
        let mut seq = self.running.remove(i);
        // One that holds no blocks yet (admitted, not started) frees nothing: it goes back to
        // wait, and is not counted as preempted.
        if !seq.table.blocks().is_empty() {
            self.counters.preemptions += 1;
        }
        seq.table.release(&mut self.pool);
        seq.num_scheduled = 0;
        seq.awaiting_sample = false;
        self.waiting.push_front(seq);
        true
    }

    /// The ready running sequences a pass of [`Self::schedule`] takes, in its order: decodes
    /// (`decode`) oldest first; prefills as [`PrefillOrder`] says.
    fn pass_order(&self, decode: bool) -> Vec<u64> {
        let shortest = !decode && self.cfg.prefill_order == PrefillOrder::Shortest;
        let mut ready: Vec<(usize, usize, u64)> = self
            .running
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_ready() && (s.num_scheduled >= s.n_prompt) == decode)
            .map(|(i, s)| (if shortest { s.remaining() } else { 0 }, i, s.id))
            .collect();
        ready.sort_unstable();
        ready.into_iter().map(|(_, _, id)| id).collect()
    }

    /// With [`PrefillOrder::Shortest`], whether a prompt that fits one micro-batch's budget is
    /// in its prefill (its chunk to be scheduled, or in flight with no token back yet): while
    /// one is, no micro-batch takes a chunk of a longer prompt, so the short prompt's prefill
    /// has the cores to itself rather than beside a long chunk in the other micro-batch.
    fn short_prompt_prefilling(&self) -> bool {
        self.cfg.prefill_order == PrefillOrder::Shortest
            && self.running.iter().any(|s| {
                s.n_generated() == 0 && self.fits_one_batch(s) && (s.is_ready() || s.in_flight > 0)
            })
    }

    /// Whether all of `s` (its prompt, and what it generated before a preemption) fits one
    /// micro-batch's budget: a short prompt, for [`Self::short_prompt_prefilling`].
    fn fits_one_batch(&self, s: &Sequence) -> bool {
        s.tokens.len() <= self.cfg.max_batch_tokens
    }

    /// The most tokens a long prompt's chunk at position `pos` may take
    /// ([`SchedulerConfig::chunk_context_tokens`]).
    fn context_chunk(&self, pos: usize) -> usize {
        let (b, k) = (self.cfg.max_batch_tokens, self.cfg.chunk_context_tokens);
        if k == 0 {
            return b;
        }
        let c = (b as u128 * k as u128 / (k as u128 + pos as u128)) as usize;
        (c / BLOCK_SIZE * BLOCK_SIZE)
            .max(CONTEXT_CHUNK_FLOOR)
            .min(b)
    }

    /// Builds the next micro-batch, or `None` when nothing can run now.
    pub fn schedule(&mut self) -> Option<MicroBatch> {
        if self.in_flight.len() >= self.cfg.max_in_flight {
            return None;
        }
        self.admit();
        let n_decoding = self
            .running
            .iter()
            .filter(|s| s.num_scheduled >= s.n_prompt)
            .count();
        // Spread decoding sequences over the micro-batches in flight so every stage has work.
        let decode_cap = n_decoding.div_ceil(self.cfg.max_in_flight).max(1);
        let mut budget = self.cfg.max_batch_tokens;
        let (mut seqs, mut ids) = (Vec::new(), Vec::new());
        let mut mask_job = Vec::new();
        let mut n_decode = 0;
        // What long prompts' chunks may take of this batch: nothing while a short prompt is in
        // its prefill; while any request decodes, a short chunk, so that a decode step in this
        // batch or the next waits for no more (each rank computes its micro-batches one after
        // another).
        let mut long_budget = if self.short_prompt_prefilling() {
            0
        } else if n_decoding > 0 {
            self.cfg.decode_chunk_tokens
        } else {
            usize::MAX
        };
        // Decode steps first (one token each, oldest first), then prefill chunks.
        for pass in [true, false] {
            for id in self.pass_order(pass) {
                if budget == 0 {
                    break;
                }
                // Gone if an earlier chunk of this batch preempted it.
                let Some(i) = self.running.iter().position(|s| s.id == id) else {
                    continue;
                };
                let s = &self.running[i];
                if pass && n_decode >= decode_cap {
                    break;
                }
                let long = !pass && !self.fits_one_batch(s);
                if long && long_budget == 0 {
                    continue;
                }
                let mut chunk = s.remaining().min(budget);
                if long {
                    chunk = chunk
                        .min(long_budget)
                        .min(self.context_chunk(s.num_scheduled));
                }
                let end = s.num_scheduled + chunk;
                // Blocks for the chunk; preempt newer work if the pool is dry.
                let mut ok = self.running[i].table.reserve(&mut self.pool, end).is_ok();
                while !ok && self.preempt_newest(i) {
                    // Preemption removes an entry after `i` (newer), never before it.
                    ok = self.running[i].table.reserve(&mut self.pool, end).is_ok();
                }
                if !ok {
                    break;
                }
                let s = &mut self.running[i];
                let sample = end == s.tokens.len();
                ids.extend_from_slice(&s.tokens[s.num_scheduled..end]);
                let inline_mask = self.masks.is_none();
                let spec = sample.then(|| sample_spec(s, &self.stop_ids, inline_mask));
                if let (Some(c), true, false) = (s.constraint(), sample, inline_mask) {
                    mask_job.push((seqs.len(), s.id, c.clone()));
                }
                seqs.push(SeqChunk {
                    seq: s.id,
                    len: chunk as u32,
                    pos: s.num_scheduled as u32,
                    blocks: s.table.blocks().to_vec(),
                    sample: spec,
                });
                s.num_scheduled = end;
                s.awaiting_sample = sample;
                s.in_flight += 1;
                budget -= chunk;
                if long {
                    long_budget -= chunk;
                }
                n_decode += usize::from(pass);
            }
        }
        if seqs.is_empty() {
            return None;
        }
        let batch = self.next_batch;
        self.next_batch += 1;
        let flight = Flight {
            members: seqs.iter().map(|s| s.seq).collect(),
            sampled: seqs
                .iter()
                .filter(|s| s.sample.is_some())
                .map(|s| s.seq)
                .collect(),
            sent: std::time::Instant::now(),
        };
        self.in_flight.insert(batch, flight);
        let traceparent = seqs
            .iter()
            .find_map(|c| {
                self.running
                    .iter()
                    .find(|s| s.id == c.seq)
                    .and_then(|s| s.req.trace)
            })
            .map(|t| t.to_string());
        Some(MicroBatch {
            forward: Forward {
                batch,
                rows: ids.len() as u32,
                seqs,
                kv_blocks_used: (self.pool.n_blocks() - self.pool.n_free()) as u64,
                traceparent,
            },
            ids,
            masks: match &self.masks {
                Some(w) if !mask_job.is_empty() => Some(w.submit(mask_job)),
                _ => None,
            },
        })
    }

    /// How long the oldest micro-batch in the pipeline has been there.
    pub fn oldest_in_flight(&self) -> Option<std::time::Duration> {
        self.in_flight.values().map(|f| f.sent.elapsed()).max()
    }

    /// Takes a finished micro-batch's tokens. An answer to no batch in flight, or without a
    /// token for each sequence that asked (or with one for another), is a broken pipeline:
    /// taken as it was, the sequence left out waited for its token for good.
    pub fn complete(&mut self, sampled: Sampled) -> Result<(), BadAnswer> {
        let Some(flight) = self.in_flight.remove(&sampled.batch) else {
            return Err(BadAnswer::NotInFlight(sampled.batch));
        };
        let mut got: Vec<u64> = sampled.tokens.iter().map(|&(id, _)| id).collect();
        let mut asked = flight.sampled;
        got.sort_unstable();
        asked.sort_unstable();
        if got != asked {
            return Err(BadAnswer::WrongTokens {
                batch: sampled.batch,
                asked,
                got,
            });
        }
        for id in flight.members {
            if let Some(s) = self.running.iter_mut().find(|s| s.id == id) {
                s.in_flight = s.in_flight.saturating_sub(1);
            }
        }
        let mut logprobs: HashMap<u64, TokenLogprob> = sampled.logprobs.into_iter().collect();
        for (id, token) in sampled.tokens {
            let Some(i) = self.running.iter().position(|s| s.id == id) else {
                continue;
            };
            let is_stop = self.stop_ids.contains(&token);
            self.counters.generation_tokens += 1;
            let progress = self.running[i].push_token(token, is_stop, logprobs.remove(&id));
            match progress {
                Progress::Continue => {}
                Progress::Finished(reason) => self.finish(i, reason, false),
                Progress::StopString => self.finish(i, FinishReason::Stop, true),
                Progress::Aborted => {
                    let seq = self.running.remove(i);
                    self.counters.aborted += 1;
                    self.release(seq);
                }
                Progress::Failed => {
                    let seq = self.running.remove(i);
                    self.counters.failed += 1;
                    self.release(seq);
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self, i: usize, reason: FinishReason, stopped_by_string: bool) {
        let mut seq = self.running.remove(i);
        seq.finish(reason, stopped_by_string);
        match reason {
            FinishReason::Stop => self.counters.finished_stop += 1,
            FinishReason::Length => self.counters.finished_length += 1,
        }
        self.release(seq);
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        let c = &self.counters;
        MetricsSnapshot {
            num_requests_running: self.running.len(),
            num_requests_waiting: self.waiting.len(),
            kv_cache_usage: if self.pool.n_blocks() == 0 {
                0.0
            } else {
                1.0 - self.pool.n_free() as f64 / self.pool.n_blocks() as f64
            },
            prompt_tokens_total: c.prompt_tokens,
            generation_tokens_total: c.generation_tokens,
            requests_finished_stop: c.finished_stop,
            requests_finished_length: c.finished_length,
            requests_aborted: c.aborted,
            requests_failed: c.failed,
            preemptions_total: c.preemptions,
            ranks: Vec::new(),
        }
    }
}

/// How the last rank samples `s`'s next token; its grammar mask only with `with_mask` (else
/// the mask worker fills it in).
fn sample_spec(s: &Sequence, stop_ids: &[u32], with_mask: bool) -> SampleSpec {
    let allow = if with_mask { s.allowed() } else { None };
    let p = &s.req.sampling;
    let suppress = if s.req.ignore_eos || s.n_generated() < s.req.min_tokens {
        stop_ids.to_vec()
    } else {
        Vec::new()
    };
    let shaping = &s.req.shaping;
    SampleSpec {
        temperature: p.temperature,
        // Saturating: a k past u32 keeps every token, as any k past the vocabulary does.
        top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
        top_p: p.top_p,
        seed: s.seed,
        suppress,
        shaping: shaping.clone(),
        logprobs: s.req.logprobs.map(|n| n as u32),
        prompt: if shaping.repetitive() && s.n_generated() == 0 {
            s.tokens[..s.n_prompt].to_vec()
        } else {
            Vec::new()
        },
        allow,
    }
}
