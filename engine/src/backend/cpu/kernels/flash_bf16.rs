//! Tiled attention with an online softmax on AVX-512 BF16 (Zen 4, Cooper Lake, Sapphire Rapids
//! and later): `flash512`'s tiles, blocks and running softmax, with both small matrix products
//! of a block done by `vdpbf16ps`, which multiplies 32 pairs of bf16 and adds them into 16 f32
//! lanes: twice the multiply-adds of an f32 FMA per instruction.
//!
//! Per tile, each query is rounded once to bf16, as pairs of elements `(2d, 2d + 1)` in one
//! 32-bit word. Per key block:
//! - the block's keys (stored transposed: element `d` of 16 positions in a row) are rounded to
//!   bf16 and interleaved, rows `2d` and `2d + 1`, into 16 pairs a vector, once for the tile;
//!   the scores of [`QK_GROUP`] queries at a time are then one `vdpbf16ps` per pair of elements,
//!   the query's pair broadcast, in [`CHAINS`] chains a query;
//! - each query's softmax step is `flash512`'s ([`Running::step`]), on f32 scores; its 16 weights
//!   are rounded to 8 pairs of bf16;
//! - the block's values, rows `2p` and `2p + 1` interleaved the same way (zeros past the tile's
//!   last position), once for the tile, meet each query's weight pairs broadcast: one
//!   `vdpbf16ps` per pair of positions and vector of the head.
//!
//! Sums stay f32; only the factors are rounded (8 bits of mantissa against f16's 11), which is
//! what llama.cpp's CPU flash attention does with f16. Every query runs the same operations in
//! the same order whatever tile, group, task or call it is in, so rows are batch invariant as in
//! `flash512`.

use std::arch::x86_64::*;

use super::flash::{prefetch_next_block, tile_queries, with_group, Call, Tile, BLOCK};
use super::flash512::{load_f16, tiled_run, Running, PV_REGS};
use super::KvHead;

/// Chains of multiply-adds a query's scores take.
const CHAINS: usize = 2;
/// Queries whose scores are computed together: 24 zmm registers of chains.
const QK_GROUP: usize = 24 / CHAINS;
/// Pairs of positions in a block.
const PAIRS: usize = BLOCK / 2;

/// Interleaves the bf16 roundings of two rows of 16 floats: word `i` holds `lo[i]` in its low
/// half and `hi[i]` in its high half, the pair `vdpbf16ps` multiplies.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn pair_rows(lo: __m512, hi: __m512) -> __m512i {
    // Halves 0..16 of `packed` are `lo`'s, 16..32 `hi`'s; half `2i` of the result takes `lo[i]`,
    // half `2i + 1` takes `hi[i]`.
    const ORDER: [u16; 32] = {
        let mut o = [0u16; 32];
        let mut i = 0;
        while i < 16 {
            o[2 * i] = i as u16;
            o[2 * i + 1] = 16 + i as u16;
            i += 1;
        }
        o
    };
    let packed = bits(_mm512_cvtne2ps_pbh(hi, lo));
    // SAFETY: `ORDER` is 64 readable bytes.
    let order = unsafe { _mm512_loadu_si512(ORDER.as_ptr() as *const _) };
    _mm512_permutexvar_epi16(order, packed)
}

/// A vector of 32 bf16 as plain bits.
#[inline(always)]
pub(super) fn bits(v: __m512bh) -> __m512i {
    // SAFETY: both are 64 bytes of plain data with no invalid bit patterns.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// 64 bytes of bits as 32 bf16.
#[inline(always)]
fn bf16s(v: __m512i) -> __m512bh {
    // SAFETY: as in `bits`.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// One 32-bit word (a pair of bf16) in every lane.
#[target_feature(enable = "avx512f")]
#[inline]
fn splat_pair(w: u32) -> __m512bh {
    bf16s(_mm512_set1_epi32(w as i32))
}

tiled_run!(
    "avx512f,avx512bw,avx512vl,avx512bf16",
    "AVX-512 F/BW/VL/BF16"
);

/// The queries of tile `t`: their outputs in `out`.
///
/// # Safety
/// As [`run`]; the tile's rows and heads exist; `t.queries() <= T`; `c.hd == 16 * NV`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn tile<const NV: usize, const T: usize>(kv: &KvHead, c: &Call, t: Tile, out: &mut [f32]) {
    let (hd, nq) = (c.hd, t.queries());
    debug_assert!(hd == 16 * NV && nq <= T);
    let (qs, limit) = tile_queries::<T>(c, t);
    // Each query as bf16 pairs of elements (`hd / 2 = 8 * NV` words), 32 elements at a time.
    let mut qb = [[[0u32; 8]; NV]; T];
    for (q, pairs) in qs[..nq].iter().zip(qb.iter_mut()) {
        for (j, pair) in pairs.chunks_exact_mut(2).enumerate() {
            // SAFETY: the query holds `hd = 16 * NV` floats; `pair` holds 16 words.
            unsafe {
                let lo = _mm512_loadu_ps(q.add(32 * j));
                let hi = _mm512_loadu_ps(q.add(32 * j + 16));
                let packed = bits(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(pair.as_mut_ptr() as *mut _, packed);
            }
        }
    }
    let mut run = Running::<NV, T>::new();
    let mut score = [_mm512_setzero_ps(); T];
    let mut w = [[0f32; BLOCK]; T];
    let mut wb = [[0u32; PAIRS]; T];
    let mut kb = [[_mm512_setzero_si512(); 8]; NV];
    let mut vb = [[_mm512_setzero_si512(); NV]; PAIRS];
    let pv_group = PV_REGS / NV;
    let (kp, vp) = (kv.k.as_ptr(), kv.v.as_ptr());
    let n_blocks = limit[nq - 1].div_ceil(BLOCK);
    for b in 0..n_blocks {
        let base = kv.blocks[b] as usize * kv.block_stride;
        prefetch_next_block(kv, n_blocks, b);
        // The queries from `first` on reach this block.
        let first = limit[..nq].partition_point(|&l| l <= BLOCK * b);
        let keys = kp.wrapping_add(base);
        for (dp, k) in kb.as_flattened_mut().iter_mut().enumerate() {
            // SAFETY: the block's `hd * 16` keys lie inside the key cache (caller's promise).
            *k = unsafe {
                pair_rows(
                    load_f16(keys.add(BLOCK * 2 * dp)),
                    load_f16(keys.add(BLOCK * (2 * dp + 1))),
                )
            };
        }
        let mut i = first;
        while i < nq {
            let g = QK_GROUP.min(nq - i);
            with_group!(g, QK_GROUP, G => scores::<NV, G>(&kb, &qb[i..], &mut score[i..]);
                1 2 3 4 5 6 7 8 9 10 11 12);
            i += g;
        }
        run.step(c.scale, b, first, nq, &limit, &score, &mut w);
        for (wi, pairs) in w[first..nq].iter().zip(wb[first..nq].iter_mut()) {
            // SAFETY: 16 floats in, 8 words (32 bytes) out.
            unsafe {
                let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(wi.as_ptr()));
                _mm256_storeu_si256(
                    pairs.as_mut_ptr() as *mut __m256i,
                    std::mem::transmute::<__m256bh, __m256i>(h),
                );
            }
        }
        // The block's values: past the tile's last position zeros (a cache slot not yet written
        // may hold anything, and weighs 0).
        let tile_live = (limit[nq - 1] - BLOCK * b).min(BLOCK);
        let values = vp.wrapping_add(base);
        let row = |p: usize, j: usize| {
            if p < tile_live {
                // SAFETY: position `p` of the block was written (below the tile's last limit)
                // and lies inside the value cache.
                unsafe { load_f16(values.add(p * hd + 16 * j)) }
            } else {
                _mm512_setzero_ps()
            }
        };
        for (pp, pair) in vb.iter_mut().enumerate() {
            for (j, v) in pair.iter_mut().enumerate() {
                *v = pair_rows(row(2 * pp, j), row(2 * pp + 1, j));
            }
        }
        let mut i = first;
        while i < nq {
            let g = pv_group.min(nq - i);
            with_group!(g, pv_group, G => weigh::<NV, G>(&vb, &wb[i..], &mut run.acc[i..]);
                1 2 3 4 5 6 7 8 9 10 11 12);
            i += g;
        }
    }
    // SAFETY: the tile's rows and heads exist (caller's promise).
    unsafe { run.finish(c, t, out) };
}

/// The raw scores (before scaling) of `G` queries for a block's 16 positions: per pair of key
/// elements one `vdpbf16ps` a query, its pair broadcast, in [`CHAINS`] chains a query (pair `dp`
/// in chain `dp % CHAINS`), added at the end in chain order. A decode row's 3 or 4 queries would
/// otherwise wait on one chain's latency.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn scores<const NV: usize, const G: usize>(
    kb: &[[__m512i; 8]; NV],
    qb: &[[[u32; 8]; NV]],
    out: &mut [__m512],
) {
    let mut acc = [[_mm512_setzero_ps(); CHAINS]; G];
    // Pair `dp = 8 j + e` goes to chain `e % CHAINS` (8 is a multiple of `CHAINS`).
    for j in 0..NV {
        for e0 in (0..8).step_by(CHAINS) {
            for c in 0..CHAINS {
                let k = bf16s(kb[j][e0 + c]);
                for g in 0..G {
                    acc[g][c] = _mm512_dpbf16_ps(acc[g][c], k, splat_pair(qb[g][j][e0 + c]));
                }
            }
        }
    }
    for g in 0..G {
        out[g] = acc[g][1..]
            .iter()
            .fold(acc[g][0], |s, &a| _mm512_add_ps(s, a));
    }
}

/// Adds the block's weighted values to the accumulators of `G` queries: per pair of positions,
/// the value pairs meet each query's weight pair broadcast, in position order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn weigh<const NV: usize, const G: usize>(
    vb: &[[__m512i; NV]; PAIRS],
    wb: &[[u32; PAIRS]],
    acc: &mut [[__m512; NV]],
) {
    let mut a: [[__m512; NV]; G] = std::array::from_fn(|g| acc[g]);
    for (pp, pair) in vb.iter().enumerate() {
        let v: [__m512bh; NV] = std::array::from_fn(|j| bf16s(pair[j]));
        for g in 0..G {
            let wp = splat_pair(wb[g][pp]);
            for j in 0..NV {
                a[g][j] = _mm512_dpbf16_ps(a[g][j], v[j], wp);
            }
        }
    }
    acc[..G].copy_from_slice(&a);
}
