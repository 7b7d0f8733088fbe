//! `sluice-load`: the capacity matrix against any OpenAI-compatible endpoint. The client and
//! workloads land with their own issue; until then the binary only reports what it is.

use clap::Parser;

/// Reproduces the deployment's capacity matrix against an OpenAI-compatible endpoint.
#[derive(Parser, Debug)]
#[command(name = "sluice-load", version)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    eprintln!("sluice-load: the load generator is not built yet");
    std::process::exit(2);
}
