//! A tiny random Llama written as GGUF, for tests that must not need the real model.

use super::gguf::writer::GgufWriter;
use super::gguf::{GgufFile, MetaValue};
use crate::dtype::GgmlType;
use crate::generate::Rng;

/// The tiny model's shape: 2 blocks, d_model 64, 4 query heads over 2 KV heads of 16.
pub(crate) struct Tiny {
    pub layers: usize,
    pub d: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub ctx: usize,
}

pub(crate) const TINY: Tiny = Tiny {
    layers: 2,
    d: 64,
    heads: 4,
    kv_heads: 2,
    ffn: 128,
    vocab: 300,
    ctx: 256,
};

pub(crate) use crate::dtype::{quantize_q4_1, quantize_q8_0};

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The tiny model with random weights from `seed`: matrices in Q4_1, embeddings in Q8_0 (tied
/// output head, as SmolLM2), norms in F32.
pub(crate) fn tiny_gguf(seed: u64) -> GgufFile {
    let t = &TINY;
    let mut rng = Rng::new(seed);
    let mut rand = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next_f32() * 2.0 - 1.0) * scale)
            .collect()
    };
    let kv = t.kv_heads * (t.d / t.heads);
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.block_count", MetaValue::U32(t.layers as u32))
        .meta("llama.context_length", MetaValue::U32(t.ctx as u32))
        .meta("llama.embedding_length", MetaValue::U32(t.d as u32))
        .meta("llama.feed_forward_length", MetaValue::U32(t.ffn as u32))
        .meta("llama.attention.head_count", MetaValue::U32(t.heads as u32))
        .meta(
            "llama.attention.head_count_kv",
            MetaValue::U32(t.kv_heads as u32),
        )
        .meta("llama.rope.freq_base", MetaValue::F32(10_000.0))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .meta("llama.vocab_size", MetaValue::U32(t.vocab as u32));
    w.tensor(
        "token_embd.weight",
        &[t.d as u64, t.vocab as u64],
        GgmlType::Q8_0,
        quantize_q8_0(&rand(t.d * t.vocab, 1.0)),
    );
    w.tensor(
        "output_norm.weight",
        &[t.d as u64],
        GgmlType::F32,
        f32_bytes(&rand(t.d, 0.5).iter().map(|v| 1.0 + v).collect::<Vec<_>>()),
    );
    let mat = |name: String,
               cols: usize,
               rows: usize,
               w: &mut GgufWriter,
               r: &mut dyn FnMut(usize, f32) -> Vec<f32>| {
        let scale = 1.0 / (cols as f32).sqrt() * 1.7;
        w.tensor(
            &name,
            &[cols as u64, rows as u64],
            GgmlType::Q4_1,
            quantize_q4_1(&r(cols * rows, scale)),
        );
    };
    for i in 0..t.layers {
        for norm in ["attn_norm", "ffn_norm"] {
            let v: Vec<f32> = rand(t.d, 0.3).iter().map(|v| 1.0 + v).collect();
            w.tensor(
                &format!("blk.{i}.{norm}.weight"),
                &[t.d as u64],
                GgmlType::F32,
                f32_bytes(&v),
            );
        }
        mat(
            format!("blk.{i}.attn_q.weight"),
            t.d,
            t.d,
            &mut w,
            &mut rand,
        );
        mat(format!("blk.{i}.attn_k.weight"), t.d, kv, &mut w, &mut rand);
        mat(format!("blk.{i}.attn_v.weight"), t.d, kv, &mut w, &mut rand);
        mat(
            format!("blk.{i}.attn_output.weight"),
            t.d,
            t.d,
            &mut w,
            &mut rand,
        );
        mat(
            format!("blk.{i}.ffn_gate.weight"),
            t.d,
            t.ffn,
            &mut w,
            &mut rand,
        );
        mat(
            format!("blk.{i}.ffn_up.weight"),
            t.d,
            t.ffn,
            &mut w,
            &mut rand,
        );
        mat(
            format!("blk.{i}.ffn_down.weight"),
            t.ffn,
            t.d,
            &mut w,
            &mut rand,
        );
    }
    GgufFile::from_bytes(w.to_bytes()).expect("the tiny model parses")
}
