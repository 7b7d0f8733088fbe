//! The lane kernel's tile on AVX2 ([`super::lanes`]), for CPUs without AVX-512, reading the
//! same [`LaneMatrix`].
//!
//! A lane-ordered block line is 64 bytes: four bytes of each of 16 rows. Here each line is two
//! ymm halves of 8 rows, computed one after the other. Without VNNI the byte dot products are
//! `vpmaddubsw` (unsigned weight bytes × signed activation bytes, pairs summed into i16), which
//! saturates unless one side stays small, as llama.cpp arranges: the weights go in as nibbles
//! ([`MaddUbs`]). Where the CPU has AVX-VNNI (`avxvnni`, or AVX-512 VNNI with VL), `vpdpbusd` on
//! ymm does each line in one instruction. From the integer dot product on, every step is the
//! AVX-512 tile's, so the outputs are bit for bit its outputs.

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
/// # Safety
/// AVX2, FMA, F16C and `D`'s features; the tile's pointers are valid as
/// [`super::lanes::TileFn`] says, for `C` tokens of Q8_0 (`Q8`) or Q4_1 weight `w`.
#[inline(always)]
// `c` indexes the token's accumulators and its activation bytes alike.
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn tile<D: Dot<__m256i>, const Q8: bool, const C: usize>(
    w: &LaneMatrix,
    t: Tile,
) {
    debug_assert_eq!(t.c, C);
    let blocks = t.blocks(w);
    let (n, xq, xds, out, res, stride) = (t.n, t.xq, t.xds, t.out, t.res, t.stride);
    let (nb, cols) = (blocks.nb, blocks.nb * QK);
    // SAFETY (whole body): AVX2, FMA, F16C and `D`'s features are the caller's promise; every
    // pointer read is inside the group or the activations, as noted at each access.
    unsafe {
        let nibble = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        // Per half and token, the scaled dot products and (apart) the offset terms.
        let mut acc = [[_mm256_setzero_ps(); C]; 2];
        let mut macc = [[_mm256_setzero_ps(); C]; 2];
        for b in 0..nb {
            let (sp, vp) = blocks.block(b);
            // The activations' four bytes of line `v`, per token.
            let x4 = |c: usize, v: usize| {
                let xb = xq.wrapping_add(c * cols + b * QK) as *const i32;
                // SAFETY: values `4v..4v + 4` of block `b` of activation row `c < C`.
                _mm256_set1_epi32(xb.add(v).read_unaligned())
            };
            for h in 0..2 {
                // The f16 scales (and Q4_1's offsets) of the half's 8 rows: 16 bytes each.
                let d = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h) as *const _));
                let m = if Q8 {
                    _mm256_mul_ps(d, _mm256_set1_ps(-128.0))
                } else {
                    _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h) as *const _))
                };
                // Integer dot products per token: low nibbles (or whole bytes) and high ones.
                let mut lo = [zero; C];
                let mut hi = [zero; C];
                if Q8 {
                    for v in 0..8 {
                        // SAFETY: half `h` of line `v` of the block's 512 value bytes.
                        let t = _mm256_loadu_si256(vp.add(64 * v + 32 * h) as *const _);
                        if D::WHOLE_BYTES {
                            for c in 0..C {
                                lo[c] = D::dot(lo[c], t, x4(c, v));
                            }
                        } else {
                            let (l, u) = (
                                _mm256_and_si256(t, nibble),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(t), nibble),
                            );
                            for c in 0..C {
                                let x = x4(c, v);
                                lo[c] = D::dot(lo[c], l, x);
                                hi[c] = D::dot(hi[c], u, x);
                            }
                        }
                    }
                } else {
                    for k in 0..4 {
                        // SAFETY: half `h` of line `k` of the block's 256 value bytes: elements
                        // `4k..` in the low nibbles, `16 + 4k..` in the high ones.
                        let t = _mm256_loadu_si256(vp.add(64 * k + 32 * h) as *const _);
                        let l = _mm256_and_si256(t, nibble);
                        let u = _mm256_and_si256(_mm256_srli_epi16::<4>(t), nibble);
                        for c in 0..C {
                            lo[c] = D::dot(lo[c], l, x4(c, k));
                            lo[c] = D::dot(lo[c], u, x4(c, k + 4));
                        }
                    }
                }
                for c in 0..C {
                    let mut dot = D::widen(lo[c], 1);
                    if Q8 && !D::WHOLE_BYTES {
                        dot = _mm256_add_epi32(D::widen(hi[c], 16), dot);
                    }
                    // SAFETY: the pair of block `b` of activation row `c`.
                    let (dx, sx) = {
                        let p = xds.add(c * 2 * nb + 2 * b);
                        (*p, *p.add(1))
                    };
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx));
                    acc[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[h][c]);
                    macc[h][c] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx), macc[h][c]);
                }
            }
        }
        for c in 0..C {
            let mut y = [0f32; ROWS];
            for h in 0..2 {
                let v = _mm256_add_ps(acc[h][c], macc[h][c]);
                _mm256_storeu_ps(y.as_mut_ptr().add(8 * h), v);
            }
            // SAFETY: outputs `c * stride + r` for `r < n`, and the residual's alike.
            let (o, r) = (out.add(c * stride), res.wrapping_add(c * stride));
            for (i, &yi) in y[..n].iter().enumerate() {
                *o.add(i) = yi;
                if !res.is_null() {
                    *r.add(i) += yi;
                }
            }
        }
    }
}
