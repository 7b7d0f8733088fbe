//! `sluice`: the admission-controlled HTTPS gateway.
//!
//! - `sluice serve`: the gateway, in front of the bundled engine (started and supervised
//!   here) or of OpenAI-compatible upstreams, as the policy says.
//! - `sluice certs dev`: a local CA and a `localhost` certificate in `certs/`.
//! - `sluice policy check FILE [--against RUNNING]`: `ok <sha256>`, or the error a reload
//!   would log; against the file in force, also what the reload would change.
//! - `sluice policy replay-cost LOG [--policy FILE]`: the cost model's prefill fit replayed
//!   from a gateway's debug log: its errors, the terms it ends at.

mod replay_cost;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_gateway::policy::load::{check_file, check_reload};

/// mimalloc's per-thread caches instead of glibc's arenas: a request allocates and frees many
/// small buffers (headers, JSON, token ids) on whichever worker runs it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sluice: an admission-controlled HTTPS gateway for LLM serving.
#[derive(Parser, Debug)]
#[command(name = "sluice", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the gateway.
    Serve(serve::ServeArgs),
    /// Certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Policy files.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Subcommand, Debug)]
enum CertsCommand {
    /// Generates (again) a local CA and a server certificate for localhost, 127.0.0.1, ::1.
    Dev {
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Validates a policy file: prints `ok <sha256>` (exit 0) or the error (exit 1).
    Check {
        file: PathBuf,
        /// The file in force: check FILE as a reload over it would (the same refusals), and
        /// print what it would change (`access: ...`, `restart: KEY` lines).
        #[arg(long, value_name = "RUNNING")]
        against: Option<PathBuf>,
    },
    /// Replays the prefills a gateway learned from (its log at
    /// RUST_LOG=info,sluice::predict=debug) through the cost model seeded from a policy: each
    /// one predicted before it is learned, the errors by prompt length, the terms at the end.
    ReplayCost {
        log: PathBuf,
        /// The policy whose [admission.cost] seeds the model (the shipped one without).
        #[arg(long)]
        policy: Option<PathBuf>,
    },
}

/// `println!` without its panic when the reader of stdout has gone (`sluice policy check … |
/// head -1`): the rest is dropped, and the exit status still says what was checked.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => match serve::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Certs(CertsCommand::Dev { dir }) => {
            match sluice_gateway::tls::generate_dev_certs(&dir) {
                Ok(certs) => {
                    outln!("CA to trust: {}", certs.ca_cert.display());
                    outln!("certificate: {}", certs.cert.display());
                    outln!("key:         {}", certs.key.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sluice: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Policy(PolicyCommand::ReplayCost { log, policy }) => {
            match replay_cost::run(&log, policy.as_deref()) {
                Ok(report) => {
                    outln!("{}", report.trim_end());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sluice: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Policy(PolicyCommand::Check { file, against }) => {
            // Against the file in force: what the reload would change, a line each.
            let checked = match &against {
                None => check_file(&file).map(|p| (p, Vec::new())),
                Some(running) => check_reload(&file, running).map(|(p, admitted)| {
                    let access = admitted
                        .access_changes
                        .iter()
                        .map(|c| format!("access: {c}"));
                    let restart = admitted
                        .restart_pending
                        .iter()
                        .map(|k| format!("restart: {k} (a reload keeps its running value)"));
                    (p, access.chain(restart).collect())
                }),
            };
            match checked {
                Ok((p, changes)) => {
                    outln!("ok {}", p.sha256);
                    for line in changes {
                        outln!("{line}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    outln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
