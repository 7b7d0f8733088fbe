//! The twins against the CPU backend's kernels (and attention against a plain f64 softmax over
//! the same f16 cache), on seeded random inputs with the model's shapes.

use super::attention::{self, Paged, KV_BLOCK};
use super::inputs::{paged_cache, q4_1, q8_0, rel_err, Rng};
use super::matvec;
use super::norm_quant::{self, quantize_rows};
use crate::backend::cpu::kernels::{self, QMatrix};
use crate::backend::cpu::pool::ThreadPool;
use crate::dtype::GgmlType;

#[test]
fn matvec_twins_match_the_cpu_matmul_at_every_batch_and_both_types() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng(0x5eed);
    // The model's shapes: QKV/out (576 -> 576), gate/up (576 -> 1536), down (1536 -> 576).
    for (rows, cols) in [(576, 576), (1536, 576), (576, 1536)] {
        let wf = rng.vec(rows * cols, 0.05);
        for (dtype, bytes) in [(GgmlType::Q4_1, q4_1(&wf)), (GgmlType::Q8_0, q8_0(&wf))] {
            let w = QMatrix::new(dtype, rows, cols, &bytes).expect("matrix");
            for nbatch in [1, 3, 8] {
                let x = rng.vec(nbatch * cols, 2.0);
                let residual = rng.vec(nbatch * rows, 1.0);
                let mut cpu = vec![0f32; nbatch * rows];
                kernels::matmul(&pool, &w, &x, nbatch, &mut cpu);
                let q = quantize_rows(&x, cols);
                let run = |add| {
                    matvec::matvec(dtype == GgmlType::Q8_0, &bytes, rows, cols, &q, nbatch, add)
                };
                let twin = run(None);
                let err = rel_err(&twin, &cpu);
                assert!(err < 2e-6, "{dtype} {rows}x{cols} batch {nbatch}: {err}");
                // The residual epilogue adds exactly what it is given.
                let with = run(Some(&residual));
                for ((a, b), r) in with.iter().zip(&twin).zip(&residual) {
                    assert_eq!(*a, r + b);
                }
            }
        }
    }
}

#[test]
fn the_norm_and_swiglu_twins_match_the_cpu_kernels() {
    let mut rng = Rng(42);
    let (rows, cols) = (5, 576);
    let mut x = rng.vec(rows * cols, 3.0);
    let residual = rng.vec(rows * cols, 1.0);
    let w = rng.vec(cols, 1.0);
    let summed: Vec<f32> = x.iter().zip(&residual).map(|(a, b)| a + b).collect();
    let mut cpu = vec![0f32; rows * cols];
    kernels::rms_norm(&summed, &w, 1e-5, rows, &mut cpu);
    let (xn, q) = norm_quant::add_rms_norm_quant(&mut x, Some(&residual), &w, 1e-5, cols);
    assert_eq!(x, summed, "x keeps the residual sum");
    let err = rel_err(&xn, &cpu);
    assert!(err < 1e-6, "rms norm: {err}");
    assert_eq!(q, quantize_rows(&xn, cols));

    let gate = rng.vec(rows * 1536, 4.0);
    let up = rng.vec(rows * 1536, 2.0);
    let mut cpu = gate.clone();
    kernels::silu_mul(&mut cpu, &up);
    let (h, _) = norm_quant::swiglu_quant(&gate, &up, 1536);
    let err = rel_err(&h, &cpu);
    assert!(err < 1e-5, "swiglu: {err}");
}

#[test]
fn the_argmax_twin_agrees_with_the_cpu_including_ties() {
    let mut rng = Rng(7);
    for _ in 0..20 {
        let mut logits = rng.vec(49152, 10.0);
        let i = (rng.uniform().abs() * 49000.0) as usize;
        logits[i] = 11.0;
        logits[i + 100] = 11.0;
        assert_eq!(matvec::argmax(&logits), kernels::argmax(&logits));
        assert_eq!(matvec::argmax(&logits), i as u32);
    }
}

/// Softmax attention in f64 over the same cache: row at position `pos`, keys `0..=pos`.
fn reference(q: &[f32], c: &Paged, n_heads: usize, pos: usize, scale: f32) -> Vec<f32> {
    let d = c.head_dim;
    let group = n_heads / c.n_kv;
    let mut out = vec![0f32; n_heads * d];
    for h in 0..n_heads {
        let at = |p: usize| {
            let slot = c.table[p / KV_BLOCK] as usize * KV_BLOCK + p % KV_BLOCK;
            (slot * c.n_kv + h / group) * d
        };
        let scores: Vec<f64> = (0..=pos)
            .map(|p| {
                (0..d)
                    .map(|j| f64::from(q[h * d + j]) * f64::from(c.k[at(p) + j]))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for j in 0..d {
            let v: f64 = (0..=pos).map(|p| e[p] * f64::from(c.v[at(p) + j])).sum();
            out[h * d + j] = (v / sum) as f32;
        }
    }
    out
}

#[test]
fn attention_twins_match_a_plain_softmax_over_the_paged_cache() {
    let mut rng = Rng(99);
    let (n_heads, n_kv, d) = (9, 3, 64);
    let scale = 1.0 / (d as f32).sqrt();
    for len in [1, 15, 16, 17, 200, 1000] {
        let (k, v, table) = paged_cache(&mut rng, len, n_kv, d);
        let c = Paged {
            k: &k,
            v: &v,
            n_kv,
            head_dim: d,
            table: &table,
        };
        let q = rng.vec(n_heads * d, 1.0);
        let want = reference(&q, &c, n_heads, len - 1, scale);
        for split_len in [64, 96, 4096] {
            let got = attention::decode(&q, &c, n_heads, len, split_len, scale);
            let err = rel_err(&got, &want);
            assert!(err < 1e-5, "decode len {len} split {split_len}: {err}");
        }
        // A prefill chunk ending at the same position: its last row is the decode row.
        let nq = len.min(20);
        let p0 = len - nq;
        let mut qs = rng.vec(nq * n_heads * d, 1.0);
        qs[(nq - 1) * n_heads * d..].copy_from_slice(&q);
        let got = attention::prefill(&qs, &c, n_heads, p0, nq, scale);
        let err = rel_err(&got[(nq - 1) * n_heads * d..], &want);
        assert!(err < 1e-5, "prefill len {len}: {err}");
        let first = reference(&qs[..n_heads * d], &c, n_heads, p0, scale);
        assert!(
            rel_err(&got[..n_heads * d], &first) < 1e-5,
            "prefill first row, len {len}"
        );
    }
}
