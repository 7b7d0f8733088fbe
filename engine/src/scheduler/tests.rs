//! The scheduler and engine thread over the tiny model in process: continuous batching,
//! chunked prefill and preemption change no output, and the KV pool always comes back.

use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use super::{EngineConfig, EngineHandle, Scheduler, SchedulerConfig};
use crate::api::{Engine, EngineError, GenerationEvent, GenerationRequest};
use crate::backend::cpu::CpuBackend;
use crate::generate::{
    generate, FinishReason, GenerateParams, GrammarSpec, Grammars, SamplingParams,
};
use crate::model::chat::ChatTemplate;
use crate::model::tiny::{tiny_gguf, TINY};
use crate::model::tokenizer::test_support::toy_tokenizer;
use crate::model::{Llama, ModelPart};
use crate::pipeline::{LocalDriver, Stage};

fn model() -> Llama<CpuBackend> {
    Llama::load(
        Arc::new(tiny_gguf(5)),
        Arc::new(CpuBackend::new(2)),
        ModelPart::full(TINY.layers),
    )
    .unwrap()
}

fn engine(max_running: usize, max_batch_tokens: usize, kv_blocks: usize) -> Arc<EngineHandle> {
    engine_with(max_running, max_batch_tokens, kv_blocks, true)
}

/// `engine`, with the grammar masks computed beside the forward (`overlap_masks`) or before it.
fn engine_with(
    max_running: usize,
    max_batch_tokens: usize,
    kv_blocks: usize,
    overlap_masks: bool,
) -> Arc<EngineHandle> {
    let tokenizer = Arc::new(toy_tokenizer());
    let cfg = SchedulerConfig {
        max_running,
        max_batch_tokens,
        max_in_flight: 1,
        kv_blocks,
        prefill_order: Default::default(),
        // Long prompts go 3 tokens at a time beside decodes, `max_batch_tokens` otherwise: the
        // outputs compared with solo runs then come from chunks of changing, uneven sizes.
        decode_chunk_tokens: 3,
        chunk_context_tokens: 0,
    };
    let inbox = channel();
    let stage = Stage::new(model(), kv_blocks).unwrap();
    let driver = LocalDriver::new(stage, inbox.0.clone());
    let template = ChatTemplate::new("{{ messages[0]['content'] }}", "", "").unwrap();
    let ecfg = EngineConfig {
        model_id: "tiny".into(),
        context_window: TINY.ctx,
        defaults: Default::default(),
        step_timeout: std::time::Duration::from_secs(300),
    };
    let scheduler = Scheduler::new(cfg, tokenizer);
    let scheduler = if overlap_masks {
        scheduler
    } else {
        scheduler.without_mask_overlap()
    };
    EngineHandle::start(ecfg, scheduler, driver, template, inbox).unwrap()
}

fn request(salt: u32, len: usize, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: (0..len as u32)
            .map(|i| 3 + (i * 7 + salt * 13) % 260)
            .collect(),
        max_tokens,
        min_tokens: 0,
        ignore_eos: false,
        sampling: SamplingParams::default(),
        shaping: Default::default(),
        logprobs: None,
        constraint: None,
        stop: Vec::new(),
        trace: None,
    }
}

/// Greedy tokens of `req` through the single-sequence path (no scheduler), without a final
/// end-of-turn token (the engine counts it but sends no text event for it), and why it ended.
fn solo(req: &GenerationRequest) -> (Vec<u32>, FinishReason) {
    let tok = Arc::new(toy_tokenizer());
    let params = GenerateParams {
        max_tokens: req.max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
    };
    let g = generate(&model(), &tok, &req.prompt, &params, |_| {}).unwrap();
    let mut ids = g.tokens;
    if g.finish == FinishReason::Stop {
        ids.pop();
    }
    (ids, g.finish)
}

async fn collect(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>,
) -> (Vec<u32>, FinishReason, usize) {
    let mut ids = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenerationEvent::Token { id, .. } => ids.push(id),
            GenerationEvent::Finished {
                reason,
                completion_tokens,
                ..
            } => return (ids, reason, completion_tokens),
            GenerationEvent::Failed(e) => panic!("request failed: {e}"),
        }
    }
    panic!("the stream ended without Finished");
}

async fn wait_kv_free(e: &EngineHandle) {
    for _ in 0..200 {
        let h = e.health();
        if h.ranks[0].kv_tokens_used == 0 && e.metrics().num_requests_running == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("KV blocks were not returned: {:?}", e.health());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_match_solo_runs() {
    let reqs: Vec<_> = (0..8).map(|i| request(i, 5 + 3 * i as usize, 12)).collect();
    let want: Vec<_> = reqs.iter().map(solo).collect();
    let e = engine(8, 64, 64);
    let rxs: Vec<_> = reqs.iter().map(|r| e.submit(r.clone()).unwrap()).collect();
    for (i, rx) in rxs.into_iter().enumerate() {
        let (ids, reason, n) = collect(rx).await;
        assert_eq!((&ids, reason), (&want[i].0, want[i].1), "request {i}");
        assert_eq!(n, ids.len() + usize::from(reason == FinishReason::Stop));
    }
    wait_kv_free(&e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_prefill_and_preemption_change_nothing() {
    // Chunks of 8 tokens, 3 running at once, a pool of 8 blocks.
    // Two 40-token prompts fit the 8-block pool (3 blocks each); growing to 80 tokens (5 blocks
    // each) cannot, so the newer one is preempted and recomputed.
    let reqs: Vec<_> = (0..4).map(|i| request(10 + i, 40, 40)).collect();
    let want: Vec<_> = reqs.iter().map(solo).collect();
    // The engine thread steps while the test submits: a test thread starved between two
    // submissions (once in CI, on 2 cores beside the other tests) lets the first request
    // finish before the next arrives, and then nothing overlaps to preempt. Every run must
    // match the solo runs; one of five must have preempted.
    for _ in 0..5 {
        let e = engine(3, 8, 8);
        let rxs: Vec<_> = reqs.iter().map(|r| e.submit(r.clone()).unwrap()).collect();
        for (i, rx) in rxs.into_iter().enumerate() {
            let (ids, reason, _) = collect(rx).await;
            assert_eq!((&ids, reason), (&want[i].0, want[i].1), "request {i}");
        }
        wait_kv_free(&e).await;
        if e.metrics().preemptions_total > 0 {
            return;
        }
    }
    panic!("the pool was small enough to force preemption, yet no run of five preempted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_requests_free_their_blocks() {
    let e = engine(4, 64, 64);
    let rxs: Vec<_> = (0..4)
        .map(|i| {
            e.submit(GenerationRequest {
                ignore_eos: true,
                ..request(20 + i, 20, 200)
            })
            .unwrap()
        })
        .collect();
    // Let each start, then hang up on it. Tokens queue in the stream whether or not it is read,
    // so on a busy machine a request can finish all its tokens before the test reads its first
    // (seen: 3 of 4 aborted): those that did are told apart by the events already queued.
    let mut finished = 0;
    for mut rx in rxs {
        assert!(matches!(
            rx.recv().await,
            Some(GenerationEvent::Token { .. })
        ));
        assert!(e.health().ranks[0].kv_tokens_used > 0);
        while let Ok(ev) = rx.try_recv() {
            finished += matches!(ev, GenerationEvent::Finished { .. }) as u64;
        }
        drop(rx);
    }
    wait_kv_free(&e).await;
    assert!(finished < 4, "every request finished before its hang-up");
    assert_eq!(e.metrics().requests_aborted, 4 - finished);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_tokens_min_tokens_and_the_context_window() {
    let e = engine(4, 64, 64);
    // The context window is refused before any work, and so is a `max_tokens` so large that
    // prompt + max_tokens would wrap below the window (it would otherwise run until the pool
    // is full and stall every other request).
    for max_tokens in [100, usize::MAX, usize::MAX - 199] {
        let err = e.submit(request(1, 200, max_tokens)).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::Invalid {
                    code: "context_length_exceeded",
                    ..
                }
            ),
            "{max_tokens}: {err:?}"
        );
    }
    // min_tokens suppresses end-of-turn tokens: with every stop id suppressed for 10 tokens the
    // request runs to at least 10.
    let mut r = request(3, 6, 10);
    r.ignore_eos = false;
    r.min_tokens = 10;
    let (ids, reason, _) = collect(e.submit(r).unwrap()).await;
    assert_eq!((ids.len(), reason), (10, FinishReason::Length));
    assert!(ids.iter().all(|t| !e.tokenizer().is_stop(*t)), "{ids:?}");
}

/// A `top_k` past u32 keeps every token, as top_k 0 does; it used to wrap (2³² + 1 became 1,
/// greedy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_k_past_u32_samples_like_no_top_k() {
    let e = engine(4, 64, 64);
    let sampled = |top_k: usize| {
        let mut r = request(5, 8, 24);
        r.ignore_eos = true;
        r.sampling.temperature = 1.5;
        r.sampling.top_k = top_k;
        r.sampling.seed = Some(7);
        r
    };
    let (none, _, _) = collect(e.submit(sampled(0)).unwrap()).await;
    let (huge, _, _) = collect(e.submit(sampled((1usize << 32) + 1)).unwrap()).await;
    let (one, _, _) = collect(e.submit(sampled(1)).unwrap()).await;
    assert_eq!(huge, none);
    assert_ne!(
        huge, one,
        "top_k 1 is greedy: a hot seeded sample differs from it"
    );
}

/// Each of `reqs`' tokens, through an engine whose grammar masks are computed beside the
/// forward (`overlap`) or before it on the engine thread.
async fn constrained_tokens(reqs: &[GenerationRequest], overlap: bool) -> Vec<Vec<u32>> {
    let e = engine_with(4, 64, 64, overlap);
    let rxs: Vec<_> = reqs.iter().map(|r| e.submit(r.clone()).unwrap()).collect();
    let mut out = Vec::new();
    for rx in rxs {
        out.push(collect(rx).await.0);
    }
    wait_kv_free(&e).await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammar_masks_beside_the_forward_change_no_output() {
    let tok = Arc::new(toy_tokenizer());
    let eos = tok.token_id("<|im_end|>").unwrap();
    let grammars = Grammars::new(tok.clone(), eos).unwrap();
    let schema = GrammarSpec::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "tags": {"type": "array", "items": {"enum": ["hello", "world"]}, "maxItems": 3},
            "n": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": ["name", "tags", "n"]
    }));
    // Sampled (the seeds fixed), four at once, so that masks of several sequences share a batch.
    let reqs: Vec<_> = (0..4u32)
        .map(|i| GenerationRequest {
            constraint: Some(grammars.compile(&schema).unwrap()),
            sampling: SamplingParams {
                temperature: 1.0,
                seed: Some(u64::from(i)),
                ..SamplingParams::default()
            },
            ..request(50 + i, 6 + i as usize, 48)
        })
        .collect();
    let before = constrained_tokens(&reqs, false).await;
    let beside = constrained_tokens(&reqs, true).await;
    assert_eq!(before, beside);
    // The grammar held: each output is a prefix of the schema's JSON, unlike the same requests'
    // output without it.
    for ids in &beside {
        let text = tok.decode(ids, true).unwrap();
        assert!(text.starts_with('{'), "{text:?}");
    }
    let free: Vec<_> = reqs
        .iter()
        .map(|r| GenerationRequest {
            constraint: None,
            ..r.clone()
        })
        .collect();
    assert_ne!(constrained_tokens(&free, true).await, beside);
}

/// Collects every span recorded in this test process.
struct Collect(std::sync::Mutex<Vec<crate::trace::SpanRecord>>);

impl crate::trace::SpanSink for Collect {
    fn record(&self, span: crate::trace::SpanRecord) {
        self.0.lock().unwrap().push(span);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_spans_join_the_callers_trace() {
    static SINK: std::sync::OnceLock<Arc<Collect>> = std::sync::OnceLock::new();
    let sink = SINK
        .get_or_init(|| Arc::new(Collect(Default::default())))
        .clone();
    // Only the first call installs it; this test is the only one that sets a sink.
    crate::trace::set_sink(sink.clone());
    let caller = crate::trace::TraceContext::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    .unwrap();
    let e = engine(2, 64, 64);
    let r = GenerationRequest {
        trace: Some(caller),
        ignore_eos: true,
        ..request(40, 8, 5)
    };
    collect(e.submit(r).unwrap()).await;
    let spans: Vec<_> = sink
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.trace_id == caller.trace_id)
        .cloned()
        .collect();
    let by = |n: &str| {
        spans
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("no {n} span in {spans:?}"))
    };
    let (req, pre, dec) = (
        by("engine.request"),
        by("engine.prefill"),
        by("engine.decode"),
    );
    assert_eq!(
        req.parent_id,
        Some(caller.parent_id),
        "engine.request is a child of the caller's span"
    );
    assert_eq!(
        (pre.parent_id, dec.parent_id),
        (Some(req.span_id), Some(req.span_id))
    );
    assert!(req.start <= pre.start && pre.end <= dec.start && dec.end <= req.end);
    assert!(
        req.attributes.contains(&(
            "gen_ai.usage.output_tokens",
            crate::trace::AttrValue::Int(5)
        )),
        "{:?}",
        req.attributes
    );
}

#[test]
fn a_waiting_request_whose_client_left_is_released_on_every_rank() {
    // A waiting sequence may have sampled before it was preempted: the last rank keeps its
    // sampler until the sequence is released, so one that leaves from the queue is too.
    let cfg = SchedulerConfig {
        max_running: 1,
        max_batch_tokens: 64,
        max_in_flight: 1,
        kv_blocks: 16,
        prefill_order: Default::default(),
        decode_chunk_tokens: usize::MAX,
        chunk_context_tokens: 0,
    };
    let tokenizer = Arc::new(toy_tokenizer());
    let mut sched = Scheduler::new(cfg, tokenizer.clone());
    let (stay_tx, _stay_rx) = tokio::sync::mpsc::unbounded_channel();
    let (gone_tx, gone_rx) = tokio::sync::mpsc::unbounded_channel();
    sched.add(super::Sequence::new(
        1,
        request(1, 8, 4),
        0,
        tokenizer.clone(),
        stay_tx,
    ));
    sched.add(super::Sequence::new(
        2,
        request(2, 8, 4),
        0,
        tokenizer,
        gone_tx,
    ));
    drop(gone_rx);
    sched.abort_disconnected();
    assert_eq!(sched.take_released(), vec![2]);
    assert_eq!(sched.metrics().requests_aborted, 1);
    assert!(!sched.is_idle(), "the other one still waits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_window_is_no_larger_than_the_kv_pool() {
    // TINY's window is 256 tokens; a pool of 8 blocks holds 128.
    let e = engine(2, 64, 8);
    let pool = 8 * crate::kv::BLOCK_SIZE;
    assert_eq!(e.context_window(), pool);
    let err = e.submit(request(1, 8, pool - 7)).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Invalid {
                code: "context_length_exceeded",
                ..
            }
        ),
        "{err:?}"
    );
    let (_, _, n) = collect(e.submit(request(1, 8, 3)).unwrap()).await;
    assert!(n <= 3);
}

/// A sequence over the toy tokenizer, its events, and the tokenizer.
fn sequence(
    req: GenerationRequest,
) -> (
    super::Sequence,
    tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>,
    Arc<crate::model::tokenizer::Tokenizer>,
) {
    let tok = Arc::new(toy_tokenizer());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (super::Sequence::new(1, req, 0, tok.clone(), tx), rx, tok)
}

fn events(rx: &mut tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>) -> Vec<GenerationEvent> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[test]
fn a_grammar_that_fails_fails_the_request_and_sends_no_refused_token() {
    use super::Progress;
    let tok = Arc::new(toy_tokenizer());
    let eos = tok.token_id("<|im_end|>").unwrap();
    let grammars = Grammars::new(tok.clone(), eos).unwrap();
    let choice = GrammarSpec::Regex("yes".into());
    let constrained = || GenerationRequest {
        constraint: Some(grammars.compile(&choice).unwrap()),
        ..request(1, 4, 16)
    };
    let refused = tok.encode("q", false).unwrap()[0];
    // A sampled token the grammar refuses: the request fails, and the token is not sent.
    let (mut seq, mut rx, _) = sequence(constrained());
    assert_eq!(seq.push_token(refused, false, None), Progress::Failed);
    let got = events(&mut rx);
    assert!(
        matches!(
            got.as_slice(),
            [GenerationEvent::Failed(EngineError::Internal(_))]
        ),
        "{got:?}"
    );
    // A mask that cannot be computed (the grammar is in error): the token sampled without it
    // is not sent either.
    let (mut seq, mut rx, _) = sequence(constrained());
    assert!(super::masks::consume(seq.constraint().unwrap(), refused).is_err());
    let _ = seq.allowed();
    let yes = tok.encode("yes", false).unwrap()[0];
    assert_eq!(seq.push_token(yes, false, None), Progress::Failed);
    let got = events(&mut rx);
    assert!(
        matches!(got.as_slice(), [GenerationEvent::Failed(EngineError::Internal(m))] if m.contains("no mask")),
        "{got:?}"
    );
}

/// Pushes `text`'s tokens; the text sent, and the progress after each token.
fn push_text(
    seq: &mut super::Sequence,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<GenerationEvent>,
    tok: &crate::model::tokenizer::Tokenizer,
    text: &str,
) -> (String, Vec<super::Progress>) {
    let progress = tok
        .encode(text, false)
        .unwrap()
        .into_iter()
        .map(|id| seq.push_token(id, false, None))
        .collect();
    let sent = events(rx)
        .into_iter()
        .map(|e| match e {
            GenerationEvent::Token { text, .. } => text,
            other => panic!("{other:?}"),
        })
        .collect();
    (sent, progress)
}

#[test]
fn stop_strings_wait_for_min_tokens() {
    use super::Progress;
    let tok = Arc::new(toy_tokenizer());
    let n = |s: &str| tok.encode(s, false).unwrap().len();
    // "END" is complete within the first `n("aEND")` tokens: too early to stop.
    let req = |min_tokens| GenerationRequest {
        stop: vec!["END".into()],
        min_tokens,
        ..request(1, 4, 64)
    };
    let (mut seq, mut rx, tok) = sequence(req(n("aEND") + 1));
    let (sent, progress) = push_text(&mut seq, &mut rx, &tok, "aEND");
    assert!(progress.iter().all(|p| *p == Progress::Continue));
    assert_eq!(sent, "aEND", "an ignored stop string is released");
    // After min_tokens a stop string stops, even one that began before it.
    let (sent, progress) = push_text(&mut seq, &mut rx, &tok, "bEN");
    assert_eq!(
        (sent.as_str(), progress.last()),
        ("b", Some(&Progress::Continue))
    );
    let (sent, progress) = push_text(&mut seq, &mut rx, &tok, "D");
    assert_eq!(
        (sent.as_str(), progress.last()),
        ("", Some(&Progress::StopString))
    );
    // Text after an ignored stop that may begin another stays held back until it is known.
    let (mut seq, mut rx, tok) = sequence(req(64));
    let (sent, _) = push_text(&mut seq, &mut rx, &tok, "xENDE");
    assert_eq!(sent, "xEND");
    let (sent, _) = push_text(&mut seq, &mut rx, &tok, "Ny");
    assert_eq!(sent, "ENy");
    // At min_tokens itself a stop string stops (vLLM checks from the min_tokens-th token on).
    let (mut seq, mut rx, tok) = sequence(req(n("aEND")));
    let (sent, progress) = push_text(&mut seq, &mut rx, &tok, "aEND");
    assert_eq!(
        (sent.as_str(), progress.last()),
        ("a", Some(&Progress::StopString))
    );
}

/// Sequence `id` of a `len`-token prompt and 4 output tokens, its events dropped.
fn quiet_sequence(
    tokenizer: &Arc<crate::model::tokenizer::Tokenizer>,
    id: u64,
    len: usize,
) -> super::Sequence {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::mem::forget(rx);
    super::Sequence::new(id, request(id as u32, len, 4), 0, tokenizer.clone(), tx)
}

/// A micro-batch's answer from the last rank: token 5 for each member that asked for one.
fn answer(mb: &super::MicroBatch) -> crate::transport::message::Sampled {
    crate::transport::message::Sampled {
        batch: mb.forward.batch,
        tokens: (mb.forward.seqs.iter())
            .filter(|c| c.sample.is_some())
            .map(|c| (c.seq, 5))
            .collect(),
        logprobs: Vec::new(),
    }
}

/// A 10-block pool with Z running on 1 and two 8-block prompts waiting, scheduled in chunks of
/// `max_batch_tokens` for `calls` calls after Z's: the scheduler's metrics then.
fn two_long_prompts_behind_a_short_one(
    max_batch_tokens: usize,
    calls: usize,
) -> crate::api::MetricsSnapshot {
    let cfg = SchedulerConfig {
        max_running: 4,
        max_batch_tokens,
        max_in_flight: 3,
        kv_blocks: 10,
        prefill_order: Default::default(),
        decode_chunk_tokens: usize::MAX,
        chunk_context_tokens: 0,
    };
    let tokenizer = Arc::new(toy_tokenizer());
    let mut sched = Scheduler::new(cfg, tokenizer.clone());
    let seq = |id: u64, len: usize| quiet_sequence(&tokenizer, id, len);
    sched.add(seq(1, 8));
    assert!(sched.schedule().is_some(), "Z's prefill");
    sched.add(seq(2, 8 * crate::kv::BLOCK_SIZE));
    sched.add(seq(3, 8 * crate::kv::BLOCK_SIZE));
    for call in 0..calls {
        assert!(sched.schedule().is_some(), "chunk {call}");
    }
    sched.metrics()
}

#[test]
fn a_short_prompt_is_prefilled_ahead_of_a_long_one_already_prefilling() {
    let cfg = SchedulerConfig {
        max_running: 4,
        max_batch_tokens: 32,
        max_in_flight: 3,
        kv_blocks: 64,
        prefill_order: super::PrefillOrder::Shortest,
        decode_chunk_tokens: usize::MAX,
        chunk_context_tokens: 0,
    };
    let tokenizer = Arc::new(toy_tokenizer());
    let mut sched = Scheduler::new(cfg, tokenizer.clone());
    let seq = |id: u64, len: usize| quiet_sequence(&tokenizer, id, len);
    let chunks_of = |mb: &super::MicroBatch| -> Vec<(u64, u32)> {
        mb.forward.seqs.iter().map(|c| (c.seq, c.len)).collect()
    };
    sched.add(seq(1, 200));
    let first = sched.schedule().expect("a chunk");
    assert_eq!(chunks_of(&first), [(1, 32)]);
    // The short prompt arrives while the long one prefills: all of it, and no chunk of the
    // long one beside it, in this micro-batch or the next, until its token is back.
    sched.add(seq(2, 10));
    let short = sched.schedule().expect("a batch");
    assert_eq!(chunks_of(&short), [(2, 10)]);
    assert!(sched.schedule().is_none(), "the long prompt waits");
    // Two more arrive: both short, the shorter first; the long one still waits.
    sched.add(seq(3, 12));
    sched.add(seq(4, 5));
    let shorter = sched.schedule().expect("a batch");
    assert_eq!(chunks_of(&shorter), [(4, 5), (3, 12)]);
    // Their tokens back, the long prompt goes on beside their decode steps.
    for mb in [first, short, shorter] {
        sched.complete(answer(&mb)).expect("the tokens asked for");
    }
    // (One decode step a micro-batch: three decoding over three micro-batches in flight.)
    let next = chunks_of(&sched.schedule().expect("a batch"));
    assert_eq!(next, [(2, 1), (1, 31)]);
}

#[test]
fn a_batch_carrying_decode_steps_takes_a_short_chunk_of_a_long_prompt() {
    let cfg = SchedulerConfig {
        max_running: 4,
        max_batch_tokens: 32,
        max_in_flight: 1,
        kv_blocks: 64,
        prefill_order: Default::default(),
        decode_chunk_tokens: 8,
        chunk_context_tokens: 0,
    };
    let tokenizer = Arc::new(toy_tokenizer());
    let mut sched = Scheduler::new(cfg, tokenizer.clone());
    let seq = |id: u64, len: usize| quiet_sequence(&tokenizer, id, len);
    let step = |sched: &mut Scheduler| -> Vec<(u64, u32)> {
        let mb = sched.schedule().expect("a batch");
        let chunks = mb.forward.seqs.iter().map(|c| (c.seq, c.len)).collect();
        sched.complete(answer(&mb)).expect("the tokens asked for");
        chunks
    };
    sched.add(seq(1, 10));
    assert_eq!(step(&mut sched), [(1, 10)]);
    // Two long prompts arrive while 1 decodes: together they take 8 tokens of each batch.
    sched.add(seq(2, 100));
    sched.add(seq(3, 100));
    assert_eq!(step(&mut sched), [(1, 1), (2, 8)]);
    // A prompt that fits one batch still goes whole beside the decode step.
    sched.add(seq(4, 20));
    assert_eq!(step(&mut sched), [(1, 1), (2, 8), (4, 20)]);
    assert_eq!(step(&mut sched), [(1, 1), (4, 1), (2, 8)]);
    // 1 has its 4 tokens; 4 decodes on, so the long prompts still go 8 at a time.
    assert_eq!(step(&mut sched), [(4, 1), (2, 8)]);
    assert_eq!(step(&mut sched), [(4, 1), (2, 8)]);
    // With nothing decoding, the long prompts take the whole budget again.
    assert_eq!(step(&mut sched), [(2, 32)]);
}

#[test]
fn a_long_prompt_s_chunks_shrink_as_its_context_grows() {
    let cfg = SchedulerConfig {
        max_running: 2,
        max_batch_tokens: 512,
        max_in_flight: 1,
        kv_blocks: 1024,
        prefill_order: Default::default(),
        decode_chunk_tokens: 16,
        chunk_context_tokens: 1024,
    };
    let tokenizer = Arc::new(toy_tokenizer());
    let mut sched = Scheduler::new(cfg, tokenizer.clone());
    sched.add(quiet_sequence(&tokenizer, 1, 6000));
    let mut chunks = Vec::new();
    while let Some(mb) = sched.schedule() {
        let c = &mb.forward.seqs[0];
        chunks.push((c.pos, c.len));
        sched.complete(answer(&mb)).expect("the tokens asked for");
        if chunks
            .last()
            .is_some_and(|&(pos, len)| (pos + len) as usize >= 6000)
        {
            break;
        }
    }
    // 512 × 1024 / (1024 + position), in whole blocks, never under 64: a full chunk at the
    // start, half of one at 1K of context, a quarter at 3K, the floor from 7K on.
    let at = |p: u32| {
        chunks
            .iter()
            .find(|&&(pos, _)| pos >= p)
            .expect("a chunk")
            .1
    };
    assert_eq!(chunks[0], (0, 512));
    assert_eq!(chunks[1], (512, 336));
    assert!((240..=256).contains(&at(1024)), "{chunks:?}");
    assert!((112..=128).contains(&at(3072)), "{chunks:?}");
    assert_eq!(at(5700), 64, "{chunks:?}");
    assert!(chunks
        .windows(2)
        .all(|w| w[0].1 >= w[1].1 && w[0].0 + w[0].1 == w[1].0));
    // 6,000 tokens in 49 chunks rather than 12 (∫ (K + p) / (B·K) dp ≈ 46, and the floor).
    assert_eq!(chunks.len(), 49, "{chunks:?}");
}

#[test]
fn admission_sets_aside_the_blocks_of_each_prompt_it_lets_in() {
    // Only one prompt fits: the other was let in against the same free blocks, "preempted"
    // with none and counted, and held a running slot it could not use.
    let m = two_long_prompts_behind_a_short_one(512, 1);
    assert_eq!(m.num_requests_running, 2, "{m:?}");
    assert_eq!(m.num_requests_waiting, 1, "{m:?}");
    assert_eq!(m.preemptions_total, 0, "{m:?}");
}

#[test]
fn a_long_prompt_s_blocks_stay_set_aside_across_its_chunks() {
    // Chunks of 16 tokens: each call reserves only the chunk's blocks. The second prompt was
    // admitted on the next call, against the blocks the first still needed.
    let m = two_long_prompts_behind_a_short_one(16, 2);
    assert_eq!(m.num_requests_running, 2, "{m:?}");
    assert_eq!(m.num_requests_waiting, 1, "{m:?}");
}

/// A pipeline driver whose last rank answers as `answer` says (`None`: never, a rank whose
/// compute hangs while its links stay up).
struct Answering {
    inbox: std::sync::mpsc::Sender<super::Input>,
    answer: fn(&crate::transport::message::Forward) -> Option<crate::transport::message::Sampled>,
}

impl crate::pipeline::Driver for Answering {
    fn submit(&mut self, batch: super::MicroBatch) -> crate::error::Result<()> {
        if let Some(s) = (self.answer)(&batch.forward) {
            let _ = self.inbox.send(super::Input::Sampled(s));
        }
        Ok(())
    }

    fn release(&mut self, _seqs: Vec<u64>, _kv_blocks_used: u64) -> crate::error::Result<()> {
        Ok(())
    }

    fn ranks(&self, kv_tokens_used: usize) -> Vec<crate::api::RankHealth> {
        vec![crate::api::RankHealth {
            rank: 0,
            layers: [0, 0],
            up: true,
            kv_tokens_total: 64 * crate::kv::BLOCK_SIZE,
            kv_tokens_used,
            weight_bytes: 0,
            kv_bytes: 0,
        }]
    }
}

/// One request through a pipeline that answers as `answer` says, with a 200 ms step timeout:
/// the request's end and the engine's health after it.
async fn through_pipeline(
    answer: fn(&crate::transport::message::Forward) -> Option<crate::transport::message::Sampled>,
) -> (Result<(), EngineError>, &'static str) {
    let inbox = channel();
    let driver = Answering {
        inbox: inbox.0.clone(),
        answer,
    };
    let cfg = SchedulerConfig {
        max_running: 4,
        max_batch_tokens: 64,
        max_in_flight: 1,
        kv_blocks: 64,
        prefill_order: Default::default(),
        decode_chunk_tokens: usize::MAX,
        chunk_context_tokens: 0,
    };
    let ecfg = EngineConfig {
        model_id: "tiny".into(),
        context_window: TINY.ctx,
        defaults: Default::default(),
        step_timeout: Duration::from_millis(200),
    };
    let template = ChatTemplate::new("{{ messages[0]['content'] }}", "", "").unwrap();
    let scheduler = Scheduler::new(cfg, Arc::new(toy_tokenizer()));
    let e = EngineHandle::start(ecfg, scheduler, driver, template, inbox).unwrap();
    let mut rx = e.submit(request(1, 8, 4)).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = rx.recv().await {
            match ev {
                GenerationEvent::Finished { .. } => return Ok(()),
                GenerationEvent::Failed(err) => return Err(err),
                GenerationEvent::Token { .. } => {}
            }
        }
        panic!("the stream ended without an answer");
    })
    .await
    .expect("the request was answered");
    (end, e.health().status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_stuck_in_the_pipeline_fails_its_requests_and_the_engine_reports_down() {
    let (end, status) = through_pipeline(|_| None).await;
    assert!(
        matches!(&end, Err(EngineError::Unavailable(why)) if why.contains("step-timeout")),
        "{end:?}"
    );
    assert_eq!(status, "down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_the_asked_token_or_to_no_batch_breaks_the_pipeline() {
    use crate::transport::message::Sampled;
    // Every sequence asked for a token, none came.
    let (end, status) = through_pipeline(|f| {
        Some(Sampled {
            batch: f.batch,
            tokens: Vec::new(),
            logprobs: Vec::new(),
        })
    })
    .await;
    assert!(
        matches!(&end, Err(EngineError::Unavailable(why)) if why.contains("answered wrongly")),
        "{end:?}"
    );
    assert_eq!(status, "down");
    // An answer to another batch.
    let (end, _) = through_pipeline(|f| {
        Some(Sampled {
            batch: f.batch + 100,
            tokens: f.seqs.iter().map(|s| (s.seq, 5)).collect(),
            logprobs: Vec::new(),
        })
    })
    .await;
    assert!(
        matches!(&end, Err(EngineError::Unavailable(why)) if why.contains("not in flight")),
        "{end:?}"
    );
}
