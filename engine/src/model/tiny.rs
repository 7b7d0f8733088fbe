//! A tiny random Llama written as GGUF, for tests that must not need the real model.

use super::gguf::GgufFile;
use super::synthetic::{gguf_bytes, ModelShape};

/// The tiny model's shape: 2 blocks, d_model 64, 4 query heads over 2 KV heads of 16.
pub(crate) const TINY: ModelShape = ModelShape {
    layers: 2,
    d: 64,
    heads: 4,
    kv_heads: 2,
    ffn: 128,
    vocab: 300,
    ctx: 256,
    rope_base: 10_000.0,
};

/// The tiny model with random weights from `seed` (as [`gguf_bytes`] writes them: matrices in
/// Q4_1, embeddings in Q8_0 tied to the output head, as SmolLM2; norms in F32).
pub(crate) fn tiny_gguf(seed: u64) -> GgufFile {
    GgufFile::from_bytes(gguf_bytes(&TINY, seed)).expect("the tiny model parses")
}
