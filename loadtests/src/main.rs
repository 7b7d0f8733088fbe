//! `sluice-load`: the capacity matrix against any OpenAI-compatible endpoint.

mod cli;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Load generator for OpenAI-compatible endpoints: one scenario (`run`), concurrency levels
/// (`bench`), the deployment's whole capacity matrix (`matrix`), or a calibrated admission
/// policy (`calibrate`).
#[derive(Parser, Debug)]
#[command(name = "sluice-load", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// One scenario: closed loop at --concurrency, or open loop at --rate; bounded by
    /// --requests and/or --duration.
    Run(cli::run::RunArgs),
    /// Closed loop at each concurrency level (and shape) in turn.
    Bench(cli::bench::BenchArgs),
    /// The deployment's capacity matrix against each target, written to docs/capacity.md.
    Matrix(cli::matrix::MatrixArgs),
    /// Sweeps concurrency and arrival rate, and writes the policy that keeps TTFT p95 under
    /// --ttft-p95.
    Calibrate(cli::calibrate::CalibrateArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // One thread: the generator should take as little CPU from the server under test as it can.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let any_ok = rt.block_on(async {
        match cli.command {
            Command::Run(args) => cli::run::main(args).await,
            Command::Bench(args) => cli::bench::main(args).await,
            Command::Matrix(args) => cli::matrix::main(args).await,
            Command::Calibrate(args) => cli::calibrate::main(args).await,
        }
    })?;
    if !any_ok {
        std::process::exit(1);
    }
    Ok(())
}
