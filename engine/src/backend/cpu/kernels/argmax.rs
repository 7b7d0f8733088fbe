//! Greedy sampling's argmax over a row of logits (49,152 of them per token here: at batch 8 the
//! portable loop was 2% of a decode step).

use super::SimdLevel;

/// The index of the largest logit; the lowest index wins a tie. Answers as the one-at-a-time
/// loop `if x > l[best] { best = i }` from `best = 0` does, NaNs included.
pub fn argmax(logits: &[f32]) -> u32 {
    argmax_with(super::simd_level(), logits)
}

/// [`argmax`] at a chosen instruction set (lowered to what the CPU supports).
pub fn argmax_with(level: SimdLevel, logits: &[f32]) -> u32 {
    match level.clamp() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to what the CPU runs, so AVX-512F is present.
        SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => unsafe {
            x86::argmax(logits)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is clamped to what the CPU runs, so AVX2 is present.
        SimdLevel::Avx2 | SimdLevel::Avx2Vnni => unsafe { x86::argmax_avx2(logits) },
        _ => portable(logits),
    }
}

/// Sixteen independent running maxima (one per lane of a vector register, so the compiler turns
/// the loop into compares and blends) instead of one chain of dependent compares.
fn portable(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut at = [0u32; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for l in 0..LANES {
            // Strictly greater: within a lane the first occurrence stays.
            if chunk[l] > best[l] {
                best[l] = chunk[l];
                at[l] = (c * LANES + l) as u32;
            }
        }
    }
    let base = logits.len() - tail.len();
    let lanes = best.into_iter().zip(at);
    let tail = tail
        .iter()
        .enumerate()
        .map(|(i, &l)| (l, (base + i) as u32));
    // Across lanes and the tail, the lowest index wins a tie; starting from index 0 keeps the
    // scalar loop's answers for NaN and all -inf too.
    let Some(&first) = logits.first() else {
        return 0;
    };
    let (_, index) = lanes.chain(tail).fold((first, 0), |(w, wi), (v, i)| {
        if v > w || (v == w && i < wi) {
            (v, i)
        } else {
            (w, wi)
        }
    });
    index
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Two passes: the largest non-NaN value, then the first index holding it. A NaN first
    /// logit wins (nothing compares greater), as in the scalar loop.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn argmax(l: &[f32]) -> u32 {
        let Some(&first) = l.first() else {
            return 0;
        };
        if first.is_nan() {
            return 0;
        }
        let n = l.len();
        let lanes = |i: usize| -> __mmask16 { (u32::MAX >> (32 - (n - i).min(16))) as __mmask16 };
        let mut best = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..n).step_by(16) {
            // SAFETY: masked to the elements left.
            let x = unsafe { _mm512_mask_loadu_ps(best, lanes(i), l.as_ptr().add(i)) };
            // `max(x, best)` is `best` where `x` is NaN: NaNs never win.
            best = _mm512_max_ps(x, best);
        }
        let max = _mm512_set1_ps(_mm512_reduce_max_ps(best));
        for i in (0..n).step_by(16) {
            // SAFETY: as above.
            let x = unsafe { _mm512_maskz_loadu_ps(lanes(i), l.as_ptr().add(i)) };
            let hit = _mm512_mask_cmp_ps_mask::<_CMP_EQ_OQ>(lanes(i), x, max);
            if hit != 0 {
                return (i + hit.trailing_zeros() as usize) as u32;
            }
        }
        unreachable!("the maximum is one of the logits")
    }

    /// [`argmax`]'s two passes, 8 lanes at a time, the last few one by one.
    ///
    /// # Safety
    /// AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn argmax_avx2(l: &[f32]) -> u32 {
        let Some(&first) = l.first() else {
            return 0;
        };
        if first.is_nan() {
            return 0;
        }
        let body = l.len() / 8 * 8;
        let mut best = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..body).step_by(8) {
            // SAFETY: `i + 8 <= body <= l.len()`.
            let x = unsafe { _mm256_loadu_ps(l.as_ptr().add(i)) };
            // `max(x, best)` is `best` where `x` is NaN: NaNs never win.
            best = _mm256_max_ps(x, best);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: 8 floats into a local array.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), best) };
        let max = lanes
            .into_iter()
            .chain(l[body..].iter().copied())
            .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m });
        let mv = _mm256_set1_ps(max);
        for i in (0..body).step_by(8) {
            // SAFETY: as above.
            let x = unsafe { _mm256_loadu_ps(l.as_ptr().add(i)) };
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(x, mv));
            if hit != 0 {
                return (i + hit.trailing_zeros() as usize) as u32;
            }
        }
        let at = l[body..].iter().position(|&x| x == max);
        (body + at.expect("the maximum is one of the logits")) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::levels;
    use super::*;
    use crate::generate::Rng;

    /// Every level answers as the one-at-a-time loop does: ties across lanes and the tail, odd
    /// lengths, NaNs, infinities.
    #[test]
    fn argmax_matches_the_scalar_loop() {
        let scalar = |l: &[f32]| {
            let mut best = 0;
            for (i, &x) in l.iter().enumerate() {
                if x > l[best] {
                    best = i;
                }
            }
            best as u32
        };
        let mut rng = Rng::new(7);
        let mut cases: Vec<Vec<f32>> = [1, 2, 15, 16, 17, 33, 1000, 49_152]
            .into_iter()
            // Few distinct values, so ties across lanes and the tail are common.
            .map(|len| (0..len).map(|_| (rng.next_f32() * 8.0).floor()).collect())
            .collect();
        cases.push(vec![]);
        cases.push(vec![f32::NEG_INFINITY; 40]);
        let mut l = vec![1.0; 40];
        l[0] = f32::NAN;
        cases.push(l.clone());
        l[0] = 0.0;
        l[39] = 2.0;
        l[20] = f32::NAN;
        cases.push(l.clone());
        l[17] = f32::INFINITY;
        cases.push(l);
        cases.push(vec![f32::NAN; 19]);
        for level in levels() {
            for l in &cases {
                assert_eq!(argmax_with(level, l), scalar(l), "{level:?} {l:?}");
            }
        }
    }
}
