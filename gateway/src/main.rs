//! `sluice`: the admission-controlled HTTPS gateway. Its server, middleware stack and policy
//! land with their own issue; until then the binary only reports what it is.

use clap::Parser;

/// Sluice: an admission-controlled HTTPS gateway for LLM serving.
#[derive(Parser, Debug)]
#[command(name = "sluice", version)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    eprintln!("sluice: the gateway is not built yet; run the engine with `sluice-engine generate --chat --prompt ...`");
    std::process::exit(2);
}
