//! A seeded synthetic Llama of any shape, written as GGUF by the engine's own writer. With the
//! bundled model's shapes it is what the GPU check runs (the real model, 98 MB, does not fit the
//! 64 MiB a device run may carry; this one is written on the GPU machine in about a second);
//! with tiny ones it is the tests' model (`model::tiny`).
//!
//! Matrices are Q4_1, the embeddings Q8_0 and tied to the output head, norms F32, as in
//! SmolLM2-135M-Instruct.Q4_1.gguf; weights are uniform in ±1.7/√cols (the embeddings ±1, the
//! norms 1 ± 0.3) so activations stay in the real model's range and the logits are not flat.

use std::path::Path;

use crate::dtype::{quantize_q4_1, quantize_q8_0, GgmlType};
use crate::error::{Error, Result};
use crate::generate::Rng;
use crate::model::gguf::writer::GgufWriter;
use crate::model::gguf::MetaValue;

/// A Llama's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    pub layers: usize,
    pub d: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub ctx: usize,
    pub rope_base: f32,
}

/// SmolLM2-135M's shapes (the bundled model).
pub const SMOLLM2_135M: ModelShape = ModelShape {
    layers: 30,
    d: 576,
    heads: 9,
    kv_heads: 3,
    ffn: 1536,
    vocab: 49152,
    ctx: 8192,
    rope_base: 100_000.0,
};

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The GGUF bytes of a model of `shape` with weights drawn from `seed`.
pub fn gguf_bytes(shape: &ModelShape, seed: u64) -> Vec<u8> {
    let s = shape;
    let mut rng = Rng::new(seed);
    let mut rand = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next_f32() * 2.0 - 1.0) * scale)
            .collect()
    };
    let u = |v: usize| MetaValue::U32(v as u32);
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("general.name", MetaValue::String("sluice synthetic".into()))
        .meta("llama.block_count", u(s.layers))
        .meta("llama.context_length", u(s.ctx))
        .meta("llama.embedding_length", u(s.d))
        .meta("llama.feed_forward_length", u(s.ffn))
        .meta("llama.attention.head_count", u(s.heads))
        .meta("llama.attention.head_count_kv", u(s.kv_heads))
        .meta("llama.rope.freq_base", MetaValue::F32(s.rope_base))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .meta("llama.vocab_size", u(s.vocab));
    let dims = |cols: usize, rows: usize| [cols as u64, rows as u64];
    w.tensor(
        "token_embd.weight",
        &dims(s.d, s.vocab),
        GgmlType::Q8_0,
        quantize_q8_0(&rand(s.d * s.vocab, 1.0)),
    );
    let norm = |w: &mut GgufWriter, name: &str, r: &mut dyn FnMut(usize, f32) -> Vec<f32>| {
        let v: Vec<f32> = r(s.d, 0.3).iter().map(|v| 1.0 + v).collect();
        w.tensor(name, &[s.d as u64], GgmlType::F32, f32_bytes(&v));
    };
    norm(&mut w, "output_norm.weight", &mut rand);
    let kv = s.kv_heads * (s.d / s.heads);
    for i in 0..s.layers {
        norm(&mut w, &format!("blk.{i}.attn_norm.weight"), &mut rand);
        norm(&mut w, &format!("blk.{i}.ffn_norm.weight"), &mut rand);
        for (name, cols, rows) in [
            ("attn_q", s.d, s.d),
            ("attn_k", s.d, kv),
            ("attn_v", s.d, kv),
            ("attn_output", s.d, s.d),
            ("ffn_gate", s.d, s.ffn),
            ("ffn_up", s.d, s.ffn),
            ("ffn_down", s.ffn, s.d),
        ] {
            let scale = 1.7 / (cols as f32).sqrt();
            w.tensor(
                &format!("blk.{i}.{name}.weight"),
                &dims(cols, rows),
                GgmlType::Q4_1,
                quantize_q4_1(&rand(cols * rows, scale)),
            );
        }
    }
    w.to_bytes()
}

/// Writes [`gguf_bytes`] to `path`.
pub fn write(path: &Path, shape: &ModelShape, seed: u64) -> Result<()> {
    std::fs::write(path, gguf_bytes(shape, seed))
        .map_err(|e| Error::InvalidRequest(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::kv::SeqRows;
    use crate::model::gguf::GgufFile;
    use crate::model::{Llama, LlamaConfig, ModelPart};

    /// The bundled model's widths with 2 layers and a small vocabulary (quick on a CPU).
    const SMALL: ModelShape = ModelShape {
        layers: 2,
        vocab: 512,
        ..SMOLLM2_135M
    };

    #[test]
    fn the_synthetic_model_is_seeded_and_loads_with_the_shapes_it_was_given() {
        let a = gguf_bytes(&SMALL, 7);
        assert_eq!(a, gguf_bytes(&SMALL, 7), "same seed, same bytes");
        assert_ne!(a, gguf_bytes(&SMALL, 8));
        let gguf = Arc::new(GgufFile::from_bytes(a).unwrap());
        let cfg = LlamaConfig::from_gguf(&gguf).unwrap();
        assert_eq!(
            (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads),
            (2, 576, 9, 3)
        );
        assert_eq!((cfg.ffn_dim, cfg.vocab_size, cfg.head_dim), (1536, 512, 64));
        assert_eq!(cfg.rope_base, 100_000.0);
        let model = Llama::load(
            gguf,
            Arc::new(CpuBackend::for_rank(1, false)),
            ModelPart::full(2),
        )
        .unwrap();
        let mut st = model.new_state(4).unwrap();
        let blocks = [0u32, 1];
        let seq = SeqRows {
            start: 0,
            len: 5,
            pos: 0,
            blocks: &blocks,
        };
        let logits = model
            .forward(&mut st, &[1, 2, 3, 4, 5], &[seq], &[4])
            .unwrap();
        let (lo, hi) = logits
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        assert!(logits.iter().all(|v| v.is_finite()));
        assert!(hi - lo > 1.0, "the logits are not flat: {lo}..{hi}");
    }

    #[test]
    fn the_default_shape_is_the_bundled_models() {
        let s = SMOLLM2_135M;
        assert_eq!((s.layers, s.d, s.ffn, s.vocab), (30, 576, 1536, 49152));
        assert_eq!(s.d / s.heads, 64, "the kernels' head width");
    }
}
