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

use std::sync::{Arc, OnceLock};

use sluice_engine::backend::cpu::CpuBackend;
use sluice_engine::model::gguf::GgufFile;
use sluice_engine::model::{Llama, LlamaConfig, ModelPart};

/// The real model, loaded once and shared by every test of this binary.
pub struct Shared {
    pub llama: Llama<CpuBackend>,
}

pub fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let gguf =
            Arc::new(GgufFile::open(&model_path()).expect("run scripts/fetch-model.sh first"));
        let n_layers = LlamaConfig::from_gguf(&gguf).expect("config").n_layers;
        let llama = Llama::load(
            gguf,
            Arc::new(CpuBackend::new(2)),
            ModelPart::full(n_layers),
        )
        .expect("model");
        Shared { llama }
    })
}

/// The records of one golden JSON Lines file.
pub fn golden(file: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(golden_dir().join(file)).expect("golden file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("golden JSON"))
        .collect()
}

/// A JSON array of numbers as token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
