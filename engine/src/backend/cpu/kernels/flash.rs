//! Tiled attention with an online softmax (FlashAttention's scheme, on the CPU), written once over
//! [`F16x16`] (AVX2 instantiates it with two ymm registers; a NEON file would with four q
//! registers): a tile of up to 48 queries (query rows × the query heads of one KV head: a prefill
//! task's 16 rows × 3 heads) meets the keys a block of 16 positions at a time.
//!
//! Per key block:
//! - scores, a few queries at a time (6 on AVX2: 12 ymm registers, one chain a query): each key
//!   element (16 positions in one vector, the keys being stored transposed) is widened once per
//!   group and met by every query of the group; the block's 2 KB of keys come from memory for the
//!   first group and from L1 for the others;
//! - each query's softmax step: a block maximum above the running one rescales the query's running
//!   sum and weighted sum of values by `exp(old - new)`; the weights `exp(score - max)`;
//! - the weighted sum of values, two queries × 32 floats of their heads at a time in a full tile
//!   (8 ymm of accumulators on AVX2): each value vector (widened once per tile into a scratch
//!   block) meets every query of the group. Against one query of 64 floats a group, this halves
//!   the value loads (two FMAs a load), and a 4,096- and 8,192-position prefill's attention took
//!   6–7% less time on Zen 3. A decode row's 3 or 4 queries (a small tile) meet each value vector
//!   all together, 16 floats of their heads at a time, widened in registers: no scratch.
//!
//! Keys and values are read from L3 once per tile instead of once per query row, and no scores are
//! stored: the cost is that of two small matrix products per block.
//!
//! Every query runs the same operations in the same order whatever tile, group, task or call it
//! is in: it takes the blocks below its own causal limit, its lanes past the limit score -inf
//! (weight 0), and it meets all 16 value rows of a block (past the tile's last position zeros),
//! so prefill rows, chunked prefill rows and decode rows give identical bits, and a row's result
//! does not depend on the batch. AVX-512 has its own register-blocked twin in `flash512` (32
//! registers, broadcasts from memory).

use super::simd16::F16x16;
#[cfg(target_arch = "x86_64")]
use super::ymm2::Ymm2;
use super::KvHead;

/// Positions per key block (the KV cache's block size, which the transposed keys assume).
pub(super) const BLOCK: usize = 16;

/// Evaluates `$call` with `$G` a constant equal to `$g`, one of the literals `$n` and at most
/// `$most`: the group kernels take their group's size as a const generic, so that its
/// accumulators live in registers. Each literal is one instance of the kernel.
macro_rules! with_group {
    ($g:expr, $most:expr, $G:ident => $call:expr; $($n:literal)*) => {
        match $g {
            $($n if $n <= $most => {
                const $G: usize = $n;
                $call
            })*
            g => unreachable!("group of {g} queries"),
        }
    };
}
pub(super) use with_group;

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
    // Scores 6 queries at a time (12 of the 16 ymm registers, one chain a query); values as
    // `PV_QUERIES` × `PV_CHUNK` (8 ymm of accumulators).
    // SAFETY: forwarded.
    unsafe { tiles::<Ymm2, 6>(kv, c, out) }
}

/// Most queries in one tile: a prefill task's 16 rows × 3 heads, so that a long context's keys
/// and values stream from L3 once per 48 queries (not once per 6, which made 8,192 positions
/// 5.5× the attention time of 4,096 on a Zen 3 with 512 KB of L2 a core).
const TILE: usize = 48;
/// The weighted sum of values goes `PV_QUERIES` queries × `PV_CHUNK` of their vectors at a time:
/// each value vector loaded meets two weights.
const PV_QUERIES: usize = 2;
const PV_CHUNK: usize = 2;
/// A query left alone takes as many vectors at a time (the same 8 ymm).
const LONE_CHUNK: usize = PV_QUERIES * PV_CHUNK;
/// Most queries in a small tile (a decode row of a 3- or 4-head group): few enough to meet the
/// values all at once, 16 floats of each at a time (at most 8 ymm of accumulators on AVX2).
const SMALL_TILE: usize = 4;

/// The call's rows in tiles of up to `TILE / heads` rows (at least one) × all heads (in groups
/// of `TILE` when there are more); scores `QK` queries at a time.
///
/// # Safety
/// As [`run_avx2`], with `V`'s features.
#[inline(always)]
unsafe fn tiles<V: F16x16, const QK: usize>(kv: &KvHead, c: &Call, out: &mut [f32]) {
    // SAFETY: forwarded; `takes` allowed heads of 2, 4 or 8 vectors.
    unsafe {
        match c.hd / 16 {
            2 => tiles_nv::<V, 2, QK>(kv, c, out),
            4 => tiles_nv::<V, 4, QK>(kv, c, out),
            8 => tiles_nv::<V, 8, QK>(kv, c, out),
            nv => unreachable!("head of {nv} vectors"),
        }
    }
}

/// [`tiles`] for heads of `NV` vectors.
///
/// # Safety
/// As [`tiles`], with `c.hd == 16 * NV`.
#[inline(always)]
unsafe fn tiles_nv<V: F16x16, const NV: usize, const QK: usize>(
    kv: &KvHead,
    c: &Call,
    out: &mut [f32],
) {
    for t in tiles_of(c, out, TILE) {
        // SAFETY: the tile's rows and heads exist; it holds at most `TILE` queries.
        unsafe {
            if t.queries() <= SMALL_TILE {
                tile::<V, NV, SMALL_TILE, QK>(kv, c, t, out)
            } else {
                tile::<V, NV, TILE, QK>(kv, c, t, out)
            }
        }
    }
}

/// Where a tile lies: rows `r0..r0 + nr`, heads `g0..g0 + ng`; query `i` is row `r0 + i / ng`,
/// head `g0 + i % ng`.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub r0: usize,
    pub nr: usize,
    pub g0: usize,
    pub ng: usize,
}

impl Tile {
    pub fn queries(self) -> usize {
        self.nr * self.ng
    }
}

/// A call's rows in tiles of up to `most / heads` rows (at least one) × all heads (in groups of
/// `most` when there are more), in order.
pub(super) fn tiles_of(c: &Call, out: &[f32], most: usize) -> impl Iterator<Item = Tile> {
    let n_rows = out.len() / (c.heads * c.hd);
    let rows_per_tile = (most / c.heads).max(1);
    let heads_per_tile = c.heads.min(most);
    let heads = c.heads;
    (0..n_rows).step_by(rows_per_tile).flat_map(move |r0| {
        let nr = rows_per_tile.min(n_rows - r0);
        (0..heads).step_by(heads_per_tile).map(move |g0| Tile {
            r0,
            nr,
            g0,
            ng: heads_per_tile.min(heads - g0),
        })
    })
}

/// A tile's queries and their causal limits: positions below `limit[i]` are query `i`'s
/// (non-decreasing in `i`).
pub(super) fn tile_queries<const T: usize>(c: &Call, t: Tile) -> ([*const f32; T], [usize; T]) {
    let mut qs = [std::ptr::null::<f32>(); T];
    let mut limit = [0usize; T];
    for i in 0..t.queries() {
        let (r, g) = (t.r0 + i / t.ng, t.g0 + i % t.ng);
        qs[i] = c.q[r * c.q_stride + g * c.hd..][..c.hd].as_ptr();
        limit[i] = c.n_ctx0 + r;
    }
    (qs, limit)
}

/// The queries of tile `t` (at most `T`, of `NV` vectors): their outputs in `out`.
///
/// # Safety
/// As [`tiles`]; the tile's rows and heads exist; `t.queries() <= T`; `c.hd == 16 * NV`.
#[inline(always)]
unsafe fn tile<V: F16x16, const NV: usize, const T: usize, const QK: usize>(
    kv: &KvHead,
    c: &Call,
    t: Tile,
    out: &mut [f32],
) {
    let (hd, nq) = (c.hd, t.queries());
    debug_assert!(hd == 16 * NV && nq <= T);
    let (qs, limit) = tile_queries::<T>(c, t);
    let (kp, vp) = (kv.k.as_ptr(), kv.v.as_ptr());
    let n_blocks = limit[nq - 1].div_ceil(BLOCK);
    // SAFETY (whole body): `V`'s features are the caller's promise; every key and value read
    // lies in a block of the sequence's table below the last query's limit, inside both caches
    // (checked by `attend_rows`); each query holds `hd` floats; scratch arrays are local.
    unsafe {
        let mut max = [f32::NEG_INFINITY; T];
        let mut sum = [V::zero(); T];
        let mut acc = [[V::zero(); NV]; T];
        let mut score = [V::zero(); T];
        let mut w = [[0f32; BLOCK]; T];
        let mut vals = [[V::zero(); NV]; BLOCK];
        for b in 0..n_blocks {
            let base = kv.blocks[b] as usize * kv.block_stride;
            prefetch_next_block(kv, n_blocks, b);
            // The queries from `first` on reach this block.
            let first = limit[..nq].partition_point(|&l| l <= BLOCK * b);
            // Scores, `QK` queries at a time: the block's keys (2 KB at 64 floats a head) come
            // from memory for the first group and from L1 for the others.
            let keys = kp.add(base);
            let mut i = first;
            while i < nq {
                let g = QK.min(nq - i);
                with_group!(g, QK, G => scores::<V, G>(keys, &qs[i..], hd, &mut score[i..]);
                    1 2 3 4 5 6 7 8 9 10 11 12);
                i += g;
            }
            // Each query's softmax step: new maximum, rescale, weights.
            for i in first..nq {
                let live = (limit[i] - BLOCK * b).min(BLOCK);
                let mut sc = score[i].mul(V::splat(c.scale));
                if live < BLOCK {
                    sc = sc.keep(live, f32::NEG_INFINITY);
                }
                // A new maximum rescales what came before by exp(old - new); when the maximum
                // stays, nothing is rescaled.
                if sc.any_gt(max[i]) {
                    let m = sc.max_lane();
                    let alpha = V::splat((max[i] - m).exp());
                    max[i] = m;
                    sum[i] = sum[i].mul(alpha);
                    for a in acc[i].iter_mut() {
                        *a = a.mul(alpha);
                    }
                }
                // Past `live` the weights are exp(-inf) = 0.
                let e = sc.sub(V::splat(max[i])).exp();
                sum[i] = sum[i].add(e);
                e.store(w[i].as_mut_ptr());
            }
            // The block's values: past the tile's last position zeros (a cache slot not yet
            // written may hold anything, and weighs 0).
            let tile_live = (limit[nq - 1] - BLOCK * b).min(BLOCK);
            let src = Values {
                values: vp.add(base),
                tile_live,
            };
            let n = nq - first;
            if T <= SMALL_TILE && n > PV_QUERIES {
                // A small tile's 3 or 4 queries (a decode row's heads) meet each value vector all
                // together, widened in registers, one vector of their heads at a time (6 or 8
                // ymm of accumulators). Widening into `vals` and one query at a time took 14-15%
                // more of a decode row's time on Zen 3: the scratch's stores and reloads cost
                // more than the widening they save.
                let (w, acc) = (&w[first..], &mut acc[first..]);
                with_group!(n, SMALL_TILE, G => {
                    for j0 in 0..NV {
                        // SAFETY: forwarded; `j0 < NV`.
                        weigh::<V, NV, 1, G>(src, None, w, hd, j0, acc);
                    }
                }; 3 4);
                continue;
            }
            // Otherwise pairs of queries, the values widened once into `vals` when more than one
            // pair reads them.
            let widen = n > PV_QUERIES;
            if widen {
                for (p, row) in vals.iter_mut().enumerate() {
                    *row = src.row(p, hd);
                }
            }
            let wide = widen.then_some(&vals);
            let mut i = first;
            while i < nq {
                let g = PV_QUERIES.min(nq - i);
                let (w, acc) = (&w[i..], &mut acc[i..]);
                // SAFETY: forwarded; the chunks divide `NV` (2, 4 or 8).
                if g == PV_QUERIES {
                    for j0 in (0..NV).step_by(PV_CHUNK) {
                        weigh::<V, NV, PV_CHUNK, PV_QUERIES>(src, wide, w, hd, j0, acc);
                    }
                } else if NV >= LONE_CHUNK {
                    for j0 in (0..NV).step_by(LONE_CHUNK) {
                        weigh::<V, NV, LONE_CHUNK, 1>(src, wide, w, hd, j0, acc);
                    }
                } else {
                    weigh::<V, NV, PV_CHUNK, 1>(src, wide, w, hd, 0, acc);
                }
                i += g;
            }
        }
        for i in 0..nq {
            let total = V::splat(sum[i].sum_lanes());
            let (r, g) = (t.r0 + i / t.ng, t.g0 + i % t.ng);
            let dst = out[(r * c.heads + g) * hd..][..hd].as_mut_ptr();
            for (j, a) in acc[i].iter().enumerate() {
                a.div(total).store(dst.add(16 * j));
            }
        }
    }
}

/// The raw scores (before scaling) of `G` queries for a block's 16 positions: per key element
/// `d`, one widened load of the 16 keys' element `d` and an FMA with `q[d]` broadcast for each
/// query, one chain a query in element order (the same in any group).
///
/// # Safety
/// `V`'s features; `keys` is a block of `hd * 16` transposed keys; each of the first `G` queries
/// holds `hd` floats; `out` has `G` slots.
#[inline(always)]
unsafe fn scores<V: F16x16, const G: usize>(
    keys: *const u16,
    q: &[*const f32],
    hd: usize,
    out: &mut [V],
) {
    let mut qg = [std::ptr::null::<f32>(); G];
    qg.copy_from_slice(&q[..G]);
    let q = qg;
    // SAFETY: elements `d < hd` of the keys and queries (caller's promise).
    unsafe {
        let mut s = [V::zero(); G];
        for d in 0..hd {
            let k = V::load_f16(keys.add(BLOCK * d));
            for g in 0..G {
                s[g] = V::splat(*q[g].add(d)).fmadd(k, s[g]);
            }
        }
        out[..G].copy_from_slice(&s);
    }
}

/// A block's values in the cache: positions from `tile_live` on read as zeros.
#[derive(Clone, Copy)]
struct Values {
    values: *const u16,
    tile_live: usize,
}

impl Values {
    /// Position `p`'s values, widened (zeros from `tile_live` on).
    ///
    /// # Safety
    /// `V`'s features; the block holds `16 * hd` values, written below `tile_live`;
    /// `hd == 16 * NV`.
    #[inline(always)]
    unsafe fn row<V: F16x16, const NV: usize>(self, p: usize, hd: usize) -> [V; NV] {
        // SAFETY: forwarded.
        unsafe { self.chunk::<V, NV>(p, hd, 0) }
    }

    /// Vectors `j0..j0 + NC` of position `p`'s values, widened (zeros from `tile_live` on).
    ///
    /// # Safety
    /// As [`Values::row`], with `16 * (j0 + NC) <= hd`.
    #[inline(always)]
    unsafe fn chunk<V: F16x16, const NC: usize>(self, p: usize, hd: usize, j0: usize) -> [V; NC] {
        // (Loops, not `array::from_fn`: its closure is a function without the kernel's
        // features, which is not inlined and made the kernel 3x slower.)
        // SAFETY: `V`'s features (caller's promise).
        let mut row = [unsafe { V::zero() }; NC];
        if p < self.tile_live {
            for (j, v) in row.iter_mut().enumerate() {
                // SAFETY: position `p` of the block was written (caller's promise).
                *v = unsafe { V::load_f16(self.values.add(p * hd + 16 * (j0 + j))) };
            }
        }
        row
    }
}

/// Adds the block's weighted values to vectors `j0..j0 + NC` of the accumulators of `G` queries:
/// per position, those value vectors (from `wide`, widened once for the tile, or else from the
/// cache) meet each query's weight broadcast, in position order (the same in any group or
/// chunk).
///
/// # Safety
/// As [`Values::row`]; `w` and `acc` have `G` slots; `j0 + NC <= NV`.
#[inline(always)]
unsafe fn weigh<V: F16x16, const NV: usize, const NC: usize, const G: usize>(
    src: Values,
    wide: Option<&[[V; NV]; BLOCK]>,
    w: &[[f32; BLOCK]],
    hd: usize,
    j0: usize,
    acc: &mut [[V; NV]],
) {
    // SAFETY: `V`'s features (caller's promise).
    let mut a = [[unsafe { V::zero() }; NC]; G];
    for (ag, accg) in a.iter_mut().zip(&acc[..G]) {
        ag.copy_from_slice(&accg[j0..j0 + NC]);
    }
    for p in 0..BLOCK {
        // SAFETY: forwarded.
        let v = match wide {
            Some(rows) => rows[p][j0..j0 + NC].try_into().expect("NC vectors"),
            None => unsafe { src.chunk::<V, NC>(p, hd, j0) },
        };
        for g in 0..G {
            // SAFETY: `V`'s features (caller's promise).
            let wp = unsafe { V::splat(w[g][p]) };
            for j in 0..NC {
                // SAFETY: as above.
                a[g][j] = unsafe { wp.fmadd(v[j], a[g][j]) };
            }
        }
    }
    for (ag, accg) in a.iter().zip(&mut acc[..G]) {
        accg[j0..j0 + NC].copy_from_slice(ag);
    }
}
