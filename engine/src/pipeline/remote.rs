//! Rank 0 of a multi-rank pipeline: computes its own blocks, sends activations to rank 1, and
//! hears sampled tokens (and the other ranks' health) on its control links.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use super::{local_health, Driver, LayerSplit, Stage};
use crate::api::RankHealth;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::{KvSpec, BLOCK_SIZE};
use crate::model::Llama;
use crate::scheduler::{Input, MicroBatch};
use crate::transport::message::{Message, NextRank, Setup};
use crate::transport::{
    dial, f32_to_le_bytes, DataTransport, DialOptions, HelloFields, LinkRole, LinkTransport,
    TcpTransport, Transport,
};

/// Where the other ranks are and how to prove we belong with them.
#[derive(Clone, Debug)]
pub struct Peers {
    /// Listening addresses of ranks 1..R, in order.
    pub addrs: Vec<String>,
    pub model_sha256: String,
    pub secret: Vec<u8>,
    pub dial: DialOptions,
    /// What the data link to rank 1 runs on (every rank's data links run on the same).
    pub transport: DataTransport,
}

/// A control link to rank `k` and whether it is still alive.
struct ControlLink {
    rank: usize,
    link: Arc<TcpTransport>,
    up: Arc<AtomicBool>,
}

/// Rank 0's side of the pipeline.
pub struct RemoteDriver<B: Backend> {
    stage: Stage<B>,
    split: LayerSplit,
    data: Arc<dyn Transport>,
    controls: Vec<ControlLink>,
}

impl<B: Backend> std::fmt::Debug for RemoteDriver<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteDriver")
            .field("split", &self.split)
            .finish()
    }
}

impl<B: Backend> RemoteDriver<B> {
    /// Connects to ranks 1..R, agrees on the KV pool (the smallest capacity, rank 0's
    /// `own_kv_blocks` included), has each rank link to the next, and starts listening for
    /// results. Returns once every rank is ready.
    pub fn connect(
        model: Llama<B>,
        split: LayerSplit,
        own_kv_blocks: usize,
        peers: &Peers,
        inbox: Sender<Input>,
    ) -> Result<Self> {
        let n = split.n_ranks();
        if peers.addrs.len() + 1 != n {
            return Err(Error::InvalidRequest(format!(
                "{} rank addresses for {} ranks",
                peers.addrs.len(),
                n
            )));
        }
        let bounds = |k: usize| split.bounds(k).map(|b| b as u32);
        let hello = |role, k: usize| HelloFields {
            role,
            model_sha256: peers.model_sha256.clone(),
            rank: k as u32,
            layers: bounds(k),
            n_ranks: n as u32,
            transport: match role {
                LinkRole::Control => LinkTransport::Tcp,
                LinkRole::Data => peers.transport.kind(),
            },
        };
        let mut controls = Vec::new();
        let mut kv_blocks = own_kv_blocks as u64;
        for k in 1..n {
            let addr = &peers.addrs[k - 1];
            let link = dial(
                addr,
                &hello(LinkRole::Control, k),
                &peers.secret,
                &peers.dial,
            )
            .map_err(|e| Error::Transport(format!("rank {k} at {addr}: {e}")))?;
            match link.recv()? {
                (Message::Welcome(w), _) => kv_blocks = kv_blocks.min(w.kv_blocks_capacity),
                (other, _) => {
                    return Err(Error::Transport(format!(
                        "rank {k} answered {other:?} instead of Welcome"
                    )))
                }
            }
            controls.push(ControlLink {
                rank: k,
                link,
                up: Arc::new(AtomicBool::new(true)),
            });
        }
        for c in &controls {
            let next = (c.rank + 1 < n).then(|| NextRank {
                addr: peers.addrs[c.rank].clone(),
                rank: (c.rank + 1) as u32,
                layers: bounds(c.rank + 1),
            });
            c.link
                .send(&Message::Setup(Setup { kv_blocks, next }), &[])?;
        }
        let data = dial(
            &peers.addrs[0],
            &hello(LinkRole::Data, 1),
            &peers.secret,
            &peers.dial,
        )?;
        match data.recv()? {
            (Message::Ready { .. }, _) => {}
            (other, _) => {
                return Err(Error::Transport(format!(
                    "rank 1 answered {other:?} instead of Ready"
                )))
            }
        }
        let data = peers
            .transport
            .establish(data, peers.dial.link.heartbeat_timeout)
            .map_err(|e| Error::Transport(format!("data link to rank 1: {e}")))?;
        for c in &controls {
            match c.link.recv()? {
                (Message::Ready { .. }, _) => {}
                (Message::Fatal { reason } | Message::Refused { reason }, _) => {
                    return Err(Error::Transport(format!(
                        "rank {} failed to start: {reason}",
                        c.rank
                    )))
                }
                (other, _) => {
                    return Err(Error::Transport(format!(
                        "rank {} answered {other:?} instead of Ready",
                        c.rank
                    )))
                }
            }
        }
        for c in &controls {
            listen(c.rank, c.link.clone(), c.up.clone(), inbox.clone())?;
        }
        let stage = Stage::new(model, kv_blocks as usize)?;
        Ok(Self {
            stage,
            split,
            data,
            controls,
        })
    }

    pub fn kv_tokens(&self) -> usize {
        self.stage.kv_tokens()
    }
}

/// Forwards what rank `rank` says on its control link to the engine thread; the link failing
/// is the rank going down.
fn listen(
    rank: usize,
    link: Arc<TcpTransport>,
    up: Arc<AtomicBool>,
    inbox: Sender<Input>,
) -> Result<()> {
    std::thread::Builder::new()
        .name(format!("rank{rank}-control"))
        .spawn(move || loop {
            let down = |reason: String| {
                up.store(false, Ordering::SeqCst);
                let _ = inbox.send(Input::RankDown { rank, reason });
            };
            match link.recv() {
                Ok((Message::Sampled(s), _)) => {
                    if inbox.send(Input::Sampled(s)).is_err() {
                        return;
                    }
                }
                Ok((Message::Fatal { reason }, _)) => return down(reason),
                Ok((other, _)) => tracing::warn!("rank {rank} sent {other:?} on its control link"),
                Err(e) => return down(e.to_string()),
            }
        })
        .map(|_| ())
        .map_err(|e| Error::Transport(format!("cannot start a control thread: {e}")))
}

impl<B: Backend> Driver for RemoteDriver<B> {
    fn submit(&mut self, batch: MicroBatch) -> Result<()> {
        let mut f = batch.forward;
        self.stage.run_tokens(&f.seqs, &batch.ids)?;
        let hidden = f32_to_le_bytes(&self.stage.hidden(f.rows as usize));
        // The masks were computed meanwhile; only the last rank reads them.
        if let Some(m) = batch.masks {
            m.fill(&mut f);
        }
        self.data.send(&Message::Forward(f), &hidden)
    }

    fn release(&mut self, seqs: Vec<u64>, kv_blocks_used: u64) -> Result<()> {
        self.stage.release(&seqs);
        self.data.send(
            &Message::Release {
                seqs,
                kv_blocks_used,
            },
            &[],
        )
    }

    /// Every rank's pool is the one agreed at `connect` (each rank answered Ready only once it
    /// held it), so its total and bytes come from the agreement, never from a status report that
    /// may not have arrived yet (which showed 0, or another total, for the first seconds); the
    /// use and the weights are the rank's own report.
    fn ranks(&self, kv_tokens_used: usize) -> Vec<RankHealth> {
        let mut out = vec![local_health(&self.stage, 0, kv_tokens_used)];
        let n_blocks = self.stage.kv_tokens() / BLOCK_SIZE;
        let cfg = self.stage.model().config();
        let (kv_dim, head_dim) = (cfg.kv_dim(), cfg.head_dim);
        for c in &self.controls {
            let (status, _) = c.link.peer_status();
            let st = status.unwrap_or_default();
            let spec = KvSpec {
                n_layers: self.split.range(c.rank).len(),
                n_blocks,
                kv_dim,
                head_dim,
            };
            out.push(RankHealth {
                rank: c.rank,
                layers: self.split.bounds(c.rank),
                up: c.up.load(Ordering::SeqCst),
                kv_tokens_total: n_blocks * BLOCK_SIZE,
                // A peer's count, clamped to the pool it was given (a u64::MAX from a buggy
                // rank overflowed here, on the engine thread).
                kv_tokens_used: usize::try_from(st.kv_blocks_used)
                    .unwrap_or(usize::MAX)
                    .min(n_blocks)
                    * BLOCK_SIZE,
                weight_bytes: st.weight_bytes,
                kv_bytes: spec.bytes() as u64,
            });
        }
        out
    }
}

impl<B: Backend> Drop for RemoteDriver<B> {
    fn drop(&mut self) {
        for c in &self.controls {
            let _ = c.link.send(&Message::Shutdown, &[]);
        }
    }
}
