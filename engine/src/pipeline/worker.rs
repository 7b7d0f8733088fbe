//! A rank other than 0: accepts rank 0's control link and the previous rank's data link, runs
//! its blocks on each micro-batch in order, and passes activations on (or, on the last rank,
//! samples and sends the tokens back to rank 0).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::backend::select::{BackendSpec, WithBackend};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::sizing::{blocks_for, KvBudget};
use crate::model::gguf::GgufFile;
use crate::model::{file_sha256, Llama, LlamaConfig};
use crate::pipeline::{LayerSplit, Stage};
use crate::transport::message::{Message, RankStatus, Welcome};
use crate::transport::{
    dial, f32_to_le_bytes, le_bytes_to_f32, DataTransport, DialOptions, Expected, HelloFields,
    LinkConfig, LinkRole, RankListener, TcpTransport, Transport,
};

/// How to start one rank.
#[derive(Clone, Debug)]
pub struct RankOptions {
    pub rank: usize,
    pub n_ranks: usize,
    pub listen: String,
    pub model: PathBuf,
    /// `--layers` (default: an even split).
    pub layers: Option<String>,
    /// The device, threads and GPU placement (this rank's backend).
    pub backend: BackendSpec,
    pub kv: KvBudget,
    pub secret: Vec<u8>,
    /// What this rank's data links (from the previous rank, to the next) run on.
    pub transport: DataTransport,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Accepts connections until one with `role` passes the handshake.
fn accept_role(
    listener: &RankListener,
    expect: &Expected,
    role: LinkRole,
) -> Result<Arc<TcpTransport>> {
    loop {
        match listener.accept(expect) {
            Ok((link, hello)) if hello.role == role => return Ok(link),
            Ok((link, hello)) => {
                let reason = format!("expected a {role:?} link, got a {:?} link", hello.role);
                let _ = link.send(&Message::Refused { reason }, &[]);
                link.close();
            }
            Err(e) => tracing::warn!("rank link refused: {e}"),
        }
    }
}

/// Runs rank `opts.rank` until rank 0 shuts it down or goes away. `on_listening` is told the
/// bound address before any link is accepted (the launcher reads it from stdout).
pub fn run_rank(opts: &RankOptions, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
    if opts.rank == 0 || opts.rank >= opts.n_ranks {
        return Err(Error::InvalidRequest(format!(
            "rank {} of {} is not a worker rank",
            opts.rank, opts.n_ranks
        )));
    }
    let gguf = Arc::new(GgufFile::open(&opts.model)?);
    let cfg = LlamaConfig::from_gguf(&gguf)?;
    let split = match &opts.layers {
        Some(spec) => LayerSplit::parse(spec, cfg.n_layers)?,
        None => LayerSplit::even(cfg.n_layers, opts.n_ranks)?,
    };
    if split.n_ranks() != opts.n_ranks {
        return Err(Error::InvalidRequest(format!(
            "--layers names {} ranks, --ranks is {}",
            split.n_ranks(),
            opts.n_ranks
        )));
    }
    let sha = file_sha256(&opts.model)?;
    let work = RankWork {
        opts,
        gguf,
        split,
        sha,
        kv_dim: cfg.kv_dim(),
        on_listening,
    };
    opts.backend.run(opts.rank, cfg.head_dim, work)
}

/// What a worker rank does once it knows its layers: loads them on its backend, then serves.
struct RankWork<'a, F> {
    opts: &'a RankOptions,
    gguf: Arc<GgufFile>,
    split: LayerSplit,
    sha: String,
    kv_dim: usize,
    on_listening: F,
}

impl<F: FnOnce(SocketAddr)> WithBackend for RankWork<'_, F> {
    type Out = ();

    fn run<B: Backend>(self, backend: Arc<B>) -> Result<()> {
        let RankWork {
            opts,
            gguf,
            split,
            sha,
            kv_dim,
            on_listening,
        } = self;
        let model = Llama::load(gguf, backend, split.part(opts.rank))?;
        serve_rank(opts, model, &split, sha, kv_dim, on_listening)
    }
}

/// Runs rank `opts.rank`'s blocks on `model` until rank 0 shuts it down or goes away.
fn serve_rank<B: Backend>(
    opts: &RankOptions,
    model: Llama<B>,
    split: &LayerSplit,
    sha: String,
    kv_dim: usize,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<()> {
    let capacity = blocks_for(opts.kv, split.range(opts.rank).len(), kv_dim, || {
        model.backend().memory_available()
    })?;
    let bounds = split.bounds(opts.rank).map(|b| b as u32);
    let status = Arc::new(Mutex::new(RankStatus {
        rank: opts.rank as u32,
        kv_blocks_total: 0,
        kv_blocks_used: 0,
        weight_bytes: model.weight_bytes(),
        kv_bytes: 0,
    }));
    let s = status.clone();
    let link_cfg = LinkConfig::default().with_status(move || Some(lock(&s).clone()));
    let listener = RankListener::bind(&opts.listen)?.with_link_config(link_cfg.clone());
    on_listening(listener.local_addr()?);
    let expect = Expected {
        model_sha256: sha.clone(),
        rank: opts.rank as u32,
        layers: bounds,
        n_ranks: opts.n_ranks as u32,
        transport: opts.transport.kind(),
        secret: opts.secret.clone(),
    };

    // Rank 0 calls first, reads what this rank can hold, and sets the pool size for all.
    let control = accept_role(&listener, &expect, LinkRole::Control)?;
    control.send(
        &Message::Welcome(Welcome {
            rank: opts.rank as u32,
            layers: bounds,
            weight_bytes: model.weight_bytes(),
            kv_blocks_capacity: capacity as u64,
        }),
        &[],
    )?;
    let setup = match control.recv()? {
        (Message::Setup(s), _) => s,
        (other, _) => {
            return Err(Error::Transport(format!(
                "expected Setup from rank 0, got {other:?}"
            )))
        }
    };
    if setup.kv_blocks as usize > capacity {
        let reason = format!(
            "rank {} can hold {capacity} KV blocks, rank 0 asked for {}",
            opts.rank, setup.kv_blocks
        );
        let _ = control.send(
            &Message::Fatal {
                reason: reason.clone(),
            },
            &[],
        );
        return Err(Error::InvalidRequest(reason));
    }
    let mut stage = Stage::new(model, setup.kv_blocks as usize)?;
    {
        let mut st = lock(&status);
        st.kv_blocks_total = setup.kv_blocks;
        st.kv_bytes = stage.kv_bytes();
    }
    tracing::info!(
        rank = opts.rank,
        "KV token pool: {} tokens",
        stage.kv_tokens()
    );

    // Rank 0 going away (or telling us to stop) ends this rank, from here on: while it waits
    // for its data links too (a rank 0 that died between Setup and dialing left it waiting for
    // good, and refusing a restarted rank 0's control link as not the data link it expected).
    // Nothing else reads the control link after Setup.
    let watch = control.clone();
    std::thread::Builder::new()
        .name("rank-control".into())
        .spawn(move || loop {
            match watch.recv() {
                Ok((Message::Shutdown, _)) => std::process::exit(0),
                Ok(_) => {}
                Err(e) => super::launch::stop(&format!("rank 0 went away ({e}); stopping")),
            }
        })
        .map_err(|e| Error::Transport(format!("cannot start the control thread: {e}")))?;

    let heartbeat_timeout = link_cfg.heartbeat_timeout;
    let next = match &setup.next {
        Some(n) => {
            let hello = HelloFields {
                role: LinkRole::Data,
                model_sha256: sha,
                rank: n.rank,
                layers: n.layers,
                n_ranks: opts.n_ranks as u32,
                transport: opts.transport.kind(),
            };
            let link = dial(
                &n.addr,
                &hello,
                &opts.secret,
                &DialOptions {
                    link: link_cfg,
                    ..DialOptions::default()
                },
            )?;
            match link.recv()? {
                (Message::Ready { .. }, _) => Some(
                    opts.transport
                        .establish(link, heartbeat_timeout)
                        .map_err(|e| {
                            Error::Transport(format!("data link to rank {}: {e}", n.rank))
                        })?,
                ),
                (other, _) => {
                    return Err(Error::Transport(format!(
                        "expected Ready from rank {}, got {other:?}",
                        n.rank
                    )))
                }
            }
        }
        None => None,
    };
    let upstream = opts
        .transport
        .establish(
            accept_role(&listener, &expect, LinkRole::Data)?,
            heartbeat_timeout,
        )
        .map_err(|e| Error::Transport(format!("data link from rank {}: {e}", opts.rank - 1)))?;
    control.send(
        &Message::Ready {
            rank: opts.rank as u32,
        },
        &[],
    )?;

    loop {
        let (msg, body) = upstream.recv()?;
        match msg {
            Message::Forward(f) => {
                let run = le_bytes_to_f32(&body).and_then(|h| stage.run_hidden(&f.seqs, &h));
                if let Err(e) = run {
                    let _ = control.send(
                        &Message::Fatal {
                            reason: e.to_string(),
                        },
                        &[],
                    );
                    return Err(e);
                }
                lock(&status).kv_blocks_used = f.kv_blocks_used;
                match &next {
                    Some(n) => {
                        // The rows checked against the sequences, not the header's count.
                        let rows = f.seqs.iter().map(|s| s.len as usize).sum();
                        let hidden = f32_to_le_bytes(&stage.hidden(rows));
                        n.send(&Message::Forward(f), &hidden)?;
                    }
                    None => {
                        let sampled = stage.sample(f.batch, &f.seqs)?;
                        control.send(&Message::Sampled(sampled), &[])?;
                    }
                }
            }
            Message::Release {
                seqs,
                kv_blocks_used,
            } => {
                stage.release(&seqs);
                lock(&status).kv_blocks_used = kv_blocks_used;
                if let Some(n) = &next {
                    n.send(
                        &Message::Release {
                            seqs,
                            kv_blocks_used,
                        },
                        &[],
                    )?;
                }
            }
            Message::Shutdown => {
                if let Some(n) = &next {
                    let _ = n.send(&Message::Shutdown, &[]);
                }
                return Ok(());
            }
            other => tracing::warn!("rank {} ignores {other:?} on its data link", opts.rank),
        }
    }
}
