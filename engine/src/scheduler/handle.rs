//! The engine thread that drives the scheduler and the pipeline, and the handle the HTTP
//! server holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::{Scheduler, Sequence};
use crate::api::{
    Engine, EngineError, GenerationEvent, GenerationRequest, Health, MetricsSnapshot, RankHealth,
};
use crate::generate::{GenerationDefaults, Grammars, Rng};
use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::Tokenizer;
use crate::pipeline::Driver;
use crate::transport::message::Sampled;

/// What the engine thread receives.
#[derive(Debug)]
pub enum Input {
    Submit(Box<Sequence>),
    Sampled(Sampled),
    /// A rank stopped answering; every request in the engine fails.
    RankDown {
        rank: usize,
        reason: String,
    },
    Shutdown,
}

/// Fixed facts about the engine the server reports.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub model_id: String,
    /// Prompt plus max_tokens may not exceed this (`--context-window`);
    /// [`EngineHandle::start`] caps it at the KV pool, which must hold a whole request.
    pub context_window: usize,
    /// What a request gets for the sampling fields it leaves out (GGUF metadata, else
    /// llama-server's; `serve --temperature` and friends override).
    pub defaults: GenerationDefaults,
    /// The longest a micro-batch may stay in the pipeline (`--step-timeout`): past it a rank
    /// is stuck (one that still heartbeats and reads, its compute hung), the engine reports
    /// itself down and fails what it holds, and its supervisor restarts it.
    pub step_timeout: Duration,
}

/// What the engine thread publishes for `/health` and `/metrics`.
#[derive(Debug)]
struct Published {
    metrics: MetricsSnapshot,
    ranks: Vec<RankHealth>,
    down: Option<String>,
}

/// The server's handle on the engine: it submits requests to the engine thread and reads
/// what that thread publishes.
pub struct EngineHandle {
    cfg: EngineConfig,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    /// `None` when llguidance could not take the tokenizer (structured outputs are refused).
    grammars: Option<Grammars>,
    tx: Sender<Input>,
    next_id: AtomicU64,
    seeds: Mutex<Rng>,
    published: Arc<Mutex<Published>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl EngineHandle {
    /// Starts the engine thread over `driver` and returns the handle.
    pub fn start<D: Driver + 'static>(
        mut cfg: EngineConfig,
        scheduler: Scheduler,
        driver: D,
        template: ChatTemplate,
        inbox: (Sender<Input>, Receiver<Input>),
    ) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = inbox;
        // The first snapshot is taken here, before any caller holds the handle: `/health` never
        // answers with the empty default while the engine thread has yet to publish.
        let published = Arc::new(Mutex::new(Published {
            metrics: scheduler.metrics(),
            ranks: driver.ranks(scheduler.kv_tokens_used()),
            down: None,
        }));
        let step_timeout = cfg.step_timeout;
        let tokenizer = scheduler.tokenizer().clone();
        let eos = tokenizer
            .token_id("<|im_end|>")
            .unwrap_or_else(|| tokenizer.eos_id());
        let grammars = Grammars::new(tokenizer.clone(), eos)
            .map_err(|e| tracing::warn!("structured outputs are off: {e}"))
            .ok();
        // A request the pool cannot hold could never run: the window is at most the pool, so
        // that the default max_tokens (and `/v1/models`' max_model_len) fit in it.
        cfg.context_window = cfg.context_window.min(scheduler.kv_tokens());
        let handle = Arc::new(Self {
            grammars,
            tokenizer: scheduler.tokenizer().clone(),
            cfg,
            template,
            tx,
            next_id: AtomicU64::new(1),
            seeds: Mutex::new(Rng::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(7, |d| d.as_nanos() as u64),
            )),
            published: published.clone(),
        });
        std::thread::Builder::new()
            .name("sluice-engine".into())
            .spawn(move || engine_loop(scheduler, driver, rx, published, step_timeout))?;
        Ok(handle)
    }

    /// Asks the engine thread to stop after failing what is left.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Input::Shutdown);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine for EngineHandle {
    fn model_id(&self) -> &str {
        &self.cfg.model_id
    }

    fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    fn chat_template(&self) -> &ChatTemplate {
        &self.template
    }

    fn context_window(&self) -> usize {
        self.cfg.context_window
    }

    fn submit(
        &self,
        req: GenerationRequest,
    ) -> Result<UnboundedReceiver<GenerationEvent>, EngineError> {
        if let Some(why) = &lock(&self.published).down {
            return Err(EngineError::Unavailable(why.clone()));
        }
        let invalid = |code, message| Err(EngineError::Invalid { code, message });
        if req.prompt.is_empty() {
            return invalid("invalid_prompt", "the prompt is empty".into());
        }
        if req.max_tokens == 0 {
            return invalid("invalid_value", "max_tokens must be at least 1".into());
        }
        // Checked: a `max_tokens` near `usize::MAX` must be refused here, not wrap under the
        // window and then run until the pool is full.
        let need = req.prompt.len().checked_add(req.max_tokens);
        if need.is_none_or(|n| n > self.cfg.context_window) {
            let (p, m, w) = (req.prompt.len(), req.max_tokens, self.cfg.context_window);
            let sum = need.map_or_else(String::new, |n| format!(" = {n}"));
            return invalid(
                "context_length_exceeded",
                format!("this request needs {p} prompt tokens + {m} max_tokens{sum}, over the context window of {w} tokens"),
            );
        }
        let (tx, rx) = unbounded_channel();
        let seed = req
            .sampling
            .seed
            .unwrap_or_else(|| lock(&self.seeds).next_u64());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let seq = Sequence::new(id, req, seed, self.tokenizer.clone(), tx);
        self.tx
            .send(Input::Submit(Box::new(seq)))
            .map_err(|_| EngineError::Unavailable("the engine has stopped".into()))?;
        Ok(rx)
    }

    fn health(&self) -> Health {
        let p = lock(&self.published);
        let up = p.ranks.iter().filter(|r| r.up).count();
        let status = if p.down.is_none() && up == p.ranks.len() {
            "ok"
        } else if up > 0 && p.down.is_none() {
            "degraded"
        } else {
            "down"
        };
        Health {
            status,
            ranks: p.ranks.clone(),
        }
    }

    fn defaults(&self) -> GenerationDefaults {
        self.cfg.defaults
    }

    fn grammars(&self) -> Option<&Grammars> {
        self.grammars.as_ref()
    }

    fn metrics(&self) -> MetricsSnapshot {
        let p = lock(&self.published);
        MetricsSnapshot {
            ranks: p.ranks.clone(),
            ..p.metrics.clone()
        }
    }
}

/// How long the engine thread sleeps when idle before checking for disconnected clients.
const IDLE_POLL: Duration = Duration::from_millis(20);

fn engine_loop<D: Driver>(
    mut sched: Scheduler,
    mut driver: D,
    rx: Receiver<Input>,
    published: Arc<Mutex<Published>>,
    step_timeout: Duration,
) {
    let mut down: Option<String> = None;
    loop {
        let mut busy = false;
        // Everything that arrived, without blocking.
        loop {
            match rx.try_recv() {
                Ok(input) => {
                    busy = true;
                    if !handle_input(input, &mut sched, &mut down) {
                        return;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        if down.is_none() {
            if let Some(age) = sched.oldest_in_flight().filter(|&a| a > step_timeout) {
                down = Some(format!(
                    "a micro-batch has been in the pipeline for {:.0} s, past --step-timeout \
                     ({} s): a rank is stuck",
                    age.as_secs_f64(),
                    step_timeout.as_secs()
                ));
            }
        }
        sched.abort_disconnected();
        let released = sched.take_released();
        if down.is_none() && !released.is_empty() {
            let used = (sched.kv_tokens_used() / crate::kv::BLOCK_SIZE) as u64;
            if let Err(e) = driver.release(released, used) {
                down = Some(format!("the pipeline failed: {e}"));
            }
        }
        while down.is_none() {
            let Some(batch) = sched.schedule() else { break };
            busy = true;
            if let Err(e) = driver.submit(batch) {
                down = Some(format!("the pipeline failed: {e}"));
            }
        }
        let publish = |sched: &Scheduler, driver: &D| {
            let mut p = lock(&published);
            p.metrics = sched.metrics();
            p.ranks = driver.ranks(sched.kv_tokens_used());
            p.down = down.clone();
        };
        if let Some(why) = &down {
            // Health first: a client that sees its request fail must find the engine down.
            publish(&sched, &driver);
            sched.fail_all(&EngineError::Unavailable(why.clone()));
        }
        publish(&sched, &driver);
        if !busy {
            match rx.recv_timeout(IDLE_POLL) {
                Ok(input) => {
                    if !handle_input(input, &mut sched, &mut down) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

/// Applies one input; `false` means stop the engine thread.
fn handle_input(input: Input, sched: &mut Scheduler, down: &mut Option<String>) -> bool {
    match input {
        Input::Submit(seq) => {
            if let Some(why) = down {
                seq.fail(EngineError::Unavailable(why.clone()));
            } else {
                sched.add(*seq);
            }
        }
        Input::Sampled(s) => {
            if let Err(e) = sched.complete(s) {
                // The first reason stands: a late answer after a failure is not in flight.
                down.get_or_insert_with(|| {
                    format!("the pipeline's last rank answered wrongly: {e}")
                });
            }
        }
        Input::RankDown { rank, reason } => {
            down.get_or_insert_with(|| format!("pipeline rank {rank} is down: {reason}"));
        }
        Input::Shutdown => {
            sched.fail_all(&EngineError::Unavailable(
                "the engine is shutting down".into(),
            ));
            return false;
        }
    }
    true
}
