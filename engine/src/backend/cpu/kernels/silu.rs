//! SwiGLU's activation: `gate = silu(gate) * up`, with `silu(g) = g / (1 + exp(-g))`.

use super::SimdLevel;

/// `gate[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_with(super::simd_level(), gate, up);
}

/// [`silu_mul`] at a chosen instruction set (lowered to what the CPU supports). Every level
/// computes `g / (1 + exp(-g)) * u` in that order; the vector `exp` is glibc's `expf` (see
/// `vexp`), so the levels agree bit for bit wherever the two `exp`s do.
pub fn silu_mul_with(level: SimdLevel, gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "silu_mul: up shorter than gate");
    let len = gate.len();
    let g = gate.as_mut_ptr();
    // SAFETY: `g` and `up` hold `len` floats, and `g` is writable (the result goes there).
    unsafe { dispatch(level, g, up.as_ptr(), g, len) }
}

/// `up[i] = silu(gate[i]) * up[i]`: [`silu_mul`] with the result in `up`, the same bits.
pub fn silu_mul_into_up(gate: &[f32], up: &mut [f32]) {
    assert_eq!(up.len(), gate.len(), "silu_mul: lengths differ");
    let u = up.as_mut_ptr();
    // SAFETY: `gate` and `u` hold `len` floats, and `u` is writable (the result goes there).
    unsafe { dispatch(super::simd_level(), gate.as_ptr(), u, u, gate.len()) }
}

/// `out[i] = silu(g[i]) * u[i]` for `i < len`.
///
/// # Safety
/// `g`, `u` and `out` point at `len` floats; `out` is writable and is `g`, `u` or apart from both.
unsafe fn dispatch(level: SimdLevel, g: *const f32, u: *const f32, out: *mut f32, len: usize) {
    match level.clamp() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to what the CPU runs, so AVX-512 F and VL are present; the
        // pointers are the caller's promise.
        SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => unsafe {
            x86::silu_mul(g, u, out, len)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to what the CPU runs, so AVX2 and FMA are present; the
        // pointers are the caller's promise.
        SimdLevel::Avx2 | SimdLevel::Avx2Vnni => unsafe { x86::silu_mul_avx2(g, u, out, len) },
        _ => {
            for i in 0..len {
                // SAFETY: `i < len` (caller's promise); each element is read before written.
                unsafe {
                    let (gi, ui) = (*g.add(i), *u.add(i));
                    *out.add(i) = gi / (1.0 + (-gi).exp()) * ui;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::vexp::{exp, exp_avx2};

    /// # Safety
    /// AVX-512 F and VL; as [`super::dispatch`].
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn silu_mul(g: *const f32, u: *const f32, out: *mut f32, len: usize) {
        let one = _mm256_set1_ps(1.0);
        for i in (0..len).step_by(8) {
            // The last vector masked to the elements left.
            let mask: __mmask8 = (u16::MAX >> (16 - (len - i).min(8))) as u8;
            // SAFETY: the masked lanes lie inside the `len` floats (caller's promise); the
            // vector is read whole before it is written.
            unsafe {
                let gv = _mm256_maskz_loadu_ps(mask, g.add(i));
                let uv = _mm256_maskz_loadu_ps(mask, u.add(i));
                let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), gv));
                let s = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv);
                _mm256_mask_storeu_ps(out.add(i), mask, s);
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA; as [`super::dispatch`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul_avx2(g: *const f32, u: *const f32, out: *mut f32, len: usize) {
        let one = _mm256_set1_ps(1.0);
        let silu = |gv: __m256, uv: __m256| {
            let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), uv)
        };
        // Whole vectors with plain loads and stores: AMD runs a masked store (`vmaskmovps`) as
        // microcode, and with it on every vector this pass took 3.4% of a batch-8 decode step
        // on Zen 3.
        let whole = len - len % 8;
        for i in (0..whole).step_by(8) {
            // SAFETY: as in `silu_mul`; `i + 8 <= len`.
            unsafe {
                let s = silu(_mm256_loadu_ps(g.add(i)), _mm256_loadu_ps(u.add(i)));
                _mm256_storeu_ps(out.add(i), s);
            }
        }
        if whole < len {
            // The last elements, masked to the lanes below their count.
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((len - whole) as i32), lane);
            // SAFETY: as in `silu_mul`; the mask keeps to the `len - whole` elements left.
            unsafe {
                let gv = _mm256_maskload_ps(g.add(whole), mask);
                let uv = _mm256_maskload_ps(u.add(whole), mask);
                _mm256_maskstore_ps(out.add(whole), mask, silu(gv, uv));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::levels;
    use super::*;

    #[test]
    fn silu_mul_values() {
        for level in levels() {
            let mut g = [0.0, 1.0, -2.0];
            silu_mul_with(level, &mut g, &[5.0, 2.0, 1.0]);
            assert_eq!(g[0], 0.0);
            assert!((g[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
            assert!((g[2] - (-2.0 / (1.0 + 2.0f32.exp()))).abs() < 1e-6);
        }
    }

    /// Every level against the portable one, over lengths with and without a partial vector,
    /// values across SiLU's range (exactly where both `exp`s are glibc's) and its extremes.
    #[test]
    fn levels_agree_with_the_portable_path() {
        let mut xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) / 40.0).collect();
        xs.extend([-100.0, -1e4, 1e4, 0.0, -0.0, f32::NAN]);
        let up: Vec<f32> = (0..xs.len()).map(|i| 1.0 + (i % 7) as f32 / 8.0).collect();
        for len in [0, 1, 7, 8, 9, 23, xs.len()] {
            let mut want = xs[..len].to_vec();
            silu_mul_with(SimdLevel::Scalar, &mut want, &up);
            for level in levels() {
                let mut got = xs[..len].to_vec();
                silu_mul_with(level, &mut got, &up);
                let mut into_up = up[..len].to_vec();
                if level == super::super::simd_level() {
                    silu_mul_into_up(&xs[..len], &mut into_up);
                    assert_eq!(
                        into_up.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "into up, len {len}"
                    );
                }
                for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                    let same = a.to_bits() == b.to_bits();
                    let close = (a - b).abs() <= 2.0 * f32::EPSILON * b.abs();
                    // exp(-g) is bit-exact for g >= 0; within an ulp below.
                    assert!(
                        same || (xs[k] < 0.0 && close),
                        "{level:?} len {len} x={}: {a} vs {b}",
                        xs[k]
                    );
                }
            }
        }
    }
}
