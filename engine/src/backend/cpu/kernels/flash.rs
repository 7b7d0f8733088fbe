//! Tiled attention with an online softmax (FlashAttention's scheme, on the CPU): a tile of query
//! rows × the query heads of one KV head meets the keys a block of 16 positions at a time.
//!
//! Per key block, each key element (16 positions in one vector, the keys being stored transposed)
//! is loaded and widened once and met by every query of the tile (one FMA each), and the block's
//! values are widened once into a scratch block that every query of the tile then reads. Each
//! query keeps a running maximum `m`, a running sum `l` (in 16 lanes) and its weighted sum of
//! values `acc`; a block whose maximum exceeds `m` rescales them by `exp(m - m')`. Keys and values
//! are read once per tile instead of once per query row, and no scores are stored: the cost is
//! that of two small matrix products per block.
//!
//! Every query row runs the same operations in the same order whatever tile, task or call it is
//! in (its own causal limit decides which blocks and lanes it takes), so prefill rows, chunked
//! prefill rows and decode rows give identical bits, and a row's result does not depend on the
//! batch. The kernel is written once over [`F16x16`]; AVX2 instantiates it. AVX-512 has its own
//! register-blocked twin of the scheme in `flash512` (larger tiles, broadcasts from memory).

use super::simd16::F16x16;
#[cfg(target_arch = "x86_64")]
use super::ymm2::Ymm2;
use super::KvHead;

/// Positions per key block (the KV cache's block size, which the transposed keys assume).
pub(super) const BLOCK: usize = 16;

/// Asks for the cache line at `p` into L1.
#[inline(always)]
fn prefetch(p: *const u16) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
}

/// Asks for block `b + 1`'s keys and values (each a contiguous run) ahead of use, if it is one
/// of the first `n_blocks`.
#[inline(always)]
pub(super) fn prefetch_next_block(kv: &KvHead, n_blocks: usize, b: usize) {
    if let Some(&next) = kv.blocks[..n_blocks].get(b + 1) {
        let next = next as usize * kv.block_stride;
        for l in (0..BLOCK * kv.head_dim).step_by(32) {
            prefetch(kv.k.as_ptr().wrapping_add(next + l));
            prefetch(kv.v.as_ptr().wrapping_add(next + l));
        }
    }
}

/// The shape of one call: see [`super::attend_rows`].
pub(super) struct Call<'a> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub hd: usize,
    pub heads: usize,
    pub n_ctx0: usize,
    pub scale: f32,
}

/// Whether the tiled kernel takes this shape (16-position blocks, heads of 32, 64 or 128).
pub(super) fn takes(hd: usize, block_size: usize) -> bool {
    block_size == BLOCK && matches!(hd, 32 | 64 | 128)
}

/// Runs a call on AVX2.
#[cfg(target_arch = "x86_64")]
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the shape is one [`takes`]; the blocks of every position used
/// lie inside both caches (checked by [`super::attend_rows`]), `c.q` holds every row's heads,
/// `out` holds the rows' outputs.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_avx2(kv: &KvHead, c: &Call, out: &mut [f32]) {
    // 6 score vectors (12 of the 16 ymm registers): two rows of a 3-head group; one query at a
    // time in the weighted sum of values. (One row with two chains a query: 118 against 102 ms
    // for 4,096 positions of one KV head, kernel_bench; decode 5% faster.)
    // SAFETY: forwarded.
    unsafe { tiles::<Ymm2, 6, 1>(kv, c, out) }
}

/// The call's rows in tiles of up to `RH / heads` rows (at least one) × all heads (in groups of
/// `RH` when there are more), `G` queries at a time in the weighted sum of values.
///
/// # Safety
/// As [`run`], with `V`'s features.
#[inline(always)]
unsafe fn tiles<V: F16x16, const RH: usize, const G: usize>(
    kv: &KvHead,
    c: &Call,
    out: &mut [f32],
) {
    let width = c.heads * c.hd;
    let n_rows = out.len() / width;
    let rows_per_tile = (RH / c.heads).max(1);
    let heads_per_tile = c.heads.min(RH);
    let mut r0 = 0;
    while r0 < n_rows {
        let nr = rows_per_tile.min(n_rows - r0);
        let mut g0 = 0;
        while g0 < c.heads {
            let ng = heads_per_tile.min(c.heads - g0);
            let t = Tile { r0, g0, ng };
            macro_rules! go {
                ($($nq:literal)*) => {
                    match (nr * ng, c.hd / 16) {
                        // SAFETY: rows `r0..r0 + nr` and heads `g0..g0 + ng` exist (forwarded
                        // contract), `nr * ng` queries; `takes` allowed 2, 4 or 8 vectors a head.
                        $(($nq, 2) if $nq <= RH => unsafe { tile::<V, $nq, 2, G>(kv, c, t, out) },
                        ($nq, 4) if $nq <= RH => unsafe { tile::<V, $nq, 4, G>(kv, c, t, out) },
                        ($nq, 8) if $nq <= RH => unsafe { tile::<V, $nq, 8, G>(kv, c, t, out) },)*
                        (n, nv) => unreachable!("tile of {n} queries of {nv} vectors"),
                    }
                };
            }
            go!(1 2 3 4 5 6 7 8 9 10 11 12);
            g0 += ng;
        }
        r0 += nr;
    }
}

/// Where a tile lies: rows from `r0`, heads `g0..g0 + ng`; query `i` is row `r0 + i / ng`, head
/// `g0 + i % ng`.
#[derive(Clone, Copy)]
struct Tile {
    r0: usize,
    g0: usize,
    ng: usize,
}

/// The `NQ` queries (of `NV` vectors) of tile `t`: their outputs in `out`.
///
/// # Safety
/// As [`run`], with `V`'s features; the tile's rows and heads exist; `c.hd == 16 * NV`.
#[inline(always)]
unsafe fn tile<V: F16x16, const NQ: usize, const NV: usize, const G: usize>(
    kv: &KvHead,
    c: &Call,
    t: Tile,
    out: &mut [f32],
) {
    let (hd, ng) = (c.hd, t.ng);
    debug_assert!(hd == 16 * NV);
    let qs: [*const f32; NQ] = std::array::from_fn(|i| {
        c.q[(t.r0 + i / ng) * c.q_stride + (t.g0 + i % ng) * hd..][..hd].as_ptr()
    });
    // Positions below `limit[i]` are query `i`'s (causal).
    let limit: [usize; NQ] = std::array::from_fn(|i| c.n_ctx0 + t.r0 + i / ng);
    let mut max = [f32::NEG_INFINITY; NQ];
    // SAFETY (whole body): `V`'s features are the caller's promise; every key and value read
    // lies in a block of the sequence's table below the last row's limit, inside both caches
    // (checked by `attend_rows`); scratch arrays are local.
    unsafe {
        let mut sum = [V::zero(); NQ];
        let mut acc = [[V::zero(); NV]; NQ];
        let mut vals = [[V::zero(); NV]; BLOCK];
        let mut w = [[0f32; BLOCK]; NQ];
        let (kp, vp) = (kv.k.as_ptr(), kv.v.as_ptr());
        let n_blocks = limit[NQ - 1].div_ceil(BLOCK);
        for b in 0..n_blocks {
            let base = kv.blocks[b] as usize * kv.block_stride;
            prefetch_next_block(kv, n_blocks, b);
            // The scores of the tile's queries for the block's 16 positions, one chain each,
            // each key vector widened once for all queries.
            let mut score = [V::zero(); NQ];
            for d in 0..hd {
                let k = V::load_f16(kp.add(base + BLOCK * d));
                for i in 0..NQ {
                    score[i] = V::splat(*qs[i].add(d)).fmadd(k, score[i]);
                }
            }
            // The block's values, widened once for the tile (unless one group of queries takes
            // them, widening each as it goes); past the tile's last position zeros (a cache slot
            // not yet written may hold anything, and weighs 0).
            let tile_live = (limit[NQ - 1] - BLOCK * b).min(BLOCK);
            let value = |p: usize| -> [V; NV] {
                if p < tile_live {
                    std::array::from_fn(|j| V::load_f16(vp.add(base + p * hd + 16 * j)))
                } else {
                    [V::zero(); NV]
                }
            };
            if NQ > G {
                for (p, row) in vals.iter_mut().enumerate() {
                    *row = value(p);
                }
            }
            // Each query's softmax step: new maximum, rescale, weights.
            let mut alpha = [1f32; NQ];
            let mut active = [false; NQ];
            for i in 0..NQ {
                let Some(live) = limit[i].checked_sub(BLOCK * b).filter(|&l| l > 0) else {
                    continue;
                };
                active[i] = true;
                let mut sc = score[i].mul(V::splat(c.scale));
                if live < BLOCK {
                    sc = sc.keep(live, f32::NEG_INFINITY);
                }
                // A new maximum rescales what came before by exp(old - new), which is exactly 1
                // when the maximum stays: then nothing is rescaled.
                if sc.any_gt(max[i]) {
                    let m = sc.max_lane();
                    alpha[i] = (max[i] - m).exp();
                    max[i] = m;
                    sum[i] = sum[i].mul(V::splat(alpha[i]));
                    for a in acc[i].iter_mut() {
                        *a = a.mul(V::splat(alpha[i]));
                    }
                }
                // Past `live` the weights are exp(-inf) = 0.
                let e = sc.sub(V::splat(max[i])).exp();
                sum[i] = sum[i].add(e);
                e.store(w[i].as_mut_ptr());
            }
            // The weighted sum of values, `G` queries sharing each value load; every query
            // takes all 16 positions (weights 0 past its own), so its sums are the same in any
            // tile.
            for i0 in (0..NQ).step_by(G) {
                for p in 0..BLOCK {
                    let v = if NQ > G { vals[p] } else { value(p) };
                    for i in i0..(i0 + G).min(NQ) {
                        if !active[i] {
                            continue;
                        }
                        let wp = V::splat(w[i][p]);
                        for j in 0..NV {
                            acc[i][j] = wp.fmadd(v[j], acc[i][j]);
                        }
                    }
                }
            }
        }
        for i in 0..NQ {
            let total = V::splat(sum[i].sum_lanes());
            let (r, g) = (t.r0 + i / ng, t.g0 + i % ng);
            let dst = out[(r * c.heads + g) * hd..][..hd].as_mut_ptr();
            for (j, a) in acc[i].iter().enumerate() {
                a.div(total).store(dst.add(16 * j));
            }
        }
    }
}
