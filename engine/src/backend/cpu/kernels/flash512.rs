//! Tiled attention with an online softmax on AVX-512 (FlashAttention's scheme, as `flash` on
//! AVX2, register-blocked for 32 zmm registers): a tile of up to [`TILE`] queries (query rows ×
//! the query heads of one KV head) meets the keys a block of 16 positions at a time.
//!
//! Per key block:
//! - scores, [`QK_GROUP`] queries at a time: each key element (16 positions in one vector, the
//!   keys being stored transposed) is widened once per group and met by every query of the group,
//!   two chains a query (even and odd elements), the query element broadcast from memory;
//! - each query's softmax step: a block maximum above the running one rescales the query's running
//!   sum and weighted sum of values by `exp(old - new)`; the weights `exp(score - max)`;
//! - the weighted sum of values, `24 / NV` queries at a time with their accumulators in
//!   registers: each value vector (widened once per tile into a scratch block) meets every query
//!   of the group, the weight broadcast from memory.
//!
//! Keys and values are read once per tile (48 queries: 16 rows × 3 heads in a prefill task)
//! instead of once per row, so a long context streams from L3 at a fraction of a byte per FMA
//! and the kernel stays compute-bound at any length; the per-row kernel read 256 bytes per
//! position per row and fell out of L2 beyond 4,096 positions.
//!
//! Every query runs the same operations in the same order whatever tile, group, task or call it
//! is in: it takes the blocks below its own causal limit, its lanes past the limit score -inf
//! (weight 0), and it meets all 16 value rows of a block (past the tile's last position zeros),
//! so prefill rows, chunked prefill rows and decode rows give identical bits.

use std::arch::x86_64::*;

use super::flash::{prefetch_next_block, tile_queries, with_group, Call, Tile, BLOCK};
use super::vexp::softmax::{C, LOG2E_HI, LOG2E_LO};
use super::KvHead;

/// Most queries in one tile.
pub(super) const TILE: usize = 48;
/// Most queries in a small tile (a decode row of a 3- or 4-head group).
pub(super) const SMALL_TILE: usize = 4;
/// Queries whose scores are computed together: two chains each, 24 zmm registers.
const QK_GROUP: usize = 12;
/// zmm registers for value accumulators in the weighted sum (`24 / NV` queries a group).
pub(super) const PV_REGS: usize = 24;

/// Sixteen f16 values (bits) at `p`, widened.
///
/// # Safety
/// AVX-512 F; 16 readable halves at `p`.
#[inline(always)]
pub(super) unsafe fn load_f16(p: *const u16) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

/// `exp(x)` of 16 lanes for `x <= 0` (a softmax weight), within 2 ulps of `f32::exp`: `2^(x
/// log2 e)` split into `2^n` (`vscalefps`) and `2^f`, `|f| <= 1/2`, by its Taylor polynomial of
/// degree 7 (error below 1e-8 relative), `f` from `x` with `log2 e` in two parts. Below -150 the
/// result is exactly 0 (the weight of a masked lane, -inf, included). 13 instructions against the
/// 40 of glibc's algorithm in f64 (`vexp`), which made a third of this kernel's time.
#[target_feature(enable = "avx512f")]
#[inline]
fn exp16(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-150.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E_HI)),
    );
    let f = _mm512_fmsub_ps(x, _mm512_set1_ps(LOG2E_HI), n);
    let f = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E_LO), f);
    let mut p = _mm512_set1_ps(C[0]);
    for &c in &C[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_scalef_ps(p, n)
}

/// The entry of a tiled kernel: `run`, which takes a call's heads of 2, 4 or 8 vectors to the
/// kernel's `tile::<NV, T>` in the tiles of [`tiles_of`] (a decode row's few queries in a small
/// tile, whose scratch costs little to set up: a full tile's 25 KB made a decode call at 64
/// positions 60% slower), all under the kernel's target features.
macro_rules! tiled_run {
    ($features:literal, $what:literal) => {
        #[doc = concat!("Runs a call on ", $what, ".")]
        ///
        /// # Safety
        /// The CPU has the function's target features; the shape is one
        /// [`super::flash::takes`]; the blocks of every position used lie inside both caches
        /// (checked by [`super::attend_rows`]), `c.q` holds every row's heads, `out` holds the
        /// rows' outputs.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn run(kv: &KvHead, c: &Call, out: &mut [f32]) {
            // SAFETY: forwarded; `takes` allowed heads of 2, 4 or 8 vectors.
            unsafe {
                match c.hd / 16 {
                    2 => tiles::<2>(kv, c, out),
                    4 => tiles::<4>(kv, c, out),
                    8 => tiles::<8>(kv, c, out),
                    nv => unreachable!("head of {nv} vectors"),
                }
            }
        }

        /// As [`run`], with `c.hd == 16 * NV`.
        ///
        /// # Safety
        /// As [`run`].
        #[target_feature(enable = $features)]
        unsafe fn tiles<const NV: usize>(kv: &KvHead, c: &Call, out: &mut [f32]) {
            use $crate::backend::cpu::kernels::flash512::{SMALL_TILE, TILE};
            for t in $crate::backend::cpu::kernels::flash::tiles_of(c, out, TILE) {
                // SAFETY: the tile's rows and heads exist and hold at most `TILE` queries.
                unsafe {
                    if t.queries() <= SMALL_TILE {
                        tile::<NV, SMALL_TILE>(kv, c, t, out)
                    } else {
                        tile::<NV, TILE>(kv, c, t, out)
                    }
                };
            }
        }
    };
}
pub(super) use tiled_run;

tiled_run!("avx512f,avx512bw,avx512vl", "AVX-512 F/BW/VL");

/// One tile's running softmax: per query the maximum score so far, the sum of weights (16
/// lanes) and the weighted sum of values (`NV` vectors).
pub(super) struct Running<const NV: usize, const T: usize> {
    pub max: [f32; T],
    pub sum: [__m512; T],
    pub acc: [[__m512; NV]; T],
}

impl<const NV: usize, const T: usize> Running<NV, T> {
    #[target_feature(enable = "avx512f")]
    pub fn new() -> Self {
        Running {
            max: [f32::NEG_INFINITY; T],
            sum: [_mm512_setzero_ps(); T],
            acc: [[_mm512_setzero_ps(); NV]; T],
        }
    }

    /// The softmax step of block `b` for queries `first..nq` (their raw scores in `score`): a
    /// block maximum above the running one rescales what came before by `exp(old - new)`; the
    /// weights `exp(score - max)`, 0 past the query's limit, go to `w`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        scale: f32,
        b: usize,
        first: usize,
        nq: usize,
        limit: &[usize; T],
        score: &[__m512; T],
        w: &mut [[f32; BLOCK]; T],
    ) {
        let scale = _mm512_set1_ps(scale);
        for i in first..nq {
            let live = (limit[i] - BLOCK * b).min(BLOCK);
            let mut sc = _mm512_mul_ps(score[i], scale);
            if live < BLOCK {
                let keep = ((1u32 << live) - 1) as __mmask16;
                sc = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), keep, sc);
            }
            // When the maximum stays, nothing is rescaled.
            if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(sc, _mm512_set1_ps(self.max[i])) != 0 {
                let m = _mm512_reduce_max_ps(sc);
                let alpha = _mm512_set1_ps((self.max[i] - m).exp());
                self.max[i] = m;
                self.sum[i] = _mm512_mul_ps(self.sum[i], alpha);
                for a in self.acc[i].iter_mut() {
                    *a = _mm512_mul_ps(*a, alpha);
                }
            }
            // Past `live` the weights are exp(-inf) = 0.
            let e = exp16(_mm512_sub_ps(sc, _mm512_set1_ps(self.max[i])));
            self.sum[i] = _mm512_add_ps(self.sum[i], e);
            // SAFETY: 16 floats of `w[i]`.
            unsafe { _mm512_storeu_ps(w[i].as_mut_ptr(), e) };
        }
    }

    /// Each query's weighted sum over its sum of weights, into the call's output.
    ///
    /// # Safety
    /// The tile's rows and heads exist in `out`; `c.hd == 16 * NV`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub unsafe fn finish(&self, c: &Call, t: Tile, out: &mut [f32]) {
        for i in 0..t.queries() {
            let total = _mm512_set1_ps(_mm512_reduce_add_ps(self.sum[i]));
            let (r, g) = (t.r0 + i / t.ng, t.g0 + i % t.ng);
            let dst = out[(r * c.heads + g) * c.hd..][..c.hd].as_mut_ptr();
            for (j, &a) in self.acc[i].iter().enumerate() {
                // SAFETY: the query's output holds `hd = 16 * NV` floats.
                unsafe { _mm512_storeu_ps(dst.add(16 * j), _mm512_div_ps(a, total)) };
            }
        }
    }
}

/// The queries of tile `t`: their outputs in `out`.
///
/// # Safety
/// As [`run`]; the tile's rows and heads exist; `t.queries() <= T`; `c.hd == 16 * NV`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile<const NV: usize, const T: usize>(kv: &KvHead, c: &Call, t: Tile, out: &mut [f32]) {
    let (hd, nq) = (c.hd, t.queries());
    debug_assert!(hd == 16 * NV && nq <= T);
    let (qs, limit) = tile_queries::<T>(c, t);
    let mut run = Running::<NV, T>::new();
    let mut score = [_mm512_setzero_ps(); T];
    let mut w = [[0f32; BLOCK]; T];
    let mut vals = [[_mm512_setzero_ps(); NV]; BLOCK];
    let pv_group = PV_REGS / NV;
    let (kp, vp) = (kv.k.as_ptr(), kv.v.as_ptr());
    let n_blocks = limit[nq - 1].div_ceil(BLOCK);
    for b in 0..n_blocks {
        let base = kv.blocks[b] as usize * kv.block_stride;
        prefetch_next_block(kv, n_blocks, b);
        // The queries from `first` on reach this block.
        let first = limit[..nq].partition_point(|&l| l <= BLOCK * b);
        // SAFETY: the block's keys lie inside the key cache (caller's promise); each query holds
        // `hd` floats; `score` has a slot per query.
        unsafe {
            let keys = kp.add(base);
            let mut i = first;
            while i < nq {
                let g = QK_GROUP.min(nq - i);
                with_group!(g, QK_GROUP, G => scores::<G>(keys, &qs[i..], hd, &mut score[i..]);
                    1 2 3 4 5 6 7 8 9 10 11 12);
                i += g;
            }
        }
        run.step(c.scale, b, first, nq, &limit, &score, &mut w);
        // The block's values: past the tile's last position zeros (a cache slot not yet written
        // may hold anything, and weighs 0). Widened once into `vals` when more than one group
        // of queries reads them.
        let tile_live = (limit[nq - 1] - BLOCK * b).min(BLOCK);
        let values = vp.wrapping_add(base);
        let widen = nq - first > pv_group;
        if widen {
            for (p, row) in vals.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = if p < tile_live {
                        // SAFETY: position `p` of the block was written (below the tile's last
                        // limit) and lies inside the value cache.
                        unsafe { load_f16(values.add(p * hd + 16 * j)) }
                    } else {
                        _mm512_setzero_ps()
                    };
                }
            }
        }
        let mut i = first;
        while i < nq {
            let g = pv_group.min(nq - i);
            let src = if widen {
                Values::Wide(&vals)
            } else {
                Values::Cache { values, tile_live }
            };
            // SAFETY: `w` and `acc` hold slots `i..i + g`; the values as above.
            unsafe {
                with_group!(g, pv_group, G => weigh::<NV, G>(src, &w[i..], hd, &mut run.acc[i..]);
                    1 2 3 4 5 6 7 8 9 10 11 12);
            }
            i += g;
        }
    }
    // SAFETY: the tile's rows and heads exist (caller's promise).
    unsafe { run.finish(c, t, out) };
}

/// The raw scores (before scaling) of `G` queries for a block's 16 positions: per key element
/// `d`, one widened load of the 16 keys' element `d` and an FMA with `q[d]` broadcast for each
/// query, in two chains a query (even and odd `d`), added at the end.
///
/// # Safety
/// AVX-512 F; `keys` is a block of `hd * 16` transposed keys; each of the first `G` queries
/// holds `hd` floats, `hd` even; `out` has `G` slots.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn scores<const G: usize>(
    keys: *const u16,
    q: &[*const f32],
    hd: usize,
    out: &mut [__m512],
) {
    let q: [*const f32; G] = std::array::from_fn(|g| q[g]);
    let mut even = [_mm512_setzero_ps(); G];
    let mut odd = [_mm512_setzero_ps(); G];
    for d in (0..hd).step_by(2) {
        // SAFETY: elements `d, d + 1 < hd` of the keys and queries (caller's promise).
        unsafe {
            let k0 = load_f16(keys.add(BLOCK * d));
            let k1 = load_f16(keys.add(BLOCK * (d + 1)));
            for g in 0..G {
                even[g] = _mm512_fmadd_ps(_mm512_set1_ps(*q[g].add(d)), k0, even[g]);
                odd[g] = _mm512_fmadd_ps(_mm512_set1_ps(*q[g].add(d + 1)), k1, odd[g]);
            }
        }
    }
    for g in 0..G {
        out[g] = _mm512_add_ps(even[g], odd[g]);
    }
}

/// Where a block's values come from in [`weigh`].
#[derive(Clone, Copy)]
enum Values<'a, const NV: usize> {
    /// Widened once for the tile (zeros past its last position).
    Wide(&'a [[__m512; NV]; BLOCK]),
    /// Straight from the cache, positions from `tile_live` on as zeros.
    Cache {
        values: *const u16,
        tile_live: usize,
    },
}

/// Adds the block's weighted values to the accumulators of `G` queries: per position, the value
/// vectors meet each query's weight broadcast, in position order.
///
/// # Safety
/// AVX-512 F; `w` and `acc` have `G` slots; a `Values::Cache` block holds `16 * hd` values,
/// written below `tile_live`; `hd == 16 * NV`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn weigh<const NV: usize, const G: usize>(
    src: Values<NV>,
    w: &[[f32; BLOCK]],
    hd: usize,
    acc: &mut [[__m512; NV]],
) {
    let mut a: [[__m512; NV]; G] = std::array::from_fn(|g| acc[g]);
    for p in 0..BLOCK {
        let v: [__m512; NV] = match src {
            Values::Wide(rows) => std::array::from_fn(|j| rows[p][j]),
            Values::Cache { values, tile_live } if p < tile_live => {
                // SAFETY: position `p` of the block (caller's promise).
                std::array::from_fn(|j| unsafe { load_f16(values.add(p * hd + 16 * j)) })
            }
            Values::Cache { .. } => [_mm512_setzero_ps(); NV],
        };
        for g in 0..G {
            let wp = _mm512_set1_ps(w[g][p]);
            for j in 0..NV {
                a[g][j] = _mm512_fmadd_ps(wp, v[j], a[g][j]);
            }
        }
    }
    acc[..G].copy_from_slice(&a);
}

/// [`exp16`] of 16 values, for tests.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp16_for_test(x: &[f32; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: 16 floats each.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp16(_mm512_loadu_ps(x.as_ptr()))) };
    out
}
