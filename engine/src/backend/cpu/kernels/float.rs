//! Float weights (F32, F16, BF16) and the f32 vector helpers used by attention.

use std::ops::Range;

use super::{scalar, QMatrix, SimdLevel};
use crate::dtype::GgmlType;

/// Dot product of two equally long f32 slices.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_with(super::simd_level(), a, b)
}

/// [`dot_f32`] at a chosen instruction set (lowered to what the CPU supports).
pub fn dot_f32_with(level: SimdLevel, a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: lengths differ");
    match level.clamp() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => {
            // SAFETY: the clamped level guarantees AVX-512F; lengths are equal.
            unsafe { x86::dot_f32_avx512(a, b) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx2Vnni => {
            // SAFETY: the clamped level guarantees AVX2 + FMA; lengths are equal.
            unsafe { x86::dot_f32_avx2(a, b) }
        }
        _ => scalar::dot_f32(a, b),
    }
}

/// `y += a * x` over equally long slices.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    axpy_with(super::simd_level(), a, x, y);
}

/// [`axpy`] at a chosen instruction set (lowered to what the CPU supports).
pub fn axpy_with(level: SimdLevel, a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: lengths differ");
    match level.clamp() {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => {
            // SAFETY: the clamped level guarantees AVX-512F; lengths are equal.
            unsafe { x86::axpy_avx512(a, x, y) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx2Vnni => {
            // SAFETY: the clamped level guarantees AVX2 + FMA; lengths are equal.
            unsafe { x86::axpy_avx2(a, x, y) }
        }
        _ => scalar::axpy(a, x, y),
    }
}

/// Dot product of one stored float row with `x` (same number of elements).
fn dot_float_row(level: SimdLevel, dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    match (level, dtype) {
        #[cfg(target_arch = "x86_64")]
        (
            SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::F32,
        ) => {
            assert!(w.len() >= x.len() * dtype.type_size());
            // SAFETY: the level was clamped by the caller, so AVX-512F/BW and F16C are present;
            // `w` holds at least `x.len()` elements (asserted above).
            unsafe { x86::dot_row_avx512(dtype, w, x) }
        }
        _ => scalar::dot_float_row(dtype, w, x),
    }
}

/// Outputs of float weight `w` for `rows` × `toks`, written to `out` (layout as in `matmul`).
pub(super) fn float_block(
    level: SimdLevel,
    w: &QMatrix,
    x: &[f32],
    rows: Range<usize>,
    toks: Range<usize>,
    out: *mut f32,
) {
    let cols = w.cols;
    for r in rows {
        let wr = w.row(r);
        for i in toks.clone() {
            let v = dot_float_row(level, w.dtype, wr, &x[i * cols..(i + 1) * cols]);
            // SAFETY: `i * rows + r < m * rows <= y.len()` (checked by `matmul_multi_with`), and
            // each (token, row) pair belongs to exactly one task.
            unsafe { *out.add(i * w.rows + r) = v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::dtype::GgmlType;

    /// # Safety
    /// AVX-512F must be available; `a.len() == b.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_f32_avx512(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut k = 0;
        // SAFETY (all loads below): indices stay below `n`, the length of both slices; the
        // tail uses a masked load that touches only the first `n - k` lanes.
        while k + 32 <= n {
            unsafe {
                acc0 =
                    _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(k)), _mm512_loadu_ps(pb.add(k)), acc0);
                acc1 = _mm512_fmadd_ps(
                    _mm512_loadu_ps(pa.add(k + 16)),
                    _mm512_loadu_ps(pb.add(k + 16)),
                    acc1,
                );
            }
            k += 32;
        }
        while k < n {
            let mask: __mmask16 = if n - k >= 16 {
                0xFFFF
            } else {
                (1u16 << (n - k)) - 1
            };
            unsafe {
                let va = _mm512_maskz_loadu_ps(mask, pa.add(k));
                let vb = _mm512_maskz_loadu_ps(mask, pb.add(k));
                acc0 = _mm512_fmadd_ps(va, vb, acc0);
            }
            k += 16;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    /// # Safety
    /// AVX-512F must be available; `x.len() == y.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy_avx512(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let av = _mm512_set1_ps(a);
        let mut k = 0;
        while k < n {
            let mask: __mmask16 = if n - k >= 16 {
                0xFFFF
            } else {
                (1u16 << (n - k)) - 1
            };
            // SAFETY: the masked loads/stores touch only lanes below `n`, the common length.
            unsafe {
                let vx = _mm512_maskz_loadu_ps(mask, px.add(k));
                let vy = _mm512_maskz_loadu_ps(mask, py.add(k));
                _mm512_mask_storeu_ps(py.add(k), mask, _mm512_fmadd_ps(av, vx, vy));
            }
            k += 16;
        }
    }

    #[target_feature(enable = "avx")]
    fn hsum256(v: __m256) -> f32 {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        _mm_cvtss_f32(s1)
    }

    /// # Safety
    /// AVX2 and FMA must be available; `a.len() == b.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_f32_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut k = 0;
        // SAFETY (loads below): `k + 16 <= n` / `k + 8 <= n`, within both slices.
        while k + 16 <= n {
            unsafe {
                acc0 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k)), _mm256_loadu_ps(pb.add(k)), acc0);
                acc1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(k + 8)),
                    _mm256_loadu_ps(pb.add(k + 8)),
                    acc1,
                );
            }
            k += 16;
        }
        while k + 8 <= n {
            unsafe {
                acc0 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(k)), _mm256_loadu_ps(pb.add(k)), acc0);
            }
            k += 8;
        }
        let mut s = hsum256(_mm256_add_ps(acc0, acc1));
        for j in k..n {
            s += a[j] * b[j];
        }
        s
    }

    /// # Safety
    /// AVX2 and FMA must be available; `x.len() == y.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let av = _mm256_set1_ps(a);
        let mut k = 0;
        while k + 8 <= n {
            // SAFETY: `k + 8 <= n`, within both slices.
            unsafe {
                let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(px.add(k)), _mm256_loadu_ps(py.add(k)));
                _mm256_storeu_ps(py.add(k), r);
            }
            k += 8;
        }
        for j in k..n {
            y[j] += a * x[j];
        }
    }

    /// Dot product of a stored F32/F16/BF16 row with `x`.
    ///
    /// # Safety
    /// AVX-512F/BW/VL and F16C must be available; `w` holds at least `x.len()` elements.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub(super) unsafe fn dot_row_avx512(dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
        let n = x.len();
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        let mut acc = _mm512_setzero_ps();
        let mut k = 0;
        while k < n {
            let mask: __mmask16 = if n - k >= 16 {
                0xFFFF
            } else {
                (1u16 << (n - k)) - 1
            };
            // SAFETY: the masked loads touch only elements below `n`, which `w` and `x` hold.
            unsafe {
                let vx = _mm512_maskz_loadu_ps(mask, px.add(k));
                let vw = match dtype {
                    GgmlType::F32 => _mm512_maskz_loadu_ps(mask, pw.add(4 * k) as *const f32),
                    GgmlType::F16 => {
                        let h = _mm256_maskz_loadu_epi16(mask, pw.add(2 * k) as *const i16);
                        _mm512_cvtph_ps(h)
                    }
                    _ => {
                        let h = _mm256_maskz_loadu_epi16(mask, pw.add(2 * k) as *const i16);
                        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                    }
                };
                acc = _mm512_fmadd_ps(vw, vx, acc);
            }
            k += 16;
        }
        _mm512_reduce_add_ps(acc)
    }
}
