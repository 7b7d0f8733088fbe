//! A vector `exp` for the AVX-512 and AVX2 kernels (attention's softmax, the SwiGLU activation):
//! one algorithm, glibc's, so both levels give the bits of the portable paths' `f32::exp`.

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{exp, exp_avx2};

/// The constants of the tiled attention kernels' softmax `exp` (`ymm2::exp8`, `flash512::exp16`),
/// faster than glibc's and within 2 ulps of it for `x <= 0`: `2^(x log2 e)` split into `2^n` and
/// `2^f`, `|f| <= 1/2`, `f` from `x` with `log2 e` in two parts, `2^f` by its Taylor polynomial of
/// degree 7 (error below 1e-8 relative), Horner's scheme from `C[0]`, then 1.
pub(super) mod softmax {
    pub(in super::super) const LOG2E_HI: f32 = std::f32::consts::LOG2_E;
    pub(in super::super) const LOG2E_LO: f32 = 1.925_963e-8;
    /// `ln(2)^k / k!`, k = 7 down to 1.
    pub(in super::super) const C: [f32; 7] = [
        1.525_273_4e-5,
        1.540_353_1e-4,
        1.333_355_8e-3,
        9.618_129e-3,
        5.550_411e-2,
        2.402_265e-1,
        std::f32::consts::LN_2,
    ];
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// `2^(i / 32)` as f64 bits, less `i << 47` (added back with the exponent).
    const EXP_TABLE: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];

    /// `exp(x)` of eight floats, computed as glibc's `expf` does (the optimized-routines algorithm:
    /// `2^(k/32)` from a table times a cubic in f64), which makes it agree with the scalar `f32::exp`
    /// of the portable paths on glibc, bit for bit (checked over every float in [-104, 0]);
    /// elsewhere within an ulp. Above 89 the result is infinite, NaN stays NaN.
    #[target_feature(enable = "avx512f")]
    pub(crate) fn exp(x: __m256) -> __m256 {
        // Clamped where f32 overflows anyway, so that the exponent arithmetic below cannot wrap
        // (`min(89, NaN)` is the NaN).
        let xd = _mm512_min_pd(_mm512_set1_pd(89.0), _mm512_cvtps_pd(x));
        // x * 32 / ln 2 = k + r, k an integer (rounded by the 1.5 * 2^52 shift).
        let inv_ln2_n = _mm512_set1_pd(f64::from_bits(0x4047_1547_652b_82fe));
        let shift = _mm512_set1_pd(f64::from_bits(0x4338_0000_0000_0000));
        let kd = _mm512_fmadd_pd(inv_ln2_n, xd, shift);
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, shift);
        let r = _mm512_fmsub_pd(inv_ln2_n, xd, kd);
        // s = 2^(k / 32): the table entry for k % 32 with k / 32 added to its exponent.
        // SAFETY (loads): 32 u64 of a constant array.
        let tab = |i: usize| unsafe { _mm512_loadu_si512(EXP_TABLE[8 * i..].as_ptr() as *const _) };
        let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        let lo = _mm512_permutex2var_epi64(tab(0), idx, tab(1));
        let hi = _mm512_permutex2var_epi64(tab(2), idx, tab(3));
        let t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(idx, _mm512_set1_epi64(16)), lo, hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let c = |bits: u64| _mm512_set1_pd(f64::from_bits(bits));
        let z = _mm512_fmadd_pd(c(0x3ebc_6af8_4b91_2394), r, c(0x3f2e_bfce_50fa_c4f3));
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(c(0x3f96_2e42_ff0c_52d6), r, _mm512_set1_pd(1.0));
        let y = _mm512_mul_pd(_mm512_fmadd_pd(z, r2, y), s);
        // Below log(2^-150) (-0x1.9fe368p6) the result is 0, and the exponent arithmetic above
        // would wrap.
        let min = _mm512_set1_pd(f32::from_bits(0xc2cf_f1b4) as f64);
        let tiny = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(xd, min);
        _mm512_cvtpd_ps(_mm512_mask_mov_pd(y, tiny, _mm512_setzero_pd()))
    }

    /// [`exp`] on AVX2 (four f64 lanes at a time, the table entries gathered): the same
    /// arithmetic, so the same bits.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp_avx2(x: __m256) -> __m256 {
        let lo = exp4(_mm256_castps256_ps128(x));
        let hi = exp4(_mm256_extractf128_ps::<1>(x));
        _mm256_set_m128(hi, lo)
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn exp4(x: __m128) -> __m128 {
        let xd = _mm256_min_pd(_mm256_set1_pd(89.0), _mm256_cvtps_pd(x));
        let inv_ln2_n = _mm256_set1_pd(f64::from_bits(0x4047_1547_652b_82fe));
        let shift = _mm256_set1_pd(f64::from_bits(0x4338_0000_0000_0000));
        let kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, shift);
        let r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        // SAFETY: `idx < 32` indexes the 32 entries of the table.
        let t = unsafe { _mm256_i64gather_epi64::<8>(EXP_TABLE.as_ptr() as *const i64, idx) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let c = |bits: u64| _mm256_set1_pd(f64::from_bits(bits));
        let z = _mm256_fmadd_pd(c(0x3ebc_6af8_4b91_2394), r, c(0x3f2e_bfce_50fa_c4f3));
        let r2 = _mm256_mul_pd(r, r);
        let y = _mm256_fmadd_pd(c(0x3f96_2e42_ff0c_52d6), r, _mm256_set1_pd(1.0));
        let y = _mm256_mul_pd(_mm256_fmadd_pd(z, r2, y), s);
        let min = _mm256_set1_pd(f32::from_bits(0xc2cf_f1b4) as f64);
        let tiny = _mm256_cmp_pd::<_CMP_LT_OQ>(xd, min);
        _mm256_cvtpd_ps(_mm256_blendv_pd(y, _mm256_setzero_pd(), tiny))
    }
}

/// [`exp`] (or [`exp_avx2`] at `level` AVX2) of eight values.
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) fn exp8(level: super::SimdLevel, x: &[f32]) -> [f32; 8] {
    use super::SimdLevel;
    assert!(x.len() >= 8 && level != SimdLevel::Scalar && level.clamp() == level);
    let mut out = [0f32; 8];
    // SAFETY: the level's features are present (checked above); 8 floats are read and written.
    unsafe {
        use std::arch::x86_64::*;
        let v = _mm256_loadu_ps(x.as_ptr());
        let e = if matches!(
            level,
            SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx
        ) {
            exp(v)
        } else {
            exp_avx2(v)
        };
        _mm256_storeu_ps(out.as_mut_ptr(), e);
    }
    out
}
