//! Twins of `attention.cu` over a paged cache laid out as the kernels read it:
//! `[slot][kv head][head_dim]`, values already rounded to f16.

use super::warp_sum;

pub const KV_BLOCK: usize = 16;

/// A cache and one sequence's view of it.
#[derive(Debug)]
pub struct Paged<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub n_kv: usize,
    pub head_dim: usize,
    /// Physical block of each logical block.
    pub table: &'a [i32],
}

impl Paged<'_> {
    fn at(&self, pos: usize, kvh: usize) -> usize {
        let slot = self.table[pos / KV_BLOCK] as usize * KV_BLOCK + pos % KV_BLOCK;
        (slot * self.n_kv + kvh) * self.head_dim
    }
}

/// Online softmax state of one query head in one warp.
#[derive(Clone)]
struct Online {
    m: f32,
    l: f32,
    acc: Vec<f32>,
}

impl Online {
    fn new(d: usize) -> Self {
        Self {
            m: f32::NEG_INFINITY,
            l: 0.0,
            acc: vec![0.0; d],
        }
    }

    /// One key: the score as the warp sums it (lane l holds dims l, l + 32, ...).
    fn push(&mut self, q: &[f32], k: &[f32], v: &[f32], scale: f32) {
        let d = q.len();
        let mut lanes = [0f32; 32];
        for (l, lane) in lanes.iter_mut().enumerate() {
            let mut dot = 0f32;
            for j in (l..d).step_by(32) {
                dot = q[j].mul_add(k[j], dot);
            }
            *lane = dot;
        }
        let score = warp_sum(lanes) * scale;
        let m_new = self.m.max(score);
        let (corr, e) = ((self.m - m_new).exp(), (score - m_new).exp());
        self.l = self.l * corr + e;
        for (a, &vv) in self.acc.iter_mut().zip(v) {
            *a = e.mul_add(vv, *a * corr);
        }
        self.m = m_new;
    }
}

/// Merges partial states as the CTA merges its warps and `attn_combine` merges splits:
/// `(M, L, A)` with `M` the largest m, each part weighted by `e^(m - M)` in order.
fn merge(parts: &[(f32, f32, Vec<f32>)], d: usize) -> (f32, f32, Vec<f32>) {
    let mm = parts.iter().fold(f32::NEG_INFINITY, |a, p| a.max(p.0));
    let mut ll = 0f32;
    let mut aa = vec![0f32; d];
    if mm != f32::NEG_INFINITY {
        for (m, l, acc) in parts {
            if *m == f32::NEG_INFINITY {
                continue;
            }
            let f = (m - mm).exp();
            ll = l.mul_add(f, ll);
            for (a, &x) in aa.iter_mut().zip(acc) {
                *a = x.mul_add(f, *a);
            }
        }
    }
    (mm, ll, aa)
}

/// `attn_decode` + `attn_combine` for one sequence whose query row is `q` (all heads): keys
/// `0..len`, `split_len` positions per split, 4 warps per split.
pub fn decode(
    q: &[f32],
    cache: &Paged,
    n_heads: usize,
    len: usize,
    split_len: usize,
    scale: f32,
) -> Vec<f32> {
    let d = cache.head_dim;
    let group = n_heads / cache.n_kv;
    let mut out = vec![0f32; n_heads * d];
    for h in 0..n_heads {
        let kvh = h / group;
        let qh = &q[h * d..(h + 1) * d];
        let mut splits = Vec::new();
        for start in (0..len.max(1)).step_by(split_len) {
            let end = len.min(start + split_len);
            let mut warps = vec![Online::new(d); 4];
            for p in start..end {
                let at = cache.at(p, kvh);
                warps[(p - start) % 4].push(qh, &cache.k[at..at + d], &cache.v[at..at + d], scale);
            }
            let parts: Vec<_> = warps.into_iter().map(|w| (w.m, w.l, w.acc)).collect();
            splits.push(merge(&parts, d));
        }
        let (_, l, acc) = merge(&splits, d);
        for (o, a) in out[h * d..(h + 1) * d].iter_mut().zip(acc) {
            *o = if l > 0.0 { a / l } else { 0.0 };
        }
    }
    out
}

/// `attn_prefill` for one sequence chunk: `nq` query rows (all heads) at positions
/// `p0..p0 + nq`, causal over keys `0..=p`, key blocks in order.
pub fn prefill(
    q: &[f32],
    cache: &Paged,
    n_heads: usize,
    p0: usize,
    nq: usize,
    scale: f32,
) -> Vec<f32> {
    let d = cache.head_dim;
    let group = n_heads / cache.n_kv;
    let mut out = vec![0f32; nq * n_heads * d];
    for i in 0..nq {
        for h in 0..n_heads {
            let qh = &q[(i * n_heads + h) * d..(i * n_heads + h + 1) * d];
            let mut s = Online::new(d);
            for p in 0..=p0 + i {
                let at = cache.at(p, h / group);
                s.push(qh, &cache.k[at..at + d], &cache.v[at..at + d], scale);
            }
            for (o, a) in out[(i * n_heads + h) * d..][..d].iter_mut().zip(&s.acc) {
                *o = a / s.l;
            }
        }
    }
    out
}
