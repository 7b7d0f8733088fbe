//! The model: GGUF reader, tokenizer, chat template, configuration and the Llama forward pass.

pub mod chat;
pub mod config;
pub mod detok;
pub mod gguf;
pub mod llama;
pub mod synthetic;
#[cfg(test)]
pub(crate) mod tiny;
pub mod tokenizer;

pub use config::LlamaConfig;
pub use llama::{ForwardState, Llama, ModelPart};

/// Where `scripts/fetch-model.sh` puts the bundled model, relative to the repository root.
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model file: [`DEFAULT_MODEL_PATH`] under the working directory or the nearest
/// directory above it that has one, else above this executable (`target/<profile>/deps/`
/// sits three levels below the repository).
pub fn default_model_path() -> std::path::PathBuf {
    let here = std::path::PathBuf::from(DEFAULT_MODEL_PATH);
    let cwd = std::env::current_dir().ok();
    let exe = std::env::current_exe().ok();
    cwd.iter()
        .chain(exe.iter())
        .flat_map(|start| start.ancestors())
        .map(|dir| dir.join(DEFAULT_MODEL_PATH))
        .find(|p| p.exists())
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
