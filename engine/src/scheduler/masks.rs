//! Grammar masks computed beside the forward pass.
//!
//! A constrained sequence's mask for step t+1 depends only on the tokens up to t, and only the
//! last rank needs it, to sample step t+1. So the scheduler hands the masks of a micro-batch
//! to a [`MaskWorker`] thread as soon as the batch is built, rank 0 runs its blocks meanwhile,
//! and [`PendingMasks::fill`] puts them into the batch's header just before it is sent down the
//! pipeline (or sampled, with one rank). The masks are the same either way: each is computed
//! from its sequence's grammar state, which no token changes until the batch's sample is back.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use crate::generate::Constraint;
use crate::transport::message::{Forward, TokenMask};

/// One sequence's grammar state, shared with the mask worker.
pub type SharedConstraint = Arc<Mutex<Grammar>>;

/// A grammar and why its last mask could not be computed.
#[derive(Debug)]
pub struct Grammar {
    constraint: Constraint,
    /// Set when a mask failed: the token sampled without it must not be taken.
    failed: Option<String>,
}

/// `c`, ready to share with the mask worker.
pub fn share(c: Constraint) -> SharedConstraint {
    Arc::new(Mutex::new(Grammar {
        constraint: c,
        failed: None,
    }))
}

fn lock(c: &SharedConstraint) -> std::sync::MutexGuard<'_, Grammar> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tokens `c` allows next. If the grammar fails, `None` (any token: the mask travels with
/// the batch whatever happens) and the failure is kept, so that [`consume`] refuses the token
/// sampled without it.
pub fn mask_of(seq: u64, c: &SharedConstraint) -> Option<TokenMask> {
    let mut g = lock(c);
    match g.constraint.mask() {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(seq, "no grammar mask: {e}");
            g.failed.get_or_insert(e);
            None
        }
    }
}

/// Follows a sampled token in the sequence's grammar; `Ok(true)` once the grammar is complete.
/// An error (the grammar refuses the token, or its mask failed) ends the sequence.
pub fn consume(c: &SharedConstraint, id: u32) -> Result<bool, String> {
    let mut g = lock(c);
    if let Some(e) = &g.failed {
        return Err(format!("no mask: {e}"));
    }
    g.constraint.consume(id)?;
    Ok(g.constraint.is_stopped())
}

/// The masks one micro-batch waits for.
type Job = Vec<(usize, u64, SharedConstraint)>;
type Masks = Vec<(usize, Option<TokenMask>)>;

/// A micro-batch's masks, being computed.
#[derive(Debug)]
pub struct PendingMasks {
    job: Job,
    reply: Option<Receiver<Masks>>,
}

impl PendingMasks {
    /// Waits for the masks and sets them in `forward`'s sample specs.
    pub fn fill(self, forward: &mut Forward) {
        // A worker that went away leaves its job to this thread (the same masks, later).
        let masks = match self.reply.and_then(|rx| rx.recv().ok()) {
            Some(m) => m,
            None => compute(&self.job),
        };
        for (i, mask) in masks {
            if let Some(spec) = forward.seqs.get_mut(i).and_then(|c| c.sample.as_mut()) {
                spec.allow = mask;
            }
        }
    }
}

fn compute(job: &Job) -> Masks {
    job.iter()
        .map(|(i, seq, c)| (*i, mask_of(*seq, c)))
        .collect()
}

/// A thread that computes micro-batches' masks, one batch at a time, in order.
#[derive(Debug)]
pub struct MaskWorker {
    tx: Sender<(Job, Sender<Masks>)>,
}

impl MaskWorker {
    /// Starts the thread; `None` if it cannot be started (the scheduler then computes each
    /// mask itself, before the forward).
    pub fn start() -> Option<Self> {
        let (tx, rx) = channel::<(Job, Sender<Masks>)>();
        std::thread::Builder::new()
            .name("sluice-masks".into())
            .spawn(move || {
                for (job, reply) in rx {
                    let _ = reply.send(compute(&job));
                }
            })
            .map_err(|e| tracing::warn!("grammar masks are not overlapped: {e}"))
            .ok()?;
        Some(Self { tx })
    }

    /// Starts computing `job`'s masks (the index of each sequence's chunk in the batch, its id
    /// and its grammar).
    pub fn submit(&self, job: Job) -> PendingMasks {
        let (reply, rx) = channel();
        match self.tx.send((job.clone(), reply)) {
            Ok(()) => PendingMasks {
                job,
                reply: Some(rx),
            },
            Err(_) => PendingMasks { job, reply: None },
        }
    }
}
