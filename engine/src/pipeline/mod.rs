//! The model split into pipeline ranks: which blocks each rank holds ([`LayerSplit`]), one
//! rank's computation ([`Stage`]), and how rank 0 drives the pipeline ([`Driver`]): all in
//! process for one rank ([`LocalDriver`]), or over a [`Transport`](crate::transport::Transport)
//! to ranks in other processes ([`remote::RemoteDriver`], [`worker`]).

pub mod launch;
pub mod remote;
mod split;
mod stage;
pub mod worker;

use std::sync::mpsc::Sender;

pub use split::LayerSplit;
pub use stage::{seq_rows, Stage};

use crate::api::RankHealth;
use crate::backend::Backend;
use crate::error::Result;
use crate::scheduler::{Input, MicroBatch};

/// How the engine thread on rank 0 runs micro-batches. A batch's sampled tokens come back to
/// the engine thread's inbox as [`Input::Sampled`], in submission order.
pub trait Driver: Send {
    /// Runs rank 0's part of `batch` and passes it down the pipeline.
    fn submit(&mut self, batch: MicroBatch) -> Result<()>;
    /// Tells every rank to forget these sequences, and how many KV blocks are now in use.
    fn release(&mut self, seqs: Vec<u64>, kv_blocks_used: u64) -> Result<()>;
    /// Every rank's health; rank 0 reports `kv_tokens_used` itself.
    fn ranks(&self, kv_tokens_used: usize) -> Vec<RankHealth>;
}

impl<D: Driver + ?Sized> Driver for Box<D> {
    fn submit(&mut self, batch: MicroBatch) -> Result<()> {
        (**self).submit(batch)
    }

    fn release(&mut self, seqs: Vec<u64>, kv_blocks_used: u64) -> Result<()> {
        (**self).release(seqs, kv_blocks_used)
    }

    fn ranks(&self, kv_tokens_used: usize) -> Vec<RankHealth> {
        (**self).ranks(kv_tokens_used)
    }
}

/// The whole model in this process: one rank, no transport.
pub struct LocalDriver<B: Backend> {
    stage: Stage<B>,
    inbox: Sender<Input>,
}

impl<B: Backend> std::fmt::Debug for LocalDriver<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalDriver")
            .field("stage", &self.stage)
            .finish()
    }
}

impl<B: Backend> LocalDriver<B> {
    pub fn new(stage: Stage<B>, inbox: Sender<Input>) -> Self {
        Self { stage, inbox }
    }
}

impl<B: Backend> Driver for LocalDriver<B> {
    fn submit(&mut self, batch: MicroBatch) -> Result<()> {
        let mut f = batch.forward;
        self.stage.run_tokens(&f.seqs, &batch.ids)?;
        if let Some(m) = batch.masks {
            m.fill(&mut f);
        }
        let sampled = self.stage.sample(f.batch, &f.seqs)?;
        let _ = self.inbox.send(Input::Sampled(sampled));
        Ok(())
    }

    fn release(&mut self, seqs: Vec<u64>, _kv_blocks_used: u64) -> Result<()> {
        self.stage.release(&seqs);
        Ok(())
    }

    fn ranks(&self, kv_tokens_used: usize) -> Vec<RankHealth> {
        vec![local_health(&self.stage, 0, kv_tokens_used)]
    }
}

/// Rank `rank`'s health as this process sees its own stage.
pub fn local_health<B: Backend>(
    stage: &Stage<B>,
    rank: usize,
    kv_tokens_used: usize,
) -> RankHealth {
    let part = stage.model().part();
    RankHealth {
        rank,
        layers: [part.layers.start, part.layers.end.saturating_sub(1)],
        up: true,
        kv_tokens_total: stage.kv_tokens(),
        kv_tokens_used,
        weight_bytes: stage.model().weight_bytes(),
        kv_bytes: stage.kv_bytes(),
    }
}
