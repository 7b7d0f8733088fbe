//! [`F16x16`] as two ymm registers (lanes 0..8 and 8..16), for AVX2 + FMA + F16C.

use std::arch::x86_64::*;

use super::simd16::F16x16;
use super::vexp::softmax::{C, LOG2E_HI, LOG2E_LO};

/// Two ymm registers: lanes 0..8 and 8..16.
#[derive(Clone, Copy)]
pub(super) struct Ymm2(__m256, __m256);

/// `exp(x)` of 8 lanes for `x <= 0` (a softmax weight), within 2 ulps of `f32::exp`, by the
/// algorithm of [`super::vexp::softmax`], with `2^n` applied as two exponent-field factors (AVX2
/// has no `vscalefps`) so that results down to the subnormals are right. Below -150 the result is
/// exactly 0 (the weight of a masked lane, -inf, included). 21 instructions against the 40 of
/// glibc's algorithm in f64 (`vexp`), which made a fifth of the tiled attention's time.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: AVX2 and FMA, the calling kernel's features.
    unsafe {
        let x = _mm256_max_ps(x, _mm256_set1_ps(-150.0));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(LOG2E_HI)),
        );
        let f = _mm256_fmsub_ps(x, _mm256_set1_ps(LOG2E_HI), n);
        let f = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E_LO), f);
        let mut p = _mm256_set1_ps(C[0]);
        for &c in &C[1..] {
            p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
        }
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0));
        // 2^n as 2^(n >> 1) * 2^(n - (n >> 1)): for n >= -217 both factors are normal floats.
        let n = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(n);
        let pow2 = |k: __m256i| {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                k,
                _mm256_set1_epi32(127),
            )))
        };
        _mm256_mul_ps(_mm256_mul_ps(p, pow2(n1)), pow2(_mm256_sub_epi32(n, n1)))
    }
}

/// [`exp8`] of 8 values, for tests.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(test)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp8_for_test(x: &[f32; 8]) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: 8 floats each; the features are the caller's promise.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp8(_mm256_loadu_ps(x.as_ptr()))) };
    out
}

/// The horizontal sum of eight lanes, pairwise.
#[inline(always)]
unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: AVX, the calling kernel's feature.
    unsafe {
        let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
    }
}

impl F16x16 for Ymm2 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the calling kernel has this type's features; pointers as documented.
        unsafe {
            // SAFETY (every method): AVX2, FMA, F16C, the calling kernel's features; pointers are the
            // caller's promise.
            Ymm2(_mm256_setzero_ps(), _mm256_setzero_ps())
        }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: the calling kernel has this type's features; pointers as documented.
        unsafe { Ymm2(_mm256_set1_ps(x), _mm256_set1_ps(x)) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self {
        // SAFETY: 16 halves at `p` (caller's promise).
        unsafe {
            Ymm2(
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const _)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(8) as *const _)),
            )
        }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: 16 writable floats at `p` (caller's promise).
        unsafe {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        // SAFETY: the calling kernel has this type's features; pointers as documented.
        unsafe {
            Ymm2(
                _mm256_fmadd_ps(self.0, b.0, c.0),
                _mm256_fmadd_ps(self.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        // SAFETY: as every method.
        unsafe { Ymm2(_mm256_mul_ps(self.0, b.0), _mm256_mul_ps(self.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        // SAFETY: as every method.
        unsafe { Ymm2(_mm256_sub_ps(self.0, b.0), _mm256_sub_ps(self.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        // SAFETY: as every method.
        unsafe { Ymm2(_mm256_add_ps(self.0, b.0), _mm256_add_ps(self.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        // SAFETY: as every method.
        unsafe { Ymm2(_mm256_div_ps(self.0, b.0), _mm256_div_ps(self.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn keep(self, live: usize, fill: f32) -> Self {
        // SAFETY: the calling kernel has this type's features; pointers as documented.
        unsafe {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let fill = _mm256_set1_ps(fill);
            let sel = |v: __m256, first: usize| {
                let n = _mm256_set1_epi32(live.saturating_sub(first).min(8) as i32);
                let on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(n, lane));
                _mm256_blendv_ps(fill, v, on)
            };
            Ymm2(sel(self.0, 0), sel(self.1, 8))
        }
    }
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        // SAFETY: the calling kernel has this type's features; pointers as documented.
        unsafe { Ymm2(exp8(self.0), exp8(self.1)) }
    }
    #[inline(always)]
    unsafe fn max_lane(self) -> f32 {
        // SAFETY: the calling kernel has this type's features; pointers as documented.
        unsafe {
            let m = _mm256_max_ps(self.0, self.1);
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
        }
    }
    #[inline(always)]
    unsafe fn any_gt(self, x: f32) -> bool {
        // SAFETY: the calling kernel has this type's features.
        unsafe {
            let x = _mm256_set1_ps(x);
            let gt = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, x),
                _mm256_cmp_ps::<_CMP_GT_OQ>(self.1, x),
            );
            _mm256_movemask_ps(gt) != 0
        }
    }
    #[inline(always)]
    unsafe fn sum_lanes(self) -> f32 {
        // SAFETY: as every method.
        unsafe { hsum8(_mm256_add_ps(self.0, self.1)) }
    }
}
