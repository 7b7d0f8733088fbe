//! One request as the scheduler tracks it.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio::sync::mpsc::UnboundedSender;

use crate::api::{EngineError, GenerationEvent, GenerationRequest, Timings};
use crate::generate::{FinishReason, StopMatcher, TokenLogprob};
use crate::kv::BlockTable;
use crate::model::detok::StreamDecoder;
use crate::model::tokenizer::Tokenizer;
use crate::trace::AttrValue;
use crate::transport::message::TokenMask;

use super::masks::{self, SharedConstraint};

/// A request and its progress. Its tokens are the prompt followed by what was generated;
/// `num_scheduled` of them have been sent into the pipeline (their KV is computed or being
/// computed), as vLLM's `num_computed_tokens` catches up with `num_tokens`.
#[derive(Debug)]
pub struct Sequence {
    pub id: u64,
    pub tokens: Vec<u32>,
    pub n_prompt: usize,
    pub num_scheduled: usize,
    /// A micro-batch will bring this sequence's next token.
    pub awaiting_sample: bool,
    /// Micro-batches in the pipeline that hold rows of this sequence.
    pub in_flight: u32,
    pub table: BlockTable,
    pub req: GenerationRequest,
    /// The seed its sampler uses on the last rank (the request's, or one picked at arrival).
    pub seed: u64,
    /// The request's grammar (taken out of `req`), shared with the mask worker.
    constraint: Option<SharedConstraint>,
    decoder: StreamDecoder,
    stops: StopMatcher,
    tx: UnboundedSender<GenerationEvent>,
    pub arrival: Instant,
    /// Wall-clock time of arrival, for the spans.
    arrival_wall: SystemTime,
    pub scheduled_at: Option<Instant>,
    pub first_token_at: Option<Instant>,
}

/// What a new token did to its sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    Continue,
    Finished(FinishReason),
    /// A stop string ended it (the text after it is dropped).
    StopString,
    /// The client is gone.
    Aborted,
    /// It failed (its grammar did); the client has been told.
    Failed,
}

impl Sequence {
    pub fn new(
        id: u64,
        mut req: GenerationRequest,
        seed: u64,
        tokenizer: Arc<Tokenizer>,
        tx: UnboundedSender<GenerationEvent>,
    ) -> Self {
        let stops = StopMatcher::new(req.stop.clone());
        let constraint = req.constraint.take().map(masks::share);
        Self {
            id,
            tokens: req.prompt.clone(),
            n_prompt: req.prompt.len(),
            num_scheduled: 0,
            awaiting_sample: false,
            in_flight: 0,
            table: BlockTable::new(),
            req,
            seed,
            constraint,
            decoder: StreamDecoder::new(tokenizer),
            stops,
            tx,
            arrival: Instant::now(),
            arrival_wall: SystemTime::now(),
            scheduled_at: None,
            first_token_at: None,
        }
    }

    pub fn n_generated(&self) -> usize {
        self.tokens.len() - self.n_prompt
    }

    /// Tokens not yet sent into the pipeline.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.num_scheduled
    }

    /// Ready for another chunk: something left to compute and no sample pending.
    pub fn is_ready(&self) -> bool {
        !self.awaiting_sample && self.remaining() > 0
    }

    /// The tokens the sequence's grammar allows next, if it has one.
    pub fn allowed(&self) -> Option<TokenMask> {
        masks::mask_of(self.id, self.constraint.as_ref()?)
    }

    /// The sequence's grammar, if it has one.
    pub fn constraint(&self) -> Option<&SharedConstraint> {
        self.constraint.as_ref()
    }

    pub fn client_gone(&self) -> bool {
        self.tx.is_closed()
    }

    /// Takes a sampled token: emits its text, and says whether the sequence is done.
    pub fn push_token(
        &mut self,
        id: u32,
        is_stop: bool,
        logprob: Option<TokenLogprob>,
    ) -> Progress {
        self.awaiting_sample = false;
        self.first_token_at.get_or_insert_with(Instant::now);
        self.tokens.push(id);
        // The end-of-turn token is not reported, with or without its log-probability (OpenAI's
        // content logprobs cover the content only).
        if is_stop && !self.req.ignore_eos {
            return Progress::Finished(FinishReason::Stop);
        }
        // The grammar first: a token it refuses (or one sampled without its mask) is never
        // sent, and the request fails rather than end as if complete with output that breaks
        // its schema.
        let mut complete = false;
        if let Some(c) = &self.constraint {
            match masks::consume(c, id) {
                Ok(done) => complete = done,
                Err(e) => {
                    tracing::warn!(seq = self.id, "the grammar failed: {e}");
                    self.fail(EngineError::Internal(format!(
                        "the output grammar failed: {e}"
                    )));
                    return Progress::Failed;
                }
            }
        }
        let mut text = String::new();
        let mut hit = false;
        if let Some(piece) = self.decoder.push(id) {
            (text, hit) = self.stop_text(&piece);
        }
        let event = GenerationEvent::Token { id, text, logprob };
        if self.tx.send(event).is_err() {
            return Progress::Aborted;
        }
        if hit {
            Progress::StopString
        } else if complete {
            // The grammar is complete: nothing but the end could follow.
            Progress::Finished(FinishReason::Stop)
        } else if self.n_generated() >= self.req.max_tokens {
            Progress::Finished(FinishReason::Length)
        } else {
            Progress::Continue
        }
    }

    /// Feeds decoded text to the stop strings: the text safe to send, and whether a stop
    /// string ended the output. As in vLLM, no stop string ends it before `min_tokens` tokens:
    /// a match completed earlier is ignored, its text sent, and what follows it held back only
    /// while it may begin another match.
    fn stop_text(&mut self, piece: &str) -> (String, bool) {
        if self.n_generated() >= self.req.min_tokens {
            return self.stops.push(piece);
        }
        let before = self.stops.clone();
        let (text, hit) = self.stops.push(piece);
        if !hit {
            return (text, false);
        }
        // Everything up to just inside the last match of any stop string is released; no stop
        // string is whole in the rest, which the matcher takes as if nothing had matched.
        self.stops = before;
        let all = self.stops.finish() + piece;
        let cut = self
            .req
            .stop
            .iter()
            .filter_map(|s| {
                let first = s.chars().next()?.len_utf8();
                all.rfind(s.as_str()).map(|at| at + first)
            })
            .max()
            .unwrap_or(0);
        let (rest, _) = self.stops.push(&all[cut..]);
        (all[..cut].to_owned() + &rest, false)
    }

    /// Sends the final event (with any text still held back, unless a stop string cut it).
    pub fn finish(&mut self, reason: FinishReason, stopped_by_string: bool) {
        let mut text = String::new();
        if !stopped_by_string {
            let last = self.decoder.flush();
            let (rest, _) = self.stop_text(&last);
            text = rest + &self.stops.finish();
        }
        let now = Instant::now();
        let scheduled = self.scheduled_at.unwrap_or(now);
        let first = self.first_token_at.unwrap_or(now);
        let timings = Timings {
            queue: scheduled - self.arrival,
            prefill: first.saturating_duration_since(scheduled),
            decode: now.saturating_duration_since(first),
        };
        self.record_spans(
            now,
            &[("gen_ai.response.finish_reasons", reason.as_str().into())],
        );
        let _ = self.tx.send(GenerationEvent::Finished {
            text,
            reason,
            prompt_tokens: self.n_prompt,
            completion_tokens: self.n_generated(),
            timings,
        });
    }

    pub fn fail(&self, err: crate::api::EngineError) {
        self.record_spans(Instant::now(), &[("error.type", err.to_string().into())]);
        let _ = self.tx.send(GenerationEvent::Failed(err));
    }

    /// Records `engine.request` (a child of the caller's span, in the caller's trace) with
    /// `engine.prefill` (first scheduled → first token) and `engine.decode` (first token → end).
    fn record_spans(&self, end: Instant, extra: &[(&'static str, AttrValue)]) {
        use crate::trace::{new_id, record, SpanKind, SpanRecord};
        let wall = |t: Instant| self.arrival_wall + t.saturating_duration_since(self.arrival);
        let (trace_id, parent_id) = match self.req.trace {
            Some(t) => (t.trace_id, Some(t.parent_id)),
            None => (new_id::<16>(), None),
        };
        let request_id = new_id::<8>();
        let mut attributes = vec![
            ("gen_ai.usage.input_tokens", self.n_prompt.into()),
            ("gen_ai.usage.output_tokens", self.n_generated().into()),
            ("gen_ai.request.max_tokens", self.req.max_tokens.into()),
        ];
        if let Some(s) = self.scheduled_at {
            attributes.push((
                "gen_ai.latency.time_in_queue",
                (s - self.arrival).as_secs_f64().into(),
            ));
        }
        attributes.extend(extra.iter().cloned());
        let span = |name, kind, span_id, parent_id, start, end, attributes| SpanRecord {
            name,
            kind,
            trace_id,
            span_id,
            parent_id,
            start: wall(start),
            end: wall(end),
            attributes,
        };
        record(span(
            "engine.request",
            SpanKind::Server,
            request_id,
            parent_id,
            self.arrival,
            end,
            attributes,
        ));
        if let Some(s) = self.scheduled_at {
            let first = self.first_token_at.unwrap_or(end);
            record(span(
                "engine.prefill",
                SpanKind::Internal,
                new_id(),
                Some(request_id),
                s,
                first,
                vec![],
            ));
            if self.first_token_at.is_some() {
                record(span(
                    "engine.decode",
                    SpanKind::Internal,
                    new_id(),
                    Some(request_id),
                    first,
                    end,
                    vec![],
                ));
            }
        }
    }
}
