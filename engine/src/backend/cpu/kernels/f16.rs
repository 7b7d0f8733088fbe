//! Rounding f32 to f16 bits (the KV cache's element type): to nearest, ties to even, as F16C's
//! `vcvtps2ph` and `half` both round.

use super::SimdLevel;

/// `dst[i]` = `src[i]` rounded to f16, as bits.
pub fn to_f16(src: &[f32], dst: &mut [u16]) {
    to_f16_with(super::simd_level(), src, dst);
}

/// [`to_f16`] at a chosen instruction set (lowered to what the CPU supports); every level gives
/// the same bits (NaNs stay NaNs, with payloads that may differ).
pub fn to_f16_with(level: SimdLevel, src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "to_f16: lengths differ");
    match level.clamp() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to what the CPU runs, so AVX-512 F/BW/VL are present; the
        // lengths are equal (asserted above).
        SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => unsafe {
            x86::to_f16(src, dst)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to what the CPU runs, so F16C is present (the AVX2 level
        // requires it); the lengths are equal.
        SimdLevel::Avx2 | SimdLevel::Avx2Vnni => unsafe { x86::to_f16_f16c(src, dst) },
        _ => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = half::f16::from_f32(s).to_bits();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX-512 F/BW/VL; `dst.len() == src.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn to_f16(src: &[f32], dst: &mut [u16]) {
        for i in (0..src.len()).step_by(16) {
            // The last vector masked to the elements left.
            let mask: __mmask16 = (u32::MAX >> (32 - (src.len() - i).min(16))) as u16;
            // SAFETY: the masked lanes lie inside `src` and `dst` (equal lengths).
            unsafe {
                let x = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
                _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i) as *mut i16, mask, h);
            }
        }
    }

    /// F16C, 8 at a time; the last few through a zero-padded vector.
    ///
    /// # Safety
    /// AVX and F16C; `dst.len() == src.len()`.
    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn to_f16_f16c(src: &[f32], dst: &mut [u16]) {
        let mut s8 = src.chunks_exact(8);
        let mut d8 = dst.chunks_exact_mut(8);
        for (s, d) in (&mut s8).zip(&mut d8) {
            // SAFETY: 8 floats read, 8 halves written.
            unsafe {
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
                _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, h);
            }
        }
        let (s, d) = (s8.remainder(), d8.into_remainder());
        if !s.is_empty() {
            let mut pad = [0f32; 8];
            pad[..s.len()].copy_from_slice(s);
            let mut h = [0u16; 8];
            // SAFETY: 8 floats read, 8 halves written, both local arrays.
            unsafe {
                let v = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(pad.as_ptr()));
                _mm_storeu_si128(h.as_mut_ptr() as *mut __m128i, v);
            }
            d.copy_from_slice(&h[..s.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::levels;
    use super::*;

    /// Every level rounds like `half` (itself tested against IEEE rounding): normal, subnormal,
    /// overflowing and tie values, and odd lengths.
    #[test]
    fn levels_round_like_half() {
        let mut src: Vec<f32> = (0..100_003)
            .map(|i| (i as f32 - 50_000.0) * 1.37e-3 * (1.0 + (i % 7) as f32))
            .collect();
        src.extend([
            0.0,
            -0.0,
            1e-8,
            -6.0e-8,
            5.960_464_5e-8,
            65504.0,
            65520.0,
            1e6,
            -1e6,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.000_488_3, // halfway between two f16 values: ties to even
            1.001_464_8,
        ]);
        let want: Vec<u16> = src
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect();
        for level in levels() {
            for len in [src.len(), 17, 16, 15, 1, 0] {
                let mut got = vec![0xFFFF; len];
                to_f16_with(level, &src[..len], &mut got);
                assert_eq!(got, want[..len], "{level:?}, {len} values");
            }
        }
        let mut nan = [0u16; 1];
        for level in levels() {
            to_f16_with(level, &[f32::NAN], &mut nan);
            assert!(
                half::f16::from_bits(nan[0]).is_nan(),
                "{level:?}: NaN stays NaN"
            );
        }
    }
}
