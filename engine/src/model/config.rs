//! Llama hyper-parameters, read from GGUF metadata.

use super::gguf::GgufFile;
use crate::error::{Error, Result};

/// The shape of a Llama-architecture model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// RoPE rotates the first `rope_dims` of each head (all of them for SmolLM2).
    pub rope_dims: usize,
    pub vocab_size: usize,
    /// The context length the model was trained with.
    pub context_length: usize,
}

impl LlamaConfig {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let arch = gguf.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(Error::UnsupportedArchitecture(arch.to_owned()));
        }
        let u = |k: &str| gguf.get_u64(&format!("llama.{k}")).map(|v| v as usize);
        let d_model = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let n_kv_heads = u("attention.head_count_kv").unwrap_or(n_heads);
        if n_heads == 0
            || n_kv_heads == 0
            || !d_model.is_multiple_of(n_heads)
            || !n_heads.is_multiple_of(n_kv_heads)
        {
            return Err(Error::Corrupt(format!(
                "inconsistent attention shape: d_model {d_model}, {n_heads} heads, {n_kv_heads} KV heads"
            )));
        }
        let head_dim = d_model / n_heads;
        let vocab_size = match u("vocab_size") {
            Ok(v) => v,
            Err(_) => gguf.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let cfg = Self {
            n_layers: u("block_count")?,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim: u("feed_forward_length")?,
            rms_eps: gguf
                .get_f32("llama.attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-5),
            rope_base: gguf.get_f32("llama.rope.freq_base").unwrap_or(10_000.0),
            rope_dims: u("rope.dimension_count").unwrap_or(head_dim),
            vocab_size,
            context_length: u("context_length")?,
        };
        if cfg.rope_dims > head_dim || !cfg.rope_dims.is_multiple_of(2) {
            return Err(Error::Corrupt(format!(
                "rope.dimension_count {} with head_dim {head_dim}",
                cfg.rope_dims
            )));
        }
        Ok(cfg)
    }

    /// Width of one token's keys (or values) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads that share one KV head.
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }
}
