//! SwiGLU's activation: `gate = silu(gate) * up`, with `silu(g) = g / (1 + exp(-g))`.

use super::SimdLevel;

/// `gate[i] = silu(gate[i]) * up[i]`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    silu_mul_with(super::simd_level(), gate, up);
}

/// [`silu_mul`] at a chosen instruction set (lowered to what the CPU supports). Every level
/// computes `g / (1 + exp(-g)) * u` in that order; AVX-512's `exp` is glibc's `expf` (see
/// [`super::vexp`]), so the levels agree bit for bit wherever the two `exp`s do.
pub fn silu_mul_with(level: SimdLevel, gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "silu_mul: up shorter than gate");
    match level.clamp() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to the detected one, so AVX-512 F and VL are present.
        SimdLevel::Avx512 => unsafe { x86::silu_mul(gate, up) },
        _ => portable(gate, up),
    }
}

fn portable(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::vexp::exp;

    /// # Safety
    /// AVX-512 F and VL; `up.len() >= gate.len()`.
    #[target_feature(enable = "avx512f,avx512vl")]
    pub(super) unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let one = _mm256_set1_ps(1.0);
        for i in (0..gate.len()).step_by(8) {
            // The last vector masked to the elements left.
            let mask: __mmask8 = (u16::MAX >> (16 - (gate.len() - i).min(8))) as u8;
            // SAFETY: the masked lanes lie inside `gate` and `up` (`up.len() >= gate.len()`).
            unsafe {
                let g = _mm256_maskz_loadu_ps(mask, gate.as_ptr().add(i));
                let u = _mm256_maskz_loadu_ps(mask, up.as_ptr().add(i));
                let e = exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
                _mm256_mask_storeu_ps(gate.as_mut_ptr().add(i), mask, s);
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
            portable(&mut want, &up);
            for level in levels() {
                let mut got = xs[..len].to_vec();
                silu_mul_with(level, &mut got, &up);
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
