//! AVX2 kernels for Q4_1 and Q8_0 weights against Q8_1-style activations (llama.cpp's scheme).
//!
//! One ymm register is one 32-element block: `vpmaddubsw` (unsigned × signed bytes to i16 pairs)
//! and `vpmaddwd` with ones give eight i32 partial sums, converted to f32 and scaled by
//! `d_w * d_x`. Q4_1's `m * s` terms are summed in scalar registers. Q8_0 weights are signed, so
//! the sign is moved onto the activations (`vpsignb`) and the weights' magnitudes used.

use std::arch::x86_64::*;

use super::scalar::{Q4_1_BYTES, Q8_0_BYTES, QK};
use crate::dtype::GgmlType;

/// Runs one tile ([`super::QuantTile`] says its layout).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
pub(super) unsafe fn tile(tile: super::QuantTile<'_>, out: &mut [f32]) {
    quant_tile_body!(tile, out)
}

#[target_feature(enable = "avx2")]
fn hsum(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    _mm_cvtss_f32(s1)
}

/// Q4_1 tile: `out[c * R + r]` = weight row `r` · activation row `c`.
///
/// # Safety
/// AVX2, FMA, F16C; `w` holds `R` rows of `rb` bytes (`rb = nb * 20`), `xq` holds `C` rows of
/// `cols` bytes and `xds` `C` rows of `2 * nb` floats; `out.len() >= R * C`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_tile<const R: usize, const C: usize>(
    w: *const u8,
    rb: usize,
    xq: *const i8,
    xds: *const f32,
    cols: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let nibble = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    let mut macc = [[0f32; R]; C];
    let mut wv = [_mm256_setzero_si256(); R];
    let mut dm = [(0f32, 0f32); R];
    for b in 0..nb {
        for r in 0..R {
            // SAFETY: block `b` lies inside row `r`.
            unsafe {
                let blk = w.add(r * rb + b * Q4_1_BYTES);
                let q = _mm_loadu_si128(blk.add(4) as *const __m128i);
                wv[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), nibble);
                let h = _mm_cvtph_ps(_mm_cvtsi32_si128((blk as *const i32).read_unaligned()));
                dm[r] = (_mm_cvtss_f32(h), _mm_cvtss_f32(_mm_movehdup_ps(h)));
            }
        }
        for ci in 0..C {
            // SAFETY: activation row `ci` holds block `b` and its two scales.
            let (xv, dx, sx) = unsafe {
                let sp = xds.add(ci * 2 * nb + 2 * b);
                (
                    _mm256_loadu_si256(xq.add(ci * cols + b * QK) as *const __m256i),
                    *sp,
                    *sp.add(1),
                )
            };
            for r in 0..R {
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r], xv), ones);
                let scale = _mm256_set1_ps(dm[r].0 * dx);
                acc[ci][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[ci][r]);
                macc[ci][r] += dm[r].1 * sx;
            }
        }
    }
    for (ci, (acc_c, macc_c)) in acc.iter().zip(&macc).enumerate() {
        for r in 0..R {
            out[ci * R + r] = hsum(acc_c[r]) + macc_c[r];
        }
    }
}

/// Q8_0 tile: `out[c * R + r]` = weight row `r` · activation row `c`.
///
/// # Safety
/// As [`q4_1_tile`], with `rb = nb * 34`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_tile<const R: usize, const C: usize>(
    w: *const u8,
    rb: usize,
    xq: *const i8,
    xds: *const f32,
    cols: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); R]; C];
    let mut wv = [_mm256_setzero_si256(); R];
    let mut aw = [_mm256_setzero_si256(); R];
    let mut dw = [0f32; R];
    for b in 0..nb {
        for r in 0..R {
            // SAFETY: block `b` lies inside row `r`.
            unsafe {
                let blk = w.add(r * rb + b * Q8_0_BYTES);
                wv[r] = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                aw[r] = _mm256_abs_epi8(wv[r]);
                let h = (blk as *const u16).read_unaligned();
                dw[r] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)));
            }
        }
        for (ci, acc_c) in acc.iter_mut().enumerate() {
            // SAFETY: activation row `ci` holds block `b` and its scale.
            let (xv, dx) = unsafe {
                (
                    _mm256_loadu_si256(xq.add(ci * cols + b * QK) as *const __m256i),
                    *xds.add(ci * 2 * nb + 2 * b),
                )
            };
            for r in 0..R {
                // |w| * (x * sign(w)) = w * x; at most 2 * 128 * 127 per i16, no saturation.
                let sx = _mm256_sign_epi8(xv, wv[r]);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], sx), ones);
                let scale = _mm256_set1_ps(dw[r] * dx);
                acc_c[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc_c[r]);
            }
        }
    }
    for (ci, acc_c) in acc.iter().enumerate() {
        for r in 0..R {
            out[ci * R + r] = hsum(acc_c[r]);
        }
    }
}
