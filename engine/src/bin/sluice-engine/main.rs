//! `sluice-engine`: the bundled inference engine's command line.

mod serve;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use sluice_engine::backend::select::{BackendSpec, WithBackend};
use sluice_engine::backend::{Backend, Device};
use sluice_engine::bench::{self, BenchConfig};
use sluice_engine::generate::{self, tokens_per_sec, GenerateParams, SamplingParams};
use sluice_engine::model::chat::{ChatMessage, ChatTemplate};
use sluice_engine::model::gguf::GgufFile;
use sluice_engine::model::tokenizer::Tokenizer;
use sluice_engine::model::{default_model_path, Llama, ModelPart};

/// `println!` that gives the write's error back instead of panicking: a reader that closed the
/// pipe (`| head`) ends the command quietly ([`sluice_engine::error::is_closed_stdout`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*)
    };
}

#[derive(Parser, Debug)]
#[command(
    name = "sluice-engine",
    version,
    about = "Sluice's bundled inference engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Tokenize text with the model's own tokenizer (special tokens parsed, no BOS).
    Tokenize {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        text: String,
        #[arg(long)]
        json: bool,
    },
    /// Generate a completion for a prompt.
    Generate(GenerateArgs),
    /// Run a token sequence once (teacher forcing) and describe each next-token distribution.
    Score {
        #[command(flatten)]
        model: ModelArgs,
        /// Comma-separated token ids.
        #[arg(long, value_delimiter = ',', required = true)]
        tokens: Vec<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Run the engine: rank 0 with the OpenAI-compatible server, starting ranks 1..R here
    /// unless `--rank-addrs` names ranks started by hand.
    Serve(serve::ServeArgs),
    /// Run one pipeline rank (1..R-1) for rank 0 to connect to (multi-host use).
    Rank(serve::RankCmdArgs),
    /// Measure prefill and batched-decode throughput.
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        /// Prompt lengths, one prefill row each (as llama-bench's `-p`).
        #[arg(long, alias = "prompt", value_delimiter = ',', default_value = "512")]
        prefill_tokens: Vec<usize>,
        #[arg(long, default_value_t = 128)]
        decode_tokens: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
        batches: Vec<usize>,
        /// Context depths, one decode row per depth and batch (as llama-bench's `-d`): tokens of
        /// context each sequence has of its own (prefilled untimed) before the timed decode.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        depth: Vec<usize>,
        #[arg(long, default_value_t = 3)]
        repetitions: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug, Clone)]
struct ModelArgs {
    /// The GGUF model file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// cpu, or cuda (needs a binary built with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// With `--device cuda`: the GPU to run on.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
}

#[derive(Args, Debug)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as one user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// A string that ends generation (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    #[arg(long)]
    json: bool,
}

struct Loaded {
    gguf: Arc<GgufFile>,
    tokenizer: Arc<Tokenizer>,
}

impl ModelArgs {
    fn open(&self) -> Result<Loaded> {
        self.device.check_available()?;
        let path = self.model.clone().unwrap_or_else(default_model_path);
        let gguf = Arc::new(GgufFile::open(&path)?);
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf).context("building the tokenizer")?);
        Ok(Loaded { gguf, tokenizer })
    }

    fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// Runs `cmd` with the whole model loaded on the backend `--device` names.
    fn run(&self, cmd: ModelCmd) -> Result<()> {
        let loaded = self.open()?;
        let cfg = sluice_engine::model::LlamaConfig::from_gguf(&loaded.gguf)?;
        let spec = BackendSpec {
            gpus: vec![self.gpu],
            device: self.device,
            ..BackendSpec::cpu(self.threads())
        };
        spec.run(
            0,
            cfg.head_dim,
            Loading {
                loaded,
                n_layers: cfg.n_layers,
                cmd,
                threads: self.threads(),
            },
        )?
    }
}

/// The commands that run the model.
enum ModelCmd {
    Score { tokens: Vec<u32>, json: bool },
    Bench { cfg: BenchConfig, json: bool },
    Generate(GenerateArgs),
}

/// A command with its model file open, waiting for its backend.
struct Loading {
    loaded: Loaded,
    n_layers: usize,
    cmd: ModelCmd,
    threads: usize,
}

impl WithBackend for Loading {
    type Out = Result<()>;

    fn run<B: Backend>(self, backend: Arc<B>) -> sluice_engine::Result<Result<()>> {
        let gguf = self.loaded.gguf.clone();
        let llama = Llama::load(gguf, backend, ModelPart::full(self.n_layers))?;
        Ok(match self.cmd {
            ModelCmd::Score { tokens, json } => score_cmd(&llama, &tokens, json),
            ModelCmd::Bench { cfg, json } => bench_cmd(&llama, &cfg, json, self.threads),
            ModelCmd::Generate(args) => generate_cmd(&self.loaded, &llama, &args),
        })
    }
}

fn main() {
    let log = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // `SLUICE_LOG_TIMESTAMPS=0`: whoever reads these lines (the gateway's supervisor, a
    // journal) stamps them itself, and one timestamp per line is enough.
    if std::env::var_os("SLUICE_LOG_TIMESTAMPS").is_some_and(|v| v == "0") {
        log.without_time().init();
    } else {
        log.init();
    }
    if let Err(e) = run(Cli::parse()) {
        if sluice_engine::error::is_closed_stdout(e.as_ref()) {
            return;
        }
        eprintln!("sluice-engine: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Tokenize { model, text, json } => {
            let loaded = model.open()?;
            let tokens = loaded.tokenizer.encode(&text, true)?;
            if json {
                outln!("{}", json!({ "tokens": tokens }))?;
            } else {
                outln!("{tokens:?}")?;
            }
        }
        Command::Generate(args) => {
            let model = args.model.clone();
            model.run(ModelCmd::Generate(args))?
        }
        Command::Serve(args) => serve::serve(args)?,
        Command::Rank(args) => serve::rank(args)?,
        Command::Score {
            model,
            tokens,
            json,
        } => model.run(ModelCmd::Score { tokens, json })?,
        Command::Bench {
            model,
            prefill_tokens,
            decode_tokens,
            batches,
            depth,
            repetitions,
            json,
        } => {
            let cfg = BenchConfig {
                prefill_tokens,
                decode_tokens,
                decode_batches: batches,
                depths: depth,
                repetitions,
            };
            model.run(ModelCmd::Bench { cfg, json })?
        }
    }
    Ok(())
}

fn score_cmd<B: Backend>(llama: &Llama<B>, tokens: &[u32], json: bool) -> Result<()> {
    let scores = generate::score(llama, tokens)?;
    if json {
        outln!("{}", serde_json::to_string(&scores)?)?;
    } else {
        for (i, p) in scores.positions.iter().enumerate() {
            outln!(
                "{i:>5} argmax {:>6} logprob(next) {:?}",
                p.argmax,
                p.next_logprob
            )?;
        }
        outln!("perplexity {:?}", scores.perplexity)?;
    }
    Ok(())
}

fn bench_cmd<B: Backend>(
    llama: &Llama<B>,
    cfg: &BenchConfig,
    json: bool,
    threads: usize,
) -> Result<()> {
    let report = bench::run(llama, cfg)?;
    if json {
        outln!("{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    if report.backend == "cpu" {
        let simd = sluice_engine::backend::cpu::kernels::simd_level();
        outln!("backend cpu  simd {}", simd.name())?;
    } else {
        outln!("backend {}", report.backend)?;
    }
    for p in &report.prefill {
        outln!(
            "threads {threads}  prefill pp{}: {:.1} tok/s ({:.2} s)",
            p.tokens,
            p.tok_s,
            p.seconds
        )?;
    }
    for d in &report.decode {
        // At depth 0 the row reads as it always has (the comparison scripts parse it).
        let at = match d.depth {
            0 => String::new(),
            n => format!(" @ d{n}"),
        };
        outln!(
            "decode tg{}{at} batch {}: {:.1} tok/s ({:.1} per sequence)",
            cfg.decode_tokens,
            d.batch,
            d.tok_s,
            d.per_seq_tok_s
        )?;
    }
    Ok(())
}

fn generate_cmd<B: Backend>(loaded: &Loaded, llama: &Llama<B>, args: &GenerateArgs) -> Result<()> {
    let text = if args.chat {
        let template = ChatTemplate::from_gguf(&loaded.gguf)?;
        template.render(&[ChatMessage::new("user", args.prompt.clone())], true)?
    } else {
        args.prompt.clone()
    };
    let prompt_tokens = loaded.tokenizer.encode(&text, true)?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        stop: args.stop.clone(),
    };
    let stream = !args.json;
    let mut written = Ok(());
    let out = generate::generate(llama, &loaded.tokenizer, &prompt_tokens, &params, |piece| {
        if stream && written.is_ok() {
            let mut stdout = std::io::stdout();
            written = write!(stdout, "{piece}").and_then(|()| stdout.flush());
        }
    })?;
    written?;
    let prefill_tok_s = tokens_per_sec(prompt_tokens.len(), out.prefill_time);
    // The first token comes from the prefill; each later one from a decode step.
    let decode_tok_s = tokens_per_sec(out.tokens.len().saturating_sub(1), out.decode_time);
    if args.json {
        outln!(
            "{}",
            json!({
                "prompt_tokens": prompt_tokens,
                "tokens": out.tokens,
                "text": out.text,
                "finish_reason": out.finish.as_str(),
                "prefill_tok_s": prefill_tok_s,
                "decode_tok_s": decode_tok_s,
            })
        )?;
    } else {
        outln!()?;
        eprintln!(
            "[{} prompt tokens at {prefill_tok_s:.1} tok/s, {} generated at {decode_tok_s:.1} tok/s, finish: {}]",
            prompt_tokens.len(),
            out.tokens.len(),
            out.finish.as_str()
        );
    }
    Ok(())
}
