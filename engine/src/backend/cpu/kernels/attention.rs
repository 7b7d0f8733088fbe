//! Attention inner loops over a paged KV cache: the scores, softmax and weighted sum of values
//! of some query rows of one head, in one dispatched call.

use std::cell::RefCell;

use super::SimdLevel;

/// One KV head of one sequence in a paged cache.
#[derive(Clone, Copy, Debug)]
pub struct KvHead<'a> {
    /// Keys, `[slot][stride]`.
    pub k: &'a [f32],
    /// Values, same layout.
    pub v: &'a [f32],
    /// Floats per slot (all KV heads).
    pub stride: usize,
    /// This head's first float within a slot.
    pub off: usize,
    /// The sequence's block table: position `p` is in slot
    /// `blocks[p / block_size] * block_size + p % block_size`.
    pub blocks: &'a [u32],
    pub block_size: usize,
}

impl KvHead<'_> {
    /// Offset of position `p`'s first float in the caches.
    #[inline]
    fn at(&self, p: usize) -> usize {
        let bs = self.block_size;
        let (b, i) = if bs.is_power_of_two() {
            (p >> bs.trailing_zeros(), p & (bs - 1))
        } else {
            (p / bs, p % bs)
        };
        (self.blocks[b] as usize * bs + i) * self.stride + self.off
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// For each row `r`: `out[r * hd..][..hd] = softmax(scale * q_r · K[p]) · V[p]` over positions
/// `p < n_ctx0 + r`, with `q_r = q[r * q_stride..][..hd]` and `out.len()` a multiple of `hd`.
pub fn attend_rows(
    kv: &KvHead,
    q: &[f32],
    q_stride: usize,
    hd: usize,
    n_ctx0: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend_rows_with(super::simd_level(), kv, q, q_stride, hd, n_ctx0, scale, out);
}

/// [`attend_rows`] at a chosen instruction set (lowered to what the CPU supports).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows_with(
    level: SimdLevel,
    kv: &KvHead,
    q: &[f32],
    q_stride: usize,
    hd: usize,
    n_ctx0: usize,
    scale: f32,
    out: &mut [f32],
) {
    assert!(hd > 0 && n_ctx0 > 0 && out.len().is_multiple_of(hd));
    let n_rows = out.len() / hd;
    if n_rows == 0 {
        return;
    }
    assert!(q.len() >= (n_rows - 1) * q_stride + hd, "attend_rows: q too short");
    let (bs, st) = (kv.block_size, kv.stride);
    assert!(bs > 0 && kv.off + hd <= st, "attend_rows: head outside the slot");
    let n_max = n_ctx0 + n_rows - 1;
    let limit = kv.k.len().min(kv.v.len());
    assert!(
        kv.blocks[..n_max.div_ceil(bs)]
            .iter()
            .all(|&b| (b as usize + 1) * bs * st <= limit),
        "attend_rows: block outside the cache"
    );
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.resize(n_max.next_multiple_of(16), 0.0);
        match level.clamp() {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 if hd <= 16 * x86::MAX_VECS => {
                // SAFETY: the level is clamped to the detected one, so AVX-512F is present;
                // every slot of the used blocks lies inside both caches and `off + hd <= stride`
                // (asserted above); `scores` holds `n_max` rounded up to 16 floats.
                unsafe { x86::attend_dispatch(kv, q, q_stride, hd, n_ctx0, scale, &mut scores, out) }
            }
            l => portable(l, kv, q, q_stride, hd, n_ctx0, scale, &mut scores, out),
        }
    });
}

#[allow(clippy::too_many_arguments)]
/// The reference path: one dispatched dot product and AXPY per position.
fn portable(
    level: SimdLevel,
    kv: &KvHead,
    q: &[f32],
    q_stride: usize,
    hd: usize,
    n_ctx0: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    for (r, o) in out.chunks_exact_mut(hd).enumerate() {
        let qr = &q[r * q_stride..][..hd];
        let n = n_ctx0 + r;
        let mut max = f32::NEG_INFINITY;
        for (p, sc) in scores[..n].iter_mut().enumerate() {
            *sc = super::dot_f32_with(level, qr, &kv.k[kv.at(p)..][..hd]) * scale;
            max = max.max(*sc);
        }
        let mut sum = 0.0;
        for sc in scores[..n].iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        o.fill(0.0);
        for (p, &w) in scores[..n].iter().enumerate() {
            super::axpy_with(level, w / sum, &kv.v[kv.at(p)..][..hd], o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::KvHead;

    /// Most 16-float vectors per head.
    pub(super) const MAX_VECS: usize = 8;

    /// `exp(x)` of eight f32 values, evaluated in f64 and rounded once: the correctly rounded
    /// result except when it lies within about 1e-13 of a rounding boundary (so it agrees with
    /// the scalar `f32::exp` of the portable path).
    #[target_feature(enable = "avx512f")]
    fn exp(x: __m256) -> __m256 {
        let x = _mm512_cvtps_pd(x);
        let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_pd(x, _mm512_set1_pd(std::f64::consts::LOG2_E)),
        );
        // ln 2 in two parts; `n * LN2_HI` is exact for the |n| < 2^11 that f32 inputs need.
        let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(0.693_147_180_369_123_8), x);
        let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.908_214_929_270_587_7e-10), r);
        // Taylor series to r^11 / 11! (|r| <= ln 2 / 2: truncation error below 1e-13).
        const INV_FACT: [f64; 12] = {
            let mut c = [1.0; 12];
            let mut k = 1;
            while k < 12 {
                c[k] = c[k - 1] / k as f64;
                k += 1;
            }
            c
        };
        let mut p = _mm512_set1_pd(INV_FACT[11]);
        for &c in INV_FACT[..11].iter().rev() {
            p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c));
        }
        _mm512_cvtpd_ps(_mm512_scalef_pd(p, n))
    }

    /// Sums of the lanes of `v[0..8]`, in lanes `0..8` of the result.
    #[target_feature(enable = "avx512f")]
    fn hsum8(v: [__m512; 8]) -> __m256 {
        let s = super::super::avx512::hsum8(v);
        // v[k] is in lane 4k, v[4 + k] in lane 4k + 1.
        let idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
        _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, s))
    }

    /// [`attend`] for `hd.div_ceil(16)` vectors.
    ///
    /// # Safety
    /// As [`attend`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attend_dispatch(
        kv: &KvHead,
        q: &[f32],
        q_stride: usize,
        hd: usize,
        n_ctx0: usize,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        macro_rules! go {
            ($($nv:literal)*) => {
                match hd.div_ceil(16) {
                    // SAFETY: forwarded from the caller.
                    $($nv => unsafe { attend::<$nv>(kv, q, q_stride, hd, n_ctx0, scale, scores, out) },)*
                    _ => unreachable!("head of {hd} floats"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8)
    }

    /// # Safety
    /// AVX-512F; `hd <= 16 * NV`; the caches hold every slot of the blocks of positions
    /// `< n_ctx0 + rows - 1` and `kv.off + hd <= kv.stride`; `q` holds the rows' queries;
    /// `scores.len()` is at least the longest context rounded up to 16.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn attend<const NV: usize>(
        kv: &KvHead,
        q: &[f32],
        q_stride: usize,
        hd: usize,
        n_ctx0: usize,
        scale: f32,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let nv = NV;
        let tail: __mmask16 = if hd.is_multiple_of(16) {
            0xFFFF
        } else {
            (1 << (hd % 16)) - 1
        };
        let mask = |j: usize| if j + 1 == nv { tail } else { 0xFFFF };
        let (kp, vp, sp) = (kv.k.as_ptr(), kv.v.as_ptr(), scores.as_mut_ptr());
        for (r, o) in out.chunks_exact_mut(hd).enumerate() {
            let n = n_ctx0 + r;
            let mut qv = [_mm512_setzero_ps(); NV];
            for (j, qj) in qv.iter_mut().enumerate() {
                // SAFETY: the row's query holds `hd` floats; the load is masked to them.
                *qj = unsafe { _mm512_maskz_loadu_ps(mask(j), q.as_ptr().add(r * q_stride + 16 * j)) };
            }
            // Scores, eight positions at a time (the last chunk padded with repeats of n - 1).
            let mut vmax = _mm512_set1_ps(f32::NEG_INFINITY);
            for p0 in (0..n).step_by(8) {
                let mut acc = [_mm512_setzero_ps(); 8];
                for (i, a) in acc.iter_mut().enumerate() {
                    let at = kv.at((p0 + i).min(n - 1));
                    // Even and odd vectors in two sums, as `dot_f32` adds them.
                    let mut odd = _mm512_setzero_ps();
                    for (j, &qj) in qv.iter().enumerate() {
                        // SAFETY: `at + hd` lies inside the key cache (caller's promise).
                        let k = unsafe { _mm512_maskz_loadu_ps(mask(j), kp.add(at + 16 * j)) };
                        if j % 2 == 0 {
                            *a = _mm512_fmadd_ps(qj, k, *a);
                        } else {
                            odd = _mm512_fmadd_ps(qj, k, odd);
                        }
                    }
                    *a = _mm512_add_ps(*a, odd);
                }
                let s = _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale));
                // SAFETY: `p0 + 8 <= n` rounded up to 16, within `scores`.
                unsafe { _mm256_storeu_ps(sp.add(p0), s) };
                vmax = _mm512_max_ps(vmax, _mm512_castps256_ps512(s));
            }
            // Lanes 8..16 of `vmax` are undefined after the casts; use the low half only.
            let max = _mm512_set1_ps(_mm512_mask_reduce_max_ps(0x00FF, vmax));
            let max8 = _mm512_castps512_ps256(max);
            for p0 in (0..n).step_by(8) {
                // SAFETY: `p0 + 8 <= scores.len()`.
                unsafe {
                    let e = exp(_mm256_sub_ps(_mm256_loadu_ps(sp.add(p0)), max8));
                    _mm256_storeu_ps(sp.add(p0), e);
                }
            }
            // The sum in order and the weights divided by it, as the portable path does.
            let mut sum = 0.0;
            for p in 0..n {
                // SAFETY: `p < n <= scores.len()`.
                sum += unsafe { *sp.add(p) };
            }
            let sumv = _mm512_set1_ps(sum);
            for p0 in (0..n).step_by(16) {
                // SAFETY: `p0 + 16 <= scores.len()`.
                unsafe { _mm512_storeu_ps(sp.add(p0), _mm512_div_ps(_mm512_loadu_ps(sp.add(p0)), sumv)) };
            }
            let mut acc = [_mm512_setzero_ps(); NV];
            for p in 0..n {
                let at = kv.at(p);
                // SAFETY: `p < n <= scores.len()`.
                let w = _mm512_set1_ps(unsafe { *sp.add(p) });
                for (j, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `at + hd` lies inside the value cache (caller's promise).
                    let v = unsafe { _mm512_maskz_loadu_ps(mask(j), vp.add(at + 16 * j)) };
                    *a = _mm512_fmadd_ps(w, v, *a);
                }
            }
            for (j, a) in acc.iter().enumerate() {
                // SAFETY: the row's output holds `hd` floats; the store is masked to them.
                unsafe { _mm512_mask_storeu_ps(o.as_mut_ptr().add(16 * j), mask(j), *a) };
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(super) fn portable_for_test(level: SimdLevel, kv: &KvHead, q: &[f32], q_stride: usize, hd: usize, n_ctx0: usize, scale: f32, out: &mut [f32]) {
    let mut scores = vec![0.0; 4096];
    portable(level, kv, q, q_stride, hd, n_ctx0, scale, &mut scores, out);
}
