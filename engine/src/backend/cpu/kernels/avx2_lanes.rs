//! The lane kernel's tile on AVX2 ([`super::lanes`]), for CPUs without AVX-512, reading the
//! same [`LaneMatrix`].
//!
//! A lane-ordered block line is 64 bytes: four bytes of each of 16 rows. Here each line is two
//! ymm halves of 8 rows, computed one after the other. Without VNNI the byte dot products are
//! `vpmaddubsw` (unsigned weight bytes × signed activation bytes, pairs summed into i16), which
//! saturates unless one side stays small: Q4_1's weights are nibbles already ([`MaddUbs`]), and
//! Q8_0's go in signed, as their magnitudes against activations carrying their signs (llama.cpp's
//! arrangement), with the exact offset that makes the result the unsigned bytes' dot product
//! (the activations' block sums, [`super::quant::QActs::sums`]). Where the CPU has AVX-VNNI
//! (`avxvnni`, or AVX-512 VNNI with VL), `vpdpbusd` on ymm does each line in one instruction.
//! From the integer dot product on, every step is the AVX-512 tile's, so the outputs are bit for
//! bit its outputs.

use std::arch::x86_64::*;

use super::lane_order::LaneMatrix;
use super::lanes::{maddubs_dot, vnni_dot, Dot, MaddUbs, Tile, ROWS};
use super::scalar::QK;

maddubs_dot!(
    __m256i,
    _mm256_add_epi16,
    _mm256_maddubs_epi16,
    _mm256_madd_epi16,
    _mm256_set1_epi16
);
vnni_dot!(
    /// AVX-VNNI's `vpdpbusd` on ymm.
    AvxVnni, __m256i, _mm256_dpbusd_avx_epi32
);
vnni_dot!(
    /// The same instruction in its AVX-512 VNNI + VL encoding (same result).
    Avx512Vl, __m256i, _mm256_dpbusd_epi32
);

/// One group of 16 weight rows times `C` activation rows, as [`super::lanes::TileFn`] says.
/// Prefetches the group after it, which is the next tile's.
///
/// The tokens go through each block in groups of up to [`GROUP`] ([`block_group`]), both
/// halves at once: each activation line is broadcast once for the two halves, and a group's
/// integer sums stay in the 16 ymm registers (all 8 tokens at once spilled them, and the
/// compiler kept every broadcast of the block on the stack). Q4_1 with two tokens or more goes
/// half by half instead ([`q4_block`]): the four-token groups still spilled there, and unpacked
/// each block's nibbles once per group.
///
/// # Safety
/// AVX2, FMA, F16C and `D`'s features; the tile's pointers are valid as
/// [`super::lanes::TileFn`] says, for `C` tokens of Q8_0 (`Q8`) or Q4_1 weight `w`.
#[inline(always)]
pub(super) unsafe fn tile<D: Dot<__m256i>, const Q8: bool, const C: usize>(
    w: &LaneMatrix,
    t: Tile,
) {
    debug_assert_eq!(t.c, C);
    let blocks = t.blocks(w);
    let (n, xq, xds, xsum) = (t.n, t.xq, t.xds, t.xsum);
    let (out, res, stride) = (t.out, t.res, t.stride);
    let nb = blocks.nb;
    // SAFETY (whole body): AVX2, FMA, F16C and `D`'s features are the caller's promise; every
    // pointer read is inside the group or the activations, as noted at each access.
    unsafe {
        // Per half and token, the scaled dot products and (apart) the offset terms.
        let mut sums = Sums {
            acc: [[_mm256_setzero_ps(); C]; 2],
            macc: [[_mm256_setzero_ps(); C]; 2],
        };
        for b in 0..nb {
            let (sp, vp) = blocks.block(b);
            let blk = Block {
                sp,
                vp,
                xq,
                xds,
                xsum,
                nb,
                b,
            };
            if !Q8 && C > 1 {
                q4_block::<D, C>(&blk, &mut sums);
                continue;
            }
            let mut c0 = 0;
            while c0 < C {
                match (C - c0).min(GROUP) {
                    4 => block_group::<D, Q8, C, 4>(&blk, c0, &mut sums),
                    3 => block_group::<D, Q8, C, 3>(&blk, c0, &mut sums),
                    2 => block_group::<D, Q8, C, 2>(&blk, c0, &mut sums),
                    _ => block_group::<D, Q8, C, 1>(&blk, c0, &mut sums),
                }
                c0 += GROUP;
            }
        }
        for c in 0..C {
            let y: [__m256; 2] =
                std::array::from_fn(|h| _mm256_add_ps(sums.acc[h][c], sums.macc[h][c]));
            // SAFETY: outputs `c * stride + r` for `r < n`, and the residual's alike.
            let (o, r) = (out.add(c * stride), res.wrapping_add(c * stride));
            if n == ROWS {
                // A whole tile (all but a matrix's last when its rows are no multiple of 16):
                // two stores, where copying `n` floats was a `memcpy` call per token (~5% of a
                // batch-8 decode step at `avx2vnni`).
                for (h, &v) in y.iter().enumerate() {
                    _mm256_storeu_ps(o.add(8 * h), v);
                    if !res.is_null() {
                        let sum = _mm256_add_ps(_mm256_loadu_ps(r.add(8 * h)), v);
                        _mm256_storeu_ps(r.add(8 * h), sum);
                    }
                }
                continue;
            }
            let mut rows = [0f32; ROWS];
            for (h, &v) in y.iter().enumerate() {
                _mm256_storeu_ps(rows.as_mut_ptr().add(8 * h), v);
            }
            for (i, &yi) in rows[..n].iter().enumerate() {
                *o.add(i) = yi;
                if !res.is_null() {
                    *r.add(i) += yi;
                }
            }
        }
    }
}

/// Q4_1 block `b` of a tile, one half at a time: the half's 8 unpacked weight lines stay in
/// registers while the tile's tokens go through them two at a time ([`q4_tokens`]), so the block
/// is unpacked once and nothing spills. Same sums, in the same order, as [`block_group`].
///
/// # Safety
/// As [`tile`], for Q4_1.
#[inline(always)]
unsafe fn q4_block<D: Dot<__m256i>, const C: usize>(blk: &Block, sums: &mut Sums<C>) {
    // SAFETY (whole body): as [`tile`]'s; every read is inside the block.
    unsafe {
        let nibble = _mm256_set1_epi8(0x0F);
        for h in 0..2 {
            // Line `k`'s half: elements `4k..` in the low nibbles, `16 + 4k..` in the high ones.
            let t: [__m256i; 4] =
                std::array::from_fn(
                    |k| _mm256_loadu_si256(blk.vp.add(64 * k + 32 * h) as *const _),
                );
            let half = Q4Half {
                l: t.map(|t| _mm256_and_si256(t, nibble)),
                u: t.map(|t| _mm256_and_si256(_mm256_srli_epi16::<4>(t), nibble)),
                d: _mm256_cvtph_ps(_mm_loadu_si128(blk.sp.add(16 * h) as *const _)),
                m: _mm256_cvtph_ps(_mm_loadu_si128(blk.sp.add(32 + 16 * h) as *const _)),
                h,
            };
            for p in 0..C / 2 {
                q4_tokens::<D, C, 2>(blk, &half, 2 * p, sums);
            }
            if C % 2 == 1 {
                q4_tokens::<D, C, 1>(blk, &half, C - 1, sums);
            }
        }
    }
}

/// One half of a Q4_1 block, unpacked: the low and high nibbles of its 4 lines, and its 8 rows'
/// scales and offsets.
struct Q4Half {
    l: [__m256i; 4],
    u: [__m256i; 4],
    d: __m256,
    m: __m256,
    h: usize,
}

/// Tokens `c0..c0 + G` of the tile through one half of a Q4_1 block: independent chains through
/// the same registers, then the conversion, scale and FMAs into `sums`.
///
/// # Safety
/// As [`tile`], with `c0 + G <= C`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn q4_tokens<D: Dot<__m256i>, const C: usize, const G: usize>(
    blk: &Block,
    half: &Q4Half,
    c0: usize,
    sums: &mut Sums<C>,
) {
    let Block { xq, nb, b, .. } = *blk;
    // SAFETY (whole body): as [`tile`]'s; every read is inside the activations.
    unsafe {
        let mut lo = [_mm256_setzero_si256(); G];
        for k in 0..4 {
            for j in 0..G {
                // SAFETY: values `4k..4k + 4` and `16 + 4k..` of block `b` of row `c0 + j`.
                let xb = xq.wrapping_add((c0 + j) * nb * QK + b * QK) as *const i32;
                let xl = _mm256_set1_epi32(xb.add(k).read_unaligned());
                let xu = _mm256_set1_epi32(xb.add(k + 4).read_unaligned());
                lo[j] = D::dot(lo[j], half.l[k], xl);
                lo[j] = D::dot(lo[j], half.u[k], xu);
            }
        }
        for j in 0..G {
            sums.add(blk, half.h, c0 + j, D::widen(lo[j], 1), half.d, half.m);
        }
    }
}

/// A tile's float sums: per half and token, the scaled dot products and the offset terms.
struct Sums<const C: usize> {
    acc: [[__m256; C]; 2],
    macc: [[__m256; C]; 2],
}

impl<const C: usize> Sums<C> {
    /// Block `blk.b`'s integer dot products `dot` of half `h` and token `c` (with the half's
    /// scales `d` and offsets `m`): converted, scaled by the token's `d`, and added, and the
    /// offset term apart, in the AVX-512 tile's order (the same bits).
    ///
    /// # Safety
    /// AVX2 and FMA; `c` is a token of the tile.
    #[inline(always)]
    unsafe fn add(&mut self, blk: &Block, h: usize, c: usize, dot: __m256i, d: __m256, m: __m256) {
        // SAFETY: the pair of block `b` of activation row `c`; AVX2 and FMA as promised.
        unsafe {
            let p = blk.xds.add(c * 2 * blk.nb + 2 * blk.b);
            let (dx, sx) = (*p, *p.add(1));
            let (acc, macc) = (&mut self.acc[h][c], &mut self.macc[h][c]);
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, *acc);
            *macc = _mm256_fmadd_ps(m, _mm256_set1_ps(sx), *macc);
        }
    }
}

/// One block of a tile: its scales `sp` and values `vp`, and the tile's activations (`nb`
/// blocks a row, this is block `b`).
struct Block {
    sp: *const u8,
    vp: *const u8,
    xq: *const i8,
    xds: *const f32,
    xsum: *const i32,
    nb: usize,
    b: usize,
}

/// Tokens per group: as many as keep a group's integer sums (two halves) and the block's
/// unpacked lines in registers.
const GROUP: usize = 4;

/// Block `blk.b` for tokens `c0..c0 + G` of the tile: their integer dot products with both
/// halves, then the conversion, scale and FMAs into `sums`, in the AVX-512 tile's order.
///
/// # Safety
/// As [`tile`], with `c0 + G <= C`.
#[inline(always)]
// `c` indexes the token's sums and its activation bytes alike.
#[allow(clippy::needless_range_loop)]
unsafe fn block_group<D: Dot<__m256i>, const Q8: bool, const C: usize, const G: usize>(
    blk: &Block,
    c0: usize,
    sums: &mut Sums<C>,
) {
    let Block {
        sp,
        vp,
        xq,
        xsum,
        nb,
        b,
        ..
    } = *blk;
    // SAFETY (whole body): as [`tile`]'s; every read is inside the block or the activations.
    unsafe {
        let nibble = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        // The activations' four bytes of line `v`, per token of the group.
        let x4 = |c: usize, v: usize| {
            let xb = xq.wrapping_add((c0 + c) * nb * QK + b * QK) as *const i32;
            // SAFETY: values `4v..4v + 4` of block `b` of activation row `c0 + c < C`.
            _mm256_set1_epi32(xb.add(v).read_unaligned())
        };
        // Integer dot products per half and token (i16 pairs for Q4_1, i32 otherwise).
        let mut lo = [[zero; G]; 2];
        if Q8 && D::WHOLE_BYTES {
            for v in 0..8 {
                // SAFETY: the halves of line `v` of the block's 512 value bytes.
                let t = [0, 1].map(|h| _mm256_loadu_si256(vp.add(64 * v + 32 * h) as *const _));
                for c in 0..G {
                    let x = x4(c, v);
                    for h in 0..2 {
                        lo[h][c] = D::dot(lo[h][c], t[h], x);
                    }
                }
            }
        } else if Q8 {
            // Without VNNI, the unsigned bytes `u = q + 128` would overflow `vpmaddubsw`'s i16
            // pairs against full activation bytes. The signed weight `q` goes in as `|q|` against
            // the activations with `q`'s sign (a pair is at most 2 · 128 · 127 = 32,512), widened
            // to i32 each line; `128 · sum(x)` then makes it `vpdpbusd`'s exact `u · x`. Half the
            // byte products of splitting `u` into nibbles.
            let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
            for v in 0..8 {
                for h in 0..2 {
                    // SAFETY: half `h` of line `v` of the block's 512 value bytes.
                    let u = _mm256_loadu_si256(vp.add(64 * v + 32 * h) as *const _);
                    let q = _mm256_xor_si256(u, flip);
                    let a = _mm256_abs_epi8(q);
                    for c in 0..G {
                        let p = _mm256_maddubs_epi16(a, _mm256_sign_epi8(x4(c, v), q));
                        lo[h][c] = _mm256_add_epi32(lo[h][c], _mm256_madd_epi16(p, ones));
                    }
                }
            }
            for c in 0..G {
                // SAFETY: the sum of block `b` of activation row `c0 + c`.
                let off = _mm256_set1_epi32(128 * *xsum.add((c0 + c) * nb + b));
                for h in 0..2 {
                    lo[h][c] = _mm256_add_epi32(lo[h][c], off);
                }
            }
        } else {
            for k in 0..4 {
                // SAFETY: the halves of line `k` of the block's 256 value bytes: elements
                // `4k..` in the low nibbles, `16 + 4k..` in the high ones.
                let t = [0, 1].map(|h| _mm256_loadu_si256(vp.add(64 * k + 32 * h) as *const _));
                let l = t.map(|t| _mm256_and_si256(t, nibble));
                let u = t.map(|t| _mm256_and_si256(_mm256_srli_epi16::<4>(t), nibble));
                for c in 0..G {
                    let (xl, xu) = (x4(c, k), x4(c, k + 4));
                    for h in 0..2 {
                        lo[h][c] = D::dot(lo[h][c], l[h], xl);
                        lo[h][c] = D::dot(lo[h][c], u[h], xu);
                    }
                }
            }
        }
        for h in 0..2 {
            // The f16 scales (and Q4_1's offsets) of the half's 8 rows: 16 bytes each.
            let d = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h) as *const _));
            let m = if Q8 {
                _mm256_mul_ps(d, _mm256_set1_ps(-128.0))
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h) as *const _))
            };
            for c in 0..G {
                // The signed Q8_0 path's sums are i32 already.
                let dot = if Q8 && !D::WHOLE_BYTES {
                    lo[h][c]
                } else {
                    D::widen(lo[h][c], 1)
                };
                sums.add(blk, h, c0 + c, dot, d, m);
            }
        }
    }
}
