//! The forward pass against a plain f32 reference, and against itself batched, incremental,
//! paged and split into parts.

use std::sync::Arc;

use super::{Llama, ModelPart};
use crate::backend::cpu::kernels::dequantize_row;
use crate::backend::cpu::CpuBackend;
use crate::kv::{SeqRows, BLOCK_SIZE};
use crate::model::gguf::GgufFile;
use crate::model::tiny::{tiny_gguf, TINY};

/// A weight as a dense f32 matrix (rows of `shape[0]`).
fn dense(g: &GgufFile, name: &str) -> Vec<f32> {
    let (info, bytes) = g.tensor(name).unwrap();
    let cols = info.shape[0] as usize;
    let rows = info.n_elements() as usize / cols;
    let row_bytes = bytes.len() / rows;
    let mut out = vec![0.0; rows * cols];
    for r in 0..rows {
        dequantize_row(
            info.dtype,
            &bytes[r * row_bytes..(r + 1) * row_bytes],
            &mut out[r * cols..(r + 1) * cols],
        );
    }
    out
}

fn mv(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn norm(x: &[f32], w: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    x.iter()
        .zip(w)
        .map(|(v, g)| v / (ms + 1e-5).sqrt() * g)
        .collect()
}

fn rope(x: &mut [f32], pos: usize, hd: usize) {
    for head in x.chunks_exact_mut(hd) {
        for i in 0..hd / 2 {
            let theta = pos as f32 * 10_000f32.powf(-2.0 * i as f32 / hd as f32);
            let (s, c) = theta.sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

/// Logits after every token, computed the slow and obvious way in f32.
fn reference_logits(g: &GgufFile, ids: &[u32]) -> Vec<Vec<f32>> {
    let t = &TINY;
    let hd = t.d / t.heads;
    let emb = dense(g, "token_embd.weight");
    let mut keys: Vec<Vec<Vec<f32>>> = vec![Vec::new(); t.layers];
    let mut vals: Vec<Vec<Vec<f32>>> = vec![Vec::new(); t.layers];
    let mut out = Vec::new();
    for (pos, &id) in ids.iter().enumerate() {
        let mut x = emb[id as usize * t.d..(id as usize + 1) * t.d].to_vec();
        for l in 0..t.layers {
            let w = |n: &str| dense(g, &format!("blk.{l}.{n}.weight"));
            let xn = norm(&x, &w("attn_norm"));
            let (mut q, mut k, v) = (
                mv(&w("attn_q"), &xn),
                mv(&w("attn_k"), &xn),
                mv(&w("attn_v"), &xn),
            );
            rope(&mut q, pos, hd);
            rope(&mut k, pos, hd);
            keys[l].push(k);
            vals[l].push(v);
            let mut att = vec![0.0; t.d];
            for h in 0..t.heads {
                let kvh = h / (t.heads / t.kv_heads);
                let qh = &q[h * hd..(h + 1) * hd];
                let s: Vec<f32> = keys[l]
                    .iter()
                    .map(|k| {
                        qh.iter()
                            .zip(&k[kvh * hd..])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f32::MIN, f32::max);
                let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
                for (j, sv) in s.iter().enumerate() {
                    for i in 0..hd {
                        att[h * hd + i] += (sv - m).exp() / z * vals[l][j][kvh * hd + i];
                    }
                }
            }
            x.iter_mut()
                .zip(mv(&w("attn_output"), &att))
                .for_each(|(a, b)| *a += b);
            let xn = norm(&x, &w("ffn_norm"));
            let (gate, up) = (mv(&w("ffn_gate"), &xn), mv(&w("ffn_up"), &xn));
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            x.iter_mut()
                .zip(mv(&w("ffn_down"), &act))
                .for_each(|(a, b)| *a += b);
        }
        out.push(mv(&emb, &norm(&x, &dense(g, "output_norm.weight"))));
    }
    out
}

fn load(threads: usize) -> (Arc<GgufFile>, Llama<CpuBackend>) {
    let g = Arc::new(tiny_gguf(11));
    let m = Llama::load(
        g.clone(),
        Arc::new(CpuBackend::new(threads)),
        ModelPart::full(TINY.layers),
    )
    .unwrap();
    (g, m)
}

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 101 + 5) % TINY.vocab as u32)
        .collect()
}

fn blocks(first: u32, n_tokens: usize) -> Vec<u32> {
    // Deliberately non-contiguous and out of order.
    (0..n_tokens.div_ceil(BLOCK_SIZE) as u32)
        .map(|i| first + 3 * i)
        .rev()
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn prefill_matches_the_f32_reference() {
    let (g, model) = load(2);
    let toks = ids(40, 1);
    let want = reference_logits(&g, &toks);
    let bl = blocks(2, toks.len());
    let mut st = model.new_state(64).unwrap();
    let seq = SeqRows {
        start: 0,
        len: toks.len(),
        pos: 0,
        blocks: &bl,
    };
    let rows: Vec<usize> = (0..toks.len()).collect();
    let got = model.forward(&mut st, &toks, &[seq], &rows).unwrap();
    for (i, w) in want.iter().enumerate() {
        let g = &got[i * TINY.vocab..(i + 1) * TINY.vocab];
        let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // 8-bit activations cost about 1% of the logit range; layout bugs cost all of it.
        assert!(
            max_diff(g, w) < 0.03 * scale,
            "position {i}: max diff {} of {scale}",
            max_diff(g, w)
        );
        // Where the reference's top-1 leads clearly, the engine picks the same token.
        let top = crate::generate::argmax(w) as usize;
        let runner_up = w
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != top)
            .fold(f32::MIN, |m, (_, &v)| m.max(v));
        if w[top] - runner_up > 0.05 * scale {
            assert_eq!(crate::generate::argmax(g) as usize, top, "position {i}");
        }
    }
}

#[test]
fn incremental_decode_equals_prefill() {
    let (_, model) = load(2);
    let toks = ids(35, 2);
    let bl = blocks(0, toks.len());
    let mut full = model.new_state(64).unwrap();
    let rows: Vec<usize> = (0..toks.len()).collect();
    let want = model
        .forward(
            &mut full,
            &toks,
            &[SeqRows {
                start: 0,
                len: toks.len(),
                pos: 0,
                blocks: &bl,
            }],
            &rows,
        )
        .unwrap();
    let mut st = model.new_state(64).unwrap();
    // A 20-token chunk, then one token at a time.
    let first = model
        .forward(
            &mut st,
            &toks[..20],
            &[SeqRows {
                start: 0,
                len: 20,
                pos: 0,
                blocks: &bl,
            }],
            &[19],
        )
        .unwrap();
    assert!(max_diff(&first, &want[19 * TINY.vocab..20 * TINY.vocab]) < 1e-4);
    for p in 20..toks.len() {
        let l = model
            .forward(
                &mut st,
                &toks[p..=p],
                &[SeqRows {
                    start: 0,
                    len: 1,
                    pos: p,
                    blocks: &bl,
                }],
                &[0],
            )
            .unwrap();
        assert!(
            max_diff(&l, &want[p * TINY.vocab..(p + 1) * TINY.vocab]) < 1e-4,
            "position {p}"
        );
    }
}

#[test]
fn a_batch_of_sequences_equals_each_alone() {
    let (_, model) = load(2);
    let seqs_toks = [ids(9, 3), ids(17, 4), ids(1, 5)];
    let tables: Vec<Vec<u32>> = (0..3).map(|i| blocks(i as u32, 17)).collect();
    // Alone.
    let mut alone = Vec::new();
    for (t, bl) in seqs_toks.iter().zip(&tables) {
        let mut st = model.new_state(16).unwrap();
        alone.push(
            model
                .forward(
                    &mut st,
                    t,
                    &[SeqRows {
                        start: 0,
                        len: t.len(),
                        pos: 0,
                        blocks: bl,
                    }],
                    &[t.len() - 1],
                )
                .unwrap()
                .into_owned(),
        );
    }
    // Together, in one forward pass sharing one KV store.
    let mut st = model.new_state(16).unwrap();
    let all: Vec<u32> = seqs_toks.concat();
    let mut start = 0;
    let mut seqs = Vec::new();
    let mut emit = Vec::new();
    for (t, bl) in seqs_toks.iter().zip(&tables) {
        seqs.push(SeqRows {
            start,
            len: t.len(),
            pos: 0,
            blocks: bl,
        });
        start += t.len();
        emit.push(start - 1);
    }
    let got = model.forward(&mut st, &all, &seqs, &emit).unwrap();
    for (i, a) in alone.iter().enumerate() {
        assert!(
            max_diff(a, &got[i * TINY.vocab..(i + 1) * TINY.vocab]) < 1e-4,
            "sequence {i}"
        );
    }
}

#[test]
fn model_parts_chained_equal_the_whole() {
    let (g, whole) = load(1);
    let be = whole.backend().clone();
    let first = Llama::load(
        g.clone(),
        be.clone(),
        ModelPart {
            layers: 0..1,
            embed: true,
            head: false,
        },
    )
    .unwrap();
    let last = Llama::load(
        g,
        be,
        ModelPart {
            layers: 1..2,
            embed: false,
            head: true,
        },
    )
    .unwrap();
    assert!(
        first.weight_bytes() + last.weight_bytes() > whole.weight_bytes(),
        "the tied head is loaded by both ends"
    );
    let toks = ids(12, 6);
    let bl = blocks(0, 12);
    let seq = [SeqRows {
        start: 0,
        len: 12,
        pos: 0,
        blocks: &bl,
    }];
    let want = whole
        .forward(&mut whole.new_state(8).unwrap(), &toks, &seq, &[11])
        .unwrap()
        .into_owned();
    let mut h = first.alloc_hidden(12);
    first.embed(&toks, &mut h).unwrap();
    first.forward_blocks(&mut first.new_state(8).unwrap(), &seq, &mut h, 12);
    let mut st = last.new_state(8).unwrap();
    last.forward_blocks(&mut st, &seq, &mut h, 12);
    let got = last.logits(&mut st, &h, &[11]).unwrap();
    assert!(max_diff(&want, &got) < 1e-5);
    assert!(
        last.embed(&toks, &mut h).is_err(),
        "the last part has no embeddings"
    );
}

#[test]
fn out_of_vocabulary_ids_are_an_error() {
    let (_, model) = load(1);
    let bl = blocks(0, 1);
    let mut st = model.new_state(4).unwrap();
    let r = model.forward(
        &mut st,
        &[TINY.vocab as u32],
        &[SeqRows {
            start: 0,
            len: 1,
            pos: 0,
            blocks: &bl,
        }],
        &[0],
    );
    assert!(r.is_err());
}

/// The head's buffers are kept between calls: a call emitting fewer rows than the one before
/// (or more) gives what a fresh state gives.
#[test]
fn reused_head_buffers_give_the_logits_of_fresh_ones() {
    let (_, model) = load(2);
    let toks = ids(9, 7);
    let bl = blocks(0, toks.len());
    let seq = |len| SeqRows {
        start: 0,
        len,
        pos: 0,
        blocks: &bl,
    };
    let mut kept = model.new_state(16).unwrap();
    for emit in [
        &[2usize, 5, 8][..],
        &[8],
        &[0, 1, 2, 3, 4, 5, 6, 7, 8],
        &[4],
    ] {
        let got = model
            .forward(&mut kept, &toks, &[seq(toks.len())], emit)
            .unwrap()
            .into_owned();
        let mut fresh = model.new_state(16).unwrap();
        let want = model
            .forward(&mut fresh, &toks, &[seq(toks.len())], emit)
            .unwrap();
        assert_eq!(got.len(), emit.len() * TINY.vocab);
        assert!(max_diff(&got, &want) < 1e-6, "emit {emit:?}");
    }
}
