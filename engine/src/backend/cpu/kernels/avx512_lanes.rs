//! The lane kernel's tile on AVX-512 ([`super::lanes`]): one zmm holds a line of all 16 rows.
//!
//! With VNNI each line is one `vpdpbusd` ([`Vnni`]). Without it (Skylake-SP, AVX-512 Zen 4 parts
//! with it masked off) the byte dot products are `vpmaddubsw` + `vpmaddwd` on zmm
//! ([`MaddUbs`]), as the AVX2 tile does on ymm. Everything after the integer dot product is
//! shared, so both give the same bits.

use std::arch::x86_64::*;

use super::lane_order::LaneMatrix;
use super::lanes::{maddubs_dot, vnni_dot, Dot, MaddUbs, Tile, ROWS};
use super::scalar::QK;

vnni_dot!(
    /// AVX-512 VNNI's `vpdpbusd`.
    Vnni, __m512i, _mm512_dpbusd_epi32
);
maddubs_dot!(
    __m512i,
    _mm512_add_epi16,
    _mm512_maddubs_epi16,
    _mm512_madd_epi16,
    _mm512_set1_epi16
);

/// The [`super::lanes::TileFn`] of 16 rows (one zmm) × `C` tokens of Q8_0 (`Q8`) or Q4_1
/// weight `w`, which prefetches the next group (the next tile's) a group ahead of use.
///
/// # Safety
/// AVX-512 F/BW/VL, FMA, F16C and `D`'s features; the tile's pointers valid as `TileFn` says.
#[inline(always)]
pub(super) unsafe fn tile<D: Dot<__m512i>, const Q8: bool, const C: usize>(
    w: &LaneMatrix,
    t: Tile,
) {
    debug_assert_eq!(t.c, C);
    let blocks = t.blocks(w);
    let (n, xq, xds, out, res, stride) = (t.n, t.xq, t.xds, t.out, t.res, t.stride);
    let (nb, cols) = (blocks.nb, blocks.nb * QK);
    let rows: __mmask16 = if n == ROWS { 0xFFFF } else { (1 << n) - 1 };
    // SAFETY (whole body): AVX-512 F/BW/VL, FMA, F16C and `D`'s features are the caller's
    // promise; every pointer read is inside the group or the activations, and every store inside
    // the outputs (and the residual), as noted at each access.
    unsafe {
        let zero = _mm512_setzero_si512();
        let nibble = _mm512_set1_epi8(0x0F);
        // Per token, the scaled dot products and (apart: they are large and mostly cancel them)
        // the offset terms.
        let mut acc = [_mm512_setzero_ps(); C];
        let mut macc = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let (sp, vp) = blocks.block(b);
            // The f16 scales (and Q4_1's offsets) of the 16 rows' blocks: the block's 32 (64)
            // scale bytes.
            let (d, m) = if Q8 {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(sp as *const _));
                (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)))
            } else {
                let dm = _mm512_loadu_si512(sp as *const _);
                (
                    _mm512_cvtph_ps(_mm512_castsi512_si256(dm)),
                    _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(dm)),
                )
            };
            // Line `v`: elements `4v..4v + 4` of each row's block, as unsigned bytes (line `v`
            // of the block's 512 value bytes; Q4_1: line `k` of its 256, both nibbles).
            let mut lines = [zero; 8];
            if Q8 {
                for (v, line) in lines.iter_mut().enumerate() {
                    *line = _mm512_loadu_si512(vp.add(64 * v) as *const _);
                }
            } else {
                for k in 0..4 {
                    let t = _mm512_loadu_si512(vp.add(64 * k) as *const _);
                    lines[k] = _mm512_and_si512(t, nibble);
                    lines[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(t), nibble);
                }
            }
            for (c, (acc_c, macc_c)) in acc.iter_mut().zip(macc.iter_mut()).enumerate() {
                let xb = xq.wrapping_add(c * cols + b * QK) as *const i32;
                // Whole bytes (or low nibbles) and, for Q8_0 without VNNI, high nibbles.
                let (mut lo, mut hi) = (zero, zero);
                for (v, &line) in lines.iter().enumerate() {
                    // Values `4v..4v + 4` of block `b` of activation row `c`.
                    let x = _mm512_set1_epi32(xb.add(v).read_unaligned());
                    if Q8 && !D::WHOLE_BYTES {
                        let u = _mm512_and_si512(_mm512_srli_epi16::<4>(line), nibble);
                        lo = D::dot(lo, _mm512_and_si512(line, nibble), x);
                        hi = D::dot(hi, u, x);
                    } else {
                        lo = D::dot(lo, line, x);
                    }
                }
                let mut dot = D::widen(lo, 1);
                if Q8 && !D::WHOLE_BYTES {
                    dot = _mm512_add_epi32(D::widen(hi, 16), dot);
                }
                // The pair of block `b` of activation row `c`.
                let p = xds.add(c * 2 * nb + 2 * b);
                let (dx, sx) = (*p, *p.add(1));
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
                *acc_c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc_c);
                *macc_c = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), *macc_c);
            }
        }
        for (c, (&a, &ma)) in acc.iter().zip(&macc).enumerate() {
            let y = _mm512_add_ps(a, ma);
            // Outputs `c * stride + r` for `r < n` (the mask), and the residual's alike.
            _mm512_mask_storeu_ps(out.add(c * stride), rows, y);
            if !res.is_null() {
                let r = res.add(c * stride);
                let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(rows, r), y);
                _mm512_mask_storeu_ps(r, rows, sum);
            }
        }
    }
}
