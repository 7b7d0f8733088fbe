//! The model: GGUF reader, tokenizer, chat template, configuration and the Llama forward pass.

pub mod chat;
pub mod config;
pub mod detok;
pub mod gguf;
pub mod llama;
#[cfg(test)]
pub(crate) mod tiny;
pub mod tokenizer;

pub use config::LlamaConfig;
pub use llama::{ForwardState, Llama, ModelPart};

/// Where `scripts/fetch-model.sh` puts the bundled model, relative to the repository root.
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model file: under the working directory, or under the repository that holds
/// this executable (`target/<profile>/` sits two levels below it).
pub fn default_model_path() -> std::path::PathBuf {
    let here = std::path::PathBuf::from(DEFAULT_MODEL_PATH);
    if here.exists() {
        return here;
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .nth(3)
                .map(|root| root.join(DEFAULT_MODEL_PATH))
        })
        .filter(|p| p.exists())
        .unwrap_or(here)
}

/// Hex sha256 of a model file: ranks compare it in their handshake.
pub fn file_sha256(path: &std::path::Path) -> crate::Result<String> {
    use sha2::Digest;
    let io = |source| crate::Error::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io)?;
    Ok(crate::trace::to_hex(&h.finalize()))
}
