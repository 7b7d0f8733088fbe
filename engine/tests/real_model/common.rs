//! Shared helpers of the real-model tests.

use std::path::PathBuf;

/// The bundled model (`scripts/fetch-model.sh` downloads it).
pub fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// llama.cpp's reference outputs (`/work/shared/golden`).
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden")
}
