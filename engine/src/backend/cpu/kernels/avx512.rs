//! AVX-512 VNNI kernels for Q4_1 and Q8_0 weights against Q8_1-style activations.
//!
//! One zmm register covers two 32-element blocks. Per block pair and weight row the unpacked
//! weights, and per pair and activation row the activation bytes, are loaded once and reused
//! across the tile (`R` weight rows × `C` activation rows). Each `vpdpbusd` yields eight i32
//! partial sums per block; they are converted to f32 and multiplied by the per-lane block scale
//! `d_w * d_x` (built with one 128-bit multiply and one permute), and Q4_1's `m * s` terms are
//! added into otherwise unused lanes of the same accumulator (a horizontal sum ends every tile).
//!
//! Q8_0 weights are signed, so the activations are offset to unsigned (`x + 128`, an XOR) and
//! the accumulator starts at `-128 * sum(w)`, computed once per weight block with `vpdpbusd`.

use std::arch::x86_64::*;

use super::scalar::{Q4_1_BYTES, Q8_0_BYTES, QK};
use crate::dtype::GgmlType;

/// Runs one tile ([`super::QuantTile`] says its layout).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, FMA and F16C.
pub(super) unsafe fn tile(tile: super::QuantTile<'_>, out: &mut [f32]) {
    quant_tile_body!(tile, out)
}

/// Permutation index: lanes 0..8 of the result take lane 0 of the source, lanes 8..16 lane 2.
macro_rules! pair_scale_index {
    () => {
        _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0)
    };
}

/// Reads the little-endian u16 at `p`.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline(always)]
unsafe fn read_u16(p: *const u8) -> u16 {
    // SAFETY: the caller guarantees 2 readable bytes; unaligned reads are allowed.
    unsafe { (p as *const u16).read_unaligned() }
}

/// Q4_1 tile: `out[c * R + r]` = weight row `r` · activation row `c`.
///
/// A block pair is 40 bytes (ten dwords: `dm0 qs0[4] dm1 qs1[4]`): one masked load, one dword
/// permute to `[qs0, qs0, qs1, qs1]` before the nibble split, and one `vcvtph2ps` of the same
/// register, which puts `d0, m0` in lanes 0, 1 and `d1, m1` in lanes 10, 11.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, FMA, F16C; `w` holds `R` rows of `rb` bytes (`rb = nb * 20`), `xq` holds
/// `C` rows of `cols` bytes and `xds` `C` rows of `2 * nb` floats; `out.len() >= R * C`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q4_1_tile<const R: usize, const C: usize>(
    w: *const u8,
    rb: usize,
    xq: *const i8,
    xds: *const f32,
    cols: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let nibble = _mm512_set1_epi8(0x0F);
    // 128-bit lanes: [low nibbles of block 0, high nibbles of block 0, same for block 1].
    let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    let qidx = _mm512_set_epi32(9, 8, 7, 6, 9, 8, 7, 6, 4, 3, 2, 1, 4, 3, 2, 1);
    // Weight scales d0 (lane 0) and d1 (lane 10) spread over each block's eight lanes.
    let widx = _mm512_set_epi32(10, 10, 10, 10, 10, 10, 10, 10, 0, 0, 0, 0, 0, 0, 0, 0);
    // Activation (d0, s0, d1, s1): d spread like `widx`; s0 to lane 1 and s1 to lane 11,
    // next to the weights' m0 and m1.
    let xdidx = pair_scale_index!();
    let xsidx = _mm512_set_epi32(0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0);
    const M_LANES: __mmask16 = (1 << 1) | (1 << 11);
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); R]; C];
    let mut wv = [zero; R];
    let mut fp = [_mm512_setzero_ps(); R];
    let mut dw = [_mm512_setzero_ps(); R];
    // One step: blocks `b` and `b + 1`, or only block `b` when `single`.
    macro_rules! step {
        ($b:expr, $single:expr) => {{
            let (b, single): (usize, bool) = ($b, $single);
            let wmask: __mmask16 = if single { 0x001F } else { 0x03FF };
            for r in 0..R {
                prefetch(w.wrapping_add(r * rb + b * Q4_1_BYTES + PREFETCH_AHEAD));
                // SAFETY: the masked load reads block `b` (and `b + 1` unless `single`) of
                // row `r`, inside `w`.
                let raw = unsafe {
                    _mm512_maskz_loadu_epi32(wmask, w.add(r * rb + b * Q4_1_BYTES) as *const i32)
                };
                let q = _mm512_permutexvar_epi32(qidx, raw);
                wv[r] = _mm512_and_si512(_mm512_srlv_epi64(q, shifts), nibble);
                fp[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(raw));
                dw[r] = _mm512_permutexvar_ps(widx, fp[r]);
            }
            for (ci, acc_c) in acc.iter_mut().enumerate() {
                // SAFETY: activation row `ci` holds blocks `b` (and `b + 1` unless `single`);
                // the single-block loads are masked to that block.
                let (xv, xs) = unsafe {
                    let xp = xq.add(ci * cols + b * QK);
                    let sp = xds.add(ci * 2 * nb + 2 * b);
                    if single {
                        (
                            _mm512_maskz_loadu_epi8(0xFFFF_FFFF, xp),
                            _mm_castpd_ps(_mm_load_sd(sp as *const f64)),
                        )
                    } else {
                        (_mm512_loadu_si512(xp as *const _), _mm_loadu_ps(sp))
                    }
                };
                let xs = _mm512_castps128_ps512(xs);
                let xd = _mm512_permutexvar_ps(xdidx, xs);
                let xm = _mm512_permutexvar_ps(xsidx, xs);
                for r in 0..R {
                    let dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, wv[r], xv));
                    let a = _mm512_fmadd_ps(_mm512_mul_ps(dot, dw[r]), xd, acc_c[r]);
                    // Lanes 1 and 11: m0 * s0 and m1 * s1 (other lanes of `fp` may hold
                    // anything, so they are masked off).
                    acc_c[r] = _mm512_mask3_fmadd_ps(fp[r], xm, a, M_LANES);
                }
            }
        }};
    }
    let mut b = 0;
    while b + 2 <= nb {
        step!(b, false);
        b += 2;
    }
    if b < nb {
        step!(b, true);
    }
    for (ci, acc_c) in acc.iter().enumerate() {
        for r in 0..R {
            out[ci * R + r] = _mm512_reduce_add_ps(acc_c[r]);
        }
    }
}

/// How far ahead of the current block each weight row is prefetched: in decode, weights stream
/// from L3 or memory once per token, and the hardware prefetcher alone leaves the kernel waiting.
const PREFETCH_AHEAD: usize = 512;

/// Asks for the cache line at `p` into L1. A prefetch never faults, so `p` may lie past the
/// end of the weights (it is computed with `wrapping_add`).
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: `_mm_prefetch` is a hint that reads nothing architecturally and cannot fault,
    // whatever the address; SSE is part of x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// Q8_0 tile: `out[c * R + r]` = weight row `r` · activation row `c`.
///
/// # Safety
/// As [`q4_1_tile`], with `rb = nb * 34`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q8_0_tile<const R: usize, const C: usize>(
    w: *const u8,
    rb: usize,
    xq: *const i8,
    xds: *const f32,
    cols: usize,
    out: &mut [f32],
) {
    let nb = cols / QK;
    let off = _mm512_set1_epi8(-128);
    let idx = pair_scale_index!();
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); R]; C];
    let mut wv = [zero; R];
    let mut ncorr = [zero; R];
    let mut dw = [_mm_setzero_ps(); R];
    macro_rules! step {
        ($b:expr, $single:expr) => {{
            let (b, single): (usize, bool) = ($b, $single);
            for r in 0..R {
                prefetch(w.wrapping_add(r * rb + b * Q8_0_BYTES + PREFETCH_AHEAD));
                // SAFETY: block `b` (and `b + 1` unless `single`) lies inside row `r`.
                unsafe {
                    let blk = w.add(r * rb + b * Q8_0_BYTES);
                    wv[r] = if single {
                        _mm512_maskz_loadu_epi8(0xFFFF_FFFF, blk.add(2) as *const i8)
                    } else {
                        let lo = _mm256_loadu_si256(blk.add(2) as *const __m256i);
                        let hi = _mm256_loadu_si256(blk.add(Q8_0_BYTES + 2) as *const __m256i);
                        _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
                    };
                    ncorr[r] = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, off, wv[r]));
                    let d1 = if single {
                        0
                    } else {
                        read_u16(blk.add(Q8_0_BYTES))
                    };
                    // Halves [d0, 0, d1, 0]: lanes 0 and 2 carry the scales, as in Q4_1.
                    dw[r] = _mm_cvtph_ps(_mm_set_epi32(0, 0, d1 as i32, read_u16(blk) as i32));
                }
            }
            for (ci, acc_c) in acc.iter_mut().enumerate() {
                // SAFETY: as in `q4_1_tile`.
                let (xv, xs) = unsafe {
                    let xp = xq.add(ci * cols + b * QK);
                    let sp = xds.add(ci * 2 * nb + 2 * b);
                    if single {
                        (
                            _mm512_maskz_loadu_epi8(0xFFFF_FFFF, xp),
                            _mm_castpd_ps(_mm_load_sd(sp as *const f64)),
                        )
                    } else {
                        (_mm512_loadu_si512(xp as *const _), _mm_loadu_ps(sp))
                    }
                };
                let xu = _mm512_xor_si512(xv, off);
                for r in 0..R {
                    let dot = _mm512_dpbusd_epi32(ncorr[r], xu, wv[r]);
                    let prod = _mm512_castps128_ps512(_mm_mul_ps(dw[r], xs));
                    let scale = _mm512_permutexvar_ps(idx, prod);
                    acc_c[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc_c[r]);
                }
            }
        }};
    }
    let mut b = 0;
    while b + 2 <= nb {
        step!(b, false);
        b += 2;
    }
    if b < nb {
        step!(b, true);
    }
    for (ci, acc_c) in acc.iter().enumerate() {
        for r in 0..R {
            out[ci * R + r] = _mm512_reduce_add_ps(acc_c[r]);
        }
    }
}
