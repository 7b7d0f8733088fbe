//! `sluice-engine serve` (rank 0 and the OpenAI server) and `sluice-engine rank` (one worker).

use std::path::PathBuf;
use std::sync::mpsc::channel;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use sluice_engine::backend::select::{BackendSpec, WithBackend};
use sluice_engine::backend::{Backend, Device};
use sluice_engine::generate::GenerationDefaults;
use sluice_engine::kv::sizing::{blocks_for, KvBudget};
use sluice_engine::model::chat::ChatTemplate;
use sluice_engine::model::gguf::GgufFile;
use sluice_engine::model::tokenizer::Tokenizer;
use sluice_engine::model::{default_model_path, file_sha256, Llama, LlamaConfig};
use sluice_engine::pipeline::launch::{
    exit_with_parent, spawn_ranks, ChildRanks, LISTENING, SECRET_ENV,
};
use sluice_engine::pipeline::remote::{Peers, RemoteDriver};
use sluice_engine::pipeline::worker::{run_rank, RankOptions};
use sluice_engine::pipeline::{Driver, LayerSplit, LocalDriver, Stage};
use sluice_engine::scheduler::{
    EngineConfig, EngineHandle, Input, PrefillOrder, Scheduler, SchedulerConfig,
};
use sluice_engine::trace::otlp::{self, OtlpConfig, OtlpSettings};
use sluice_engine::transport::rdma::RdmaConfig;
use sluice_engine::transport::{DataTransport, DialOptions};

/// What every rank needs to know about the model and its share of memory.
#[derive(Args, Debug, Clone)]
pub struct RankArgs {
    /// The GGUF model file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where every rank computes: `cpu`, or `cuda` (checked first: a missing driver, NVRTC or
    /// GPU is one line naming it).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// With `--device cuda`: the GPUs the ranks go on, rank r on the (r mod n)-th listed, e.g.
    /// `0,1,2` (one GPU per rank, the deployment's shape) or `0` (every rank on one GPU).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    gpus: Vec<usize>,
    /// Pipeline ranks.
    #[arg(long, default_value_t = 3)]
    ranks: usize,
    /// Blocks per rank, e.g. `0-9,10-19,20-29` (default: an even split).
    #[arg(long)]
    layers: Option<String>,
    /// Compute threads per rank (default: all the cores: a rank computing alone, as with a
    /// lone request, gets the whole machine).
    #[arg(long)]
    threads: Option<usize>,
    /// This rank's threads share their cores with other ranks' (set by `serve` for the ranks it
    /// starts when they run more threads than the host has cores): idle workers spin only
    /// briefly before they park.
    #[arg(long)]
    shared_cores: bool,
    /// KV pool size in tokens (overrides --mem-fraction).
    #[arg(long)]
    kv_tokens: Option<usize>,
    /// Fraction of the memory available after the weights given to each rank's KV pool.
    #[arg(long, default_value_t = 0.1)]
    mem_fraction: f64,
    #[command(flatten)]
    transport: TransportArgs,
}

/// What the data links between ranks run on (docs/transport.md).
#[derive(Args, Debug, Clone)]
pub struct TransportArgs {
    /// `tcp`, or `rdma`: a reliable-connected queue pair per data link (a build with the
    /// `rdma` feature, and an RDMA device on every rank).
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    transport: TransportKind,
    /// RDMA device name, e.g. mlx5_0 or rxe0 (default: the first device; port 1).
    #[arg(long)]
    rdma_device: Option<String>,
    /// RDMA GID table index (RoCE needs one: the port's RoCE v2 entry, see `show_gids`).
    #[arg(long)]
    rdma_gid_index: Option<u32>,
    /// RDMA receive slots per data link: how many sends may be in flight.
    #[arg(long, default_value_t = RdmaConfig::default().slots)]
    rdma_slots: u32,
    /// Bytes per RDMA slot; a larger message takes several.
    #[arg(long, default_value_t = RdmaConfig::default().slot_bytes)]
    rdma_slot_bytes: u32,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum PrefillOrderArg {
    Oldest,
    Shortest,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum TransportKind {
    Tcp,
    Rdma,
}

impl TransportArgs {
    fn data_transport(&self) -> DataTransport {
        match self.transport {
            TransportKind::Tcp => DataTransport::Tcp,
            TransportKind::Rdma => DataTransport::Rdma(RdmaConfig {
                device: self.rdma_device.clone(),
                gid_index: self.rdma_gid_index,
                slots: self.rdma_slots,
                slot_bytes: self.rdma_slot_bytes,
            }),
        }
    }

    /// The same choice for a child rank.
    fn child_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if self.transport == TransportKind::Rdma {
            a.extend([
                "--transport".into(),
                "rdma".into(),
                "--rdma-slots".into(),
                self.rdma_slots.to_string(),
                "--rdma-slot-bytes".into(),
                self.rdma_slot_bytes.to_string(),
            ]);
            if let Some(d) = &self.rdma_device {
                a.extend(["--rdma-device".into(), d.clone()]);
            }
            if let Some(g) = self.rdma_gid_index {
                a.extend(["--rdma-gid-index".into(), g.to_string()]);
            }
        }
        a
    }
}

impl RankArgs {
    fn model_path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model_path)
    }

    fn threads(&self) -> usize {
        self.threads.unwrap_or_else(cores).max(1)
    }

    /// This rank's backend: the device, its threads, its GPUs.
    fn backend(&self) -> BackendSpec {
        BackendSpec {
            device: self.device,
            threads: self.threads(),
            shared_cores: self.shared_cores,
            gpus: self.gpus.clone(),
        }
    }

    fn kv(&self) -> KvBudget {
        self.kv_tokens
            .map_or(KvBudget::MemFraction(self.mem_fraction), KvBudget::Tokens)
    }

    /// The arguments a child rank gets to match this one.
    fn child_args(&self, model: &std::path::Path, split: &LayerSplit) -> Vec<String> {
        let mut a = vec![
            "--model".into(),
            model.display().to_string(),
            "--layers".into(),
            split.spec(),
            "--threads".into(),
            self.threads().to_string(),
            "--mem-fraction".into(),
            self.mem_fraction.to_string(),
            "--device".into(),
            self.device.as_str().into(),
            "--gpus".into(),
            self.gpus
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ];
        if let Some(t) = self.kv_tokens {
            a.extend(["--kv-tokens".into(), t.to_string()]);
        }
        if self.shared_cores {
            a.push("--shared-cores".into());
        }
        a.extend(self.transport.child_args());
        a
    }
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    rank: RankArgs,
    /// Where the OpenAI-compatible server listens.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    /// Addresses of ranks 1..R started by hand (`sluice-engine rank`); without it, they are
    /// started here as child processes.
    #[arg(long, value_delimiter = ',')]
    rank_addrs: Vec<String>,
    /// Sequences computed at once (0 would admit nothing: every request waited for good).
    #[arg(long, default_value_t = 8, value_parser = at_least_one)]
    max_running: usize,
    /// Tokens per micro-batch (long prompts are prefilled in chunks of this size; at least 1).
    #[arg(long, default_value_t = 512, value_parser = at_least_one)]
    max_batch_tokens: usize,
    /// Tokens of long prompts (those longer than --max-batch-tokens) a micro-batch takes while
    /// requests decode: each decode step then waits for a chunk of this size, not a full one,
    /// so running requests keep their pace beside a long prefill (which takes more, smaller
    /// steps meanwhile). A prompt that fits one micro-batch still goes whole. Equal to
    /// --max-batch-tokens or above: off. At 16 on 2 cores, a 64-token answer beside a 4K
    /// prefill took 2.2 s instead of 8.7 s, with no gap over 0.06 s (1.6 s at 512), and the 4K
    /// prefill took up to a third longer while decodes ran beside all of it.
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    decode_chunk_tokens: usize,
    /// The context at which a long prompt's chunk is half of --max-batch-tokens: a chunk at
    /// position p takes at most max-batch-tokens × K / (K + p) tokens (whole KV blocks, at least
    /// 64), so a chunk deep in a long prompt, whose tokens each attend over all the context
    /// before them, costs about what one at its start does, and a request arriving meanwhile
    /// waits for no more. 0: off (every chunk takes --max-batch-tokens).
    #[arg(long, default_value_t = 1024)]
    chunk_context_tokens: usize,
    /// The order prompts' prefill chunks take a micro-batch's budget in: `oldest` first, or
    /// `shortest` (fewest tokens left) first, so that a short prompt does not wait out a long
    /// one's prefill. The gateway passes its policy's `upstream.prefill_order` (`shortest` unless
    /// set) and predicts that order.
    #[arg(long, value_enum, default_value_t = PrefillOrderArg::Oldest)]
    prefill_order: PrefillOrderArg,
    /// Micro-batches in the pipeline at once (default: one per rank, so that every stage
    /// computes at once; when the ranks share this host's cores, as many as the cores can
    /// compute at once, cores / threads: more would add no compute and only split the batch).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    micro_batches: Option<u64>,
    /// Prompt + max_tokens above this is refused (a protection limit); the window served is
    /// the smaller of this and the KV pool. It may pass the model's trained context (as
    /// llama.cpp's `-c` may), logged at start: the policy's input cap is what keeps prompts
    /// inside it.
    #[arg(long, default_value_t = 12_288)]
    context_window: usize,
    /// Seconds the requests in flight (streams included) may take to finish after SIGTERM or
    /// Ctrl-C; the connections still open then are closed (the gateway's
    /// `server.drain_timeout` default).
    #[arg(long, default_value_t = 30)]
    drain_timeout: u64,
    /// Seconds a micro-batch may stay in the pipeline before the engine takes a rank for stuck
    /// (it still heartbeats, its compute hangs): it reports itself down and fails what it holds.
    /// Far above any real step (a 512-token chunk at 12K context on the scalar kernels takes
    /// tens of seconds).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    step_timeout: u64,
    /// The model id the API reports (default: the model file's name).
    #[arg(long)]
    model_id: Option<String>,
    #[command(flatten)]
    defaults: DefaultsArgs,
    /// Exit when the process that started this one goes away (for supervisors and tests).
    #[arg(long)]
    exit_with_parent: bool,
    /// Stop when a child rank exits, so that a supervisor restarts the whole pipeline at once
    /// (without it a dead rank leaves the engine degraded: `/health` 503, requests refused).
    #[arg(long)]
    exit_when_a_rank_exits: bool,
}

/// Generation defaults for requests that leave a field out (docs/api.md): the GGUF's
/// `general.sampling.*` where present, else llama-server's; these flags override either.
#[derive(Args, Debug, Clone, Copy)]
pub struct DefaultsArgs {
    /// Default `temperature` (llama-server's: 0.8).
    #[arg(long = "default-temperature")]
    temperature: Option<f32>,
    /// Default `top_k`, 0 for none (llama-server's: 40).
    #[arg(long = "default-top-k")]
    top_k: Option<usize>,
    /// Default `top_p` (llama-server's: 0.95).
    #[arg(long = "default-top-p")]
    top_p: Option<f32>,
    /// Default `min_p` (llama-server's: 0.05).
    #[arg(long = "default-min-p")]
    min_p: Option<f32>,
    /// Default `repetition_penalty` (1: none).
    #[arg(long = "default-repetition-penalty")]
    repetition_penalty: Option<f32>,
}

impl DefaultsArgs {
    fn apply(self, gguf: &GgufFile) -> GenerationDefaults {
        let mut d = GenerationDefaults::from_gguf(gguf);
        d.temperature = self.temperature.unwrap_or(d.temperature);
        d.top_k = self.top_k.unwrap_or(d.top_k);
        d.top_p = self.top_p.unwrap_or(d.top_p);
        d.min_p = self.min_p.unwrap_or(d.min_p);
        d.repetition_penalty = self.repetition_penalty.unwrap_or(d.repetition_penalty);
        d
    }
}

#[derive(Args, Debug)]
pub struct RankCmdArgs {
    #[command(flatten)]
    rank: RankArgs,
    /// This rank's number (1..R-1; rank 0 is `serve`).
    #[arg(long = "rank")]
    index: usize,
    /// Where this rank listens for rank 0 and the previous rank.
    #[arg(long)]
    listen: String,
    /// Exit when the process that started this rank goes away.
    #[arg(long)]
    exit_with_parent: bool,
}

/// This host's cores.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The cluster secret: from the environment, or a fresh random one for local child ranks.
fn secret() -> String {
    std::env::var(SECRET_ENV).unwrap_or_else(|_| {
        let mut rng = sluice_engine::generate::Rng::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id()) << 32,
        );
        format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())
    })
}

pub fn rank(args: RankCmdArgs) -> Result<()> {
    if args.exit_with_parent {
        exit_with_parent();
    }
    args.rank.device.check_available()?;
    let Ok(secret) = std::env::var(SECRET_ENV) else {
        bail!("set {SECRET_ENV} to the cluster secret shared by all ranks");
    };
    let transport = args.rank.transport.data_transport();
    transport.check()?;
    let opts = RankOptions {
        rank: args.index,
        n_ranks: args.rank.ranks,
        listen: args.listen.clone(),
        model: args.rank.model_path(),
        layers: args.rank.layers.clone(),
        backend: args.rank.backend(),
        kv: args.rank.kv(),
        secret: secret.into_bytes(),
        transport,
    };
    run_rank(&opts, |addr| {
        use std::io::Write;
        println!("{LISTENING} {addr}");
        let _ = std::io::stdout().flush();
        eprintln!("rank {} listening on {addr}", opts.rank);
    })?;
    Ok(())
}

pub fn serve(mut args: ServeArgs) -> Result<()> {
    if args.exit_with_parent {
        exit_with_parent();
    }
    // Ranks started here share this host: with more threads in all than cores, none spins.
    if args.rank_addrs.is_empty() && args.rank.ranks > 1 {
        let r = &mut args.rank;
        r.shared_cores |= r.ranks * r.threads() > cores();
    }
    let r = &args.rank;
    r.device.check_available()?;
    let transport = r.transport.data_transport();
    if r.ranks > 1 {
        transport.check()?;
    }
    let path = r.model_path();
    let gguf = Arc::new(GgufFile::open(&path)?);
    let cfg = LlamaConfig::from_gguf(&gguf)?;
    let split = match &r.layers {
        Some(spec) => LayerSplit::parse(spec, cfg.n_layers)?,
        None => LayerSplit::even(cfg.n_layers, r.ranks)?,
    };
    if split.n_ranks() != r.ranks {
        bail!(
            "--layers names {} ranks, --ranks is {}",
            split.n_ranks(),
            r.ranks
        );
    }
    let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).context("building the tokenizer")?);
    let template = ChatTemplate::from_gguf(&gguf)?;
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let inbox = channel();
    let rank0 = Rank0 {
        args: &args,
        gguf: gguf.clone(),
        split: split.clone(),
        kv_dim: cfg.kv_dim(),
        transport,
        inbox: inbox.0.clone(),
    };
    let (driver, kv_blocks, _children) = r.backend().run(0, cfg.head_dim, rank0)??;
    eprintln!(
        "KV token pool: {} tokens",
        kv_blocks * sluice_engine::kv::BLOCK_SIZE
    );

    let sched_cfg = SchedulerConfig {
        max_running: args.max_running,
        max_batch_tokens: args.max_batch_tokens,
        decode_chunk_tokens: args.decode_chunk_tokens,
        chunk_context_tokens: args.chunk_context_tokens,
        prefill_order: match args.prefill_order {
            PrefillOrderArg::Oldest => PrefillOrder::Oldest,
            PrefillOrderArg::Shortest => PrefillOrder::Shortest,
        },
        max_in_flight: args.micro_batches.map_or(
            if r.shared_cores {
                (cores() / r.threads()).clamp(1, split.n_ranks())
            } else {
                split.n_ranks()
            },
            |n| n as usize,
        ),
        kv_blocks,
    };
    if args.context_window > cfg.context_length {
        tracing::info!(
            "--context-window {} is past the model's trained context of {} tokens: output \
             for longer requests may degrade (the policy's input cap keeps prompts under it)",
            args.context_window,
            cfg.context_length
        );
    }
    let engine_cfg = EngineConfig {
        model_id,
        // The handle caps this at the KV pool.
        context_window: args.context_window,
        defaults: args.defaults.apply(&gguf),
        step_timeout: std::time::Duration::from_secs(args.step_timeout),
    };
    let handle = EngineHandle::start(
        engine_cfg,
        Scheduler::new(sched_cfg, tokenizer),
        driver,
        template,
        inbox,
    )?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        // Traces: the standard OTEL_* variables (the gateway sets them for its bundled engine).
        let exporter = OtlpConfig::from_env(&OtlpSettings::default(), "sluice-engine")
            .context("the OTLP trace settings")?
            .map(otlp::install);
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        eprintln!("serving the OpenAI API on http://{}", listener.local_addr()?);
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
            eprintln!("shutting down: finishing in-flight requests");
        };
        let drain = std::time::Duration::from_secs(args.drain_timeout);
        sluice_engine::server::serve(listener, handle.clone(), shutdown, drain).await?;
        if let Some(e) = exporter {
            e.flush().await;
        }
        anyhow::Ok(())
    })?;
    handle.shutdown();
    Ok(())
}

/// Rank 0 on its backend: loads its blocks, sizes its KV pool from the backend's memory, and
/// builds the driver: local (one rank), or linked to ranks 1..R (started here unless
/// `--rank-addrs` names them). The child ranks live as long as what this returns.
struct Rank0<'a> {
    args: &'a ServeArgs,
    gguf: Arc<GgufFile>,
    split: LayerSplit,
    kv_dim: usize,
    transport: DataTransport,
    inbox: std::sync::mpsc::Sender<Input>,
}

type Rank0Parts = (Box<dyn Driver>, usize, Option<ChildRanks>);

impl WithBackend for Rank0<'_> {
    type Out = Result<Rank0Parts>;

    fn run<B: Backend>(self, backend: Arc<B>) -> sluice_engine::Result<Result<Rank0Parts>> {
        Ok(self.start(backend))
    }
}

impl Rank0<'_> {
    fn start<B: Backend>(self, backend: Arc<B>) -> Result<Rank0Parts> {
        let (args, r, split) = (self.args, &self.args.rank, &self.split);
        let model = Llama::load(self.gguf, backend, split.part(0))?;
        let own_blocks = blocks_for(r.kv(), split.range(0).len(), self.kv_dim, || {
            model.backend().memory_available()
        })?;
        eprintln!(
            "rank 0: blocks {:?}, {:.1} MiB of weights, {} on {}{}",
            split.bounds(0),
            model.weight_bytes() as f64 / (1 << 20) as f64,
            model.backend().name(),
            match r.device {
                Device::Cpu => format!("{} threads", r.threads()),
                Device::Cuda => format!("GPU {}", r.backend().gpu_for(0)),
            },
            if r.shared_cores {
                " (sharing cores with the other ranks)"
            } else {
                ""
            }
        );
        if split.n_ranks() == 1 {
            let stage = Stage::new(model, own_blocks)?;
            let n = stage.kv_tokens() / sluice_engine::kv::BLOCK_SIZE;
            return Ok((Box::new(LocalDriver::new(stage, self.inbox)), n, None));
        }
        let secret = secret();
        let path = r.model_path();
        let mut children = None;
        let addrs = if args.rank_addrs.is_empty() {
            let exe =
                std::env::current_exe().context("finding this executable to start the ranks")?;
            let host = args.listen.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
            let host = if host == "0.0.0.0" || host.is_empty() {
                "127.0.0.1"
            } else {
                host
            };
            let started = spawn_ranks(&exe, r.ranks, host, &r.child_args(&path, split), &secret)?;
            if args.exit_when_a_rank_exits {
                started.stop_when_a_rank_exits();
            }
            let a = started.addrs().to_vec();
            children = Some(started);
            a
        } else {
            args.rank_addrs.clone()
        };
        let peers = Peers {
            addrs,
            model_sha256: file_sha256(&path)?,
            secret: secret.into_bytes(),
            dial: DialOptions::default(),
            transport: self.transport,
        };
        let d = RemoteDriver::connect(model, split.clone(), own_blocks, &peers, self.inbox)?;
        let n = d.kv_tokens() / sluice_engine::kv::BLOCK_SIZE;
        Ok((Box::new(d), n, children))
    }
}

/// A count of at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}
