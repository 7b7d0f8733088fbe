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

/// Attention of some query rows of `heads` query heads that share the KV head `kv`.
///
/// For row `r` and head `g < heads`: `out[(r * heads + g) * hd..][..hd] = softmax(scale * q ·
/// K[p]) · V[p]` over positions `p < n_ctx0 + r`, with `q = q[r * q_stride + g * hd..][..hd]`;
/// `out.len()` is a multiple of `heads * hd`. The result is the same, bit for bit, as one
/// [`super::dot_f32`] per position, `f32::exp` and one [`super::axpy`] per position (on glibc,
/// whose `expf` the AVX-512 path reproduces).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    kv: &KvHead,
    q: &[f32],
    q_stride: usize,
    hd: usize,
    heads: usize,
    n_ctx0: usize,
    scale: f32,
    out: &mut [f32],
) {
    attend_rows_with(
        super::simd_level(),
        kv,
        q,
        q_stride,
        hd,
        heads,
        n_ctx0,
        scale,
        out,
    );
}

/// [`attend_rows`] at a chosen instruction set (lowered to what the CPU supports).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows_with(
    level: SimdLevel,
    kv: &KvHead,
    q: &[f32],
    q_stride: usize,
    hd: usize,
    heads: usize,
    n_ctx0: usize,
    scale: f32,
    out: &mut [f32],
) {
    let width = hd * heads;
    assert!(width > 0 && n_ctx0 > 0 && out.len().is_multiple_of(width));
    let n_rows = out.len() / width;
    if n_rows == 0 {
        return;
    }
    assert!(
        q.len() >= (n_rows - 1) * q_stride + width,
        "attend_rows: q too short"
    );
    let (bs, st) = (kv.block_size, kv.stride);
    assert!(
        bs > 0 && kv.off + hd <= st,
        "attend_rows: head outside the slot"
    );
    let n_max = n_ctx0 + n_rows - 1;
    let limit = kv.k.len().min(kv.v.len());
    assert!(
        kv.blocks[..n_max.div_ceil(bs)]
            .iter()
            .all(|&b| (b as usize + 1) * bs * st <= limit),
        "attend_rows: block outside the cache"
    );
    let args = Args {
        q,
        q_stride,
        hd,
        heads,
        n_ctx0,
        scale,
        pad: n_max.next_multiple_of(16),
    };
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.resize(heads * args.pad, 0.0);
        match level.clamp() {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 if hd <= 16 * x86::MAX_VECS => {
                // SAFETY: the level is clamped to the detected one, so AVX-512F is present;
                // every slot of the used blocks lies inside both caches and `off + hd <= stride`,
                // `q` holds every row's heads (asserted above); `scores` holds `heads` runs of
                // `pad` floats.
                unsafe { x86::attend_dispatch(kv, &args, &mut scores, out) }
            }
            l => portable(l, kv, &args, &mut scores, out),
        }
    });
}

/// The shape of one call.
struct Args<'a> {
    q: &'a [f32],
    q_stride: usize,
    hd: usize,
    heads: usize,
    n_ctx0: usize,
    scale: f32,
    /// Scores per head in the scratch buffer: the longest context rounded up to 16.
    pad: usize,
}

/// The reference path: one dispatched dot product and AXPY per position.
fn portable(level: SimdLevel, kv: &KvHead, a: &Args, scores: &mut [f32], out: &mut [f32]) {
    let hd = a.hd;
    for (i, o) in out.chunks_exact_mut(hd).enumerate() {
        let (r, g) = (i / a.heads, i % a.heads);
        let qr = &a.q[r * a.q_stride + g * hd..][..hd];
        let n = a.n_ctx0 + r;
        let mut max = f32::NEG_INFINITY;
        for (p, sc) in scores[..n].iter_mut().enumerate() {
            *sc = super::dot_f32_with(level, qr, &kv.k[kv.at(p)..][..hd]) * a.scale;
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

    use super::{Args, KvHead};

    /// Most 16-float vectors per head.
    pub(super) const MAX_VECS: usize = 8;

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

    /// `exp(x)` of eight floats `x <= 0` (or NaN), computed as glibc's `expf` does (the
    /// optimized-routines algorithm: `2^(k/32)` from a table times a cubic in f64), which makes
    /// it agree with the scalar `f32::exp` of the portable path on glibc, bit for bit (checked
    /// over every float in [-104, 0]); elsewhere within an ulp.
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp(x: __m256) -> __m256 {
        let xd = _mm512_cvtps_pd(x);
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

    /// Asks for the cache line at `p` into L1.
    #[inline(always)]
    fn prefetch(p: *const f32) {
        // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
    }

    /// Sums of the lanes of `v[0..8]`, in lanes `0..8` of the result.
    #[target_feature(enable = "avx512f")]
    fn hsum8(v: [__m512; 8]) -> __m256 {
        let s = super::super::avx512::hsum8(v);
        // v[k] is in lane 4k, v[4 + k] in lane 4k + 1.
        let idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1, 12, 8, 4, 0);
        _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, s))
    }

    /// [`attend`] for `hd.div_ceil(16)` vectors, heads in groups of up to four (or two for
    /// heads of more than 64 floats).
    ///
    /// # Safety
    /// As [`attend`], for all of `a.heads`.
    pub(super) unsafe fn attend_dispatch(
        kv: &KvHead,
        a: &Args,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let nv = a.hd.div_ceil(16);
        let mut g0 = 0;
        while g0 < a.heads {
            let h = (a.heads - g0).min(if nv <= 4 { 4 } else { 2 });
            macro_rules! go {
                ($(($nv:literal, $h:literal))*) => {
                    match (nv, h) {
                        // SAFETY: forwarded from the caller; heads `g0..g0 + h` exist.
                        $(($nv, $h) => unsafe { attend::<$nv, $h>(kv, a, g0, scores, out) },)*
                        _ => unreachable!("head of {} floats", a.hd),
                    }
                };
            }
            go!(
                (1, 1)(1, 2)(1, 3)(1, 4)(2, 1)(2, 2)(2, 3)(2, 4)(3, 1)(3, 2)(3, 3)(3, 4)(4, 1)(
                    4, 2
                )(4, 3)(4, 4)(5, 1)(5, 2)(6, 1)(6, 2)(7, 1)(7, 2)(8, 1)(8, 2)
            );
            g0 += h;
        }
    }

    /// Heads `g0..g0 + H` of every row (see [`super::attend_rows`]).
    ///
    /// # Safety
    /// AVX-512F; `a.hd <= 16 * NV`; the caches hold every slot of the blocks of the positions
    /// used and `kv.off + hd <= kv.stride`; `a.q` holds every row's heads; `scores` holds
    /// `H` runs of `a.pad` floats; `out` holds the rows' `a.heads * hd` floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn attend<const NV: usize, const H: usize>(
        kv: &KvHead,
        a: &Args,
        g0: usize,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let hd = a.hd;
        let tail: __mmask16 = if hd.is_multiple_of(16) {
            0xFFFF
        } else {
            (1 << (hd % 16)) - 1
        };
        let mask = |j: usize| if j + 1 == NV { tail } else { 0xFFFF };
        let vp = kv.v.as_ptr();
        let base = scores.as_mut_ptr();
        let sp: [*mut f32; H] = std::array::from_fn(|g| base.wrapping_add(g * a.pad));
        for (r, o) in out.chunks_exact_mut(a.heads * hd).enumerate() {
            let n = a.n_ctx0 + r;
            for (g, &sg) in sp.iter().enumerate() {
                let qh = a.q[r * a.q_stride + (g0 + g) * hd..].as_ptr();
                // SAFETY: the head's query holds `hd` floats, keys `at + hd` lie inside the key
                // cache, and `sg` has `a.pad >= n` rounded up to 16 floats.
                unsafe { exp_scores::<NV>(kv, qh, mask, n, a.scale, g == 0, sg) };
            }
            // The sums in order and the weights divided by them, as the portable path does
            // (the heads' sums interleaved: each is a chain of dependent additions).
            let mut sum = [0f32; H];
            for p in 0..n {
                for (sum_g, &sg) in sum.iter_mut().zip(&sp) {
                    // SAFETY: `p < n <= a.pad`.
                    *sum_g += unsafe { *sg.add(p) };
                }
            }
            for (&sum_g, &sg) in sum.iter().zip(&sp) {
                let sum_g = _mm512_set1_ps(sum_g);
                for p0 in (0..n).step_by(16) {
                    // SAFETY: `p0 + 16 <= n` rounded up to 16 `<= a.pad`.
                    unsafe {
                        let w = _mm512_div_ps(_mm512_loadu_ps(sg.add(p0)), sum_g);
                        _mm512_storeu_ps(sg.add(p0), w);
                    }
                }
            }
            let mut acc = [[_mm512_setzero_ps(); NV]; H];
            for p in 0..n {
                let at = kv.at(p);
                // SAFETY: `p < n <= a.pad`.
                let w: [__m512; H] =
                    std::array::from_fn(|g| _mm512_set1_ps(unsafe { *sp[g].add(p) }));
                // `j` picks the lane mask, the value vector and the accumulator column alike.
                #[allow(clippy::needless_range_loop)]
                for j in 0..NV {
                    // SAFETY: `at + hd` lies inside the value cache (caller's promise).
                    let v = unsafe { _mm512_maskz_loadu_ps(mask(j), vp.add(at + 16 * j)) };
                    for (acc_g, &w_g) in acc.iter_mut().zip(&w) {
                        acc_g[j] = _mm512_fmadd_ps(w_g, v, acc_g[j]);
                    }
                }
            }
            for (g, acc_g) in acc.iter().enumerate() {
                let dst = o[(g0 + g) * hd..][..hd].as_mut_ptr();
                for (j, &v) in acc_g.iter().enumerate() {
                    // SAFETY: the head's output holds `hd` floats; the store is masked to them.
                    unsafe { _mm512_mask_storeu_ps(dst.add(16 * j), mask(j), v) };
                }
            }
        }
    }

    /// Writes `exp(score - max score)` of query `q` over positions `0..n` to `s[0..n]`; with
    /// `fetch`, also asks for the keys eight positions ahead and the values of each position
    /// (the KV cache of a decode step mostly comes from memory).
    ///
    /// # Safety
    /// AVX-512F; `q` holds the `hd` floats `mask` selects; every position's key lies inside the
    /// key cache; `s` holds `n` rounded up to 16 floats.
    #[target_feature(enable = "avx512f")]
    unsafe fn exp_scores<const NV: usize>(
        kv: &KvHead,
        q: *const f32,
        mask: impl Fn(usize) -> __mmask16,
        n: usize,
        scale: f32,
        fetch: bool,
        s: *mut f32,
    ) {
        let (kp, vp) = (kv.k.as_ptr(), kv.v.as_ptr());
        let lines = (16 * NV).div_ceil(16);
        // SAFETY: masked to the query's floats.
        let qv: [__m512; NV] =
            std::array::from_fn(|j| unsafe { _mm512_maskz_loadu_ps(mask(j), q.add(16 * j)) });
        // Scores, eight positions at a time (the last chunk padded with repeats of n - 1).
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for p0 in (0..n).step_by(8) {
            if fetch {
                for p in p0..(p0 + 8).min(n) {
                    let (ka, va) = (kv.at((p + 8).min(n - 1)), kv.at(p));
                    for l in 0..lines {
                        prefetch(kp.wrapping_add(ka + 16 * l));
                        prefetch(vp.wrapping_add(va + 16 * l));
                    }
                }
            }
            let acc: [__m512; 8] = std::array::from_fn(|i| {
                let at = kv.at((p0 + i).min(n - 1));
                // Even and odd vectors in two sums, as `dot_f32` adds them.
                let (mut even, mut odd) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                for (j, &qj) in qv.iter().enumerate() {
                    // SAFETY: the key lies inside the key cache (caller's promise).
                    let k = unsafe { _mm512_maskz_loadu_ps(mask(j), kp.add(at + 16 * j)) };
                    if j % 2 == 0 {
                        even = _mm512_fmadd_ps(qj, k, even);
                    } else {
                        odd = _mm512_fmadd_ps(qj, k, odd);
                    }
                }
                _mm512_add_ps(even, odd)
            });
            let sc = _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale));
            // SAFETY: `p0 + 8 <= n` rounded up to 16.
            unsafe { _mm256_storeu_ps(s.add(p0), sc) };
            vmax = _mm256_max_ps(vmax, sc);
        }
        let max = _mm512_mask_reduce_max_ps(0x00FF, _mm512_castps256_ps512(vmax));
        let max = _mm256_set1_ps(max);
        for p0 in (0..n).step_by(8) {
            // SAFETY: as above.
            unsafe {
                _mm256_storeu_ps(
                    s.add(p0),
                    exp(_mm256_sub_ps(_mm256_loadu_ps(s.add(p0)), max)),
                )
            };
        }
    }
}

/// [`x86::exp`] of eight values (AVX-512 only).
#[cfg(all(test, target_arch = "x86_64"))]
pub(super) fn exp8(x: &[f32]) -> [f32; 8] {
    assert!(x.len() >= 8 && super::simd_level() == SimdLevel::Avx512);
    let mut out = [0f32; 8];
    // SAFETY: AVX-512F is present (checked above); 8 floats are read and written.
    unsafe {
        use std::arch::x86_64::*;
        _mm256_storeu_ps(out.as_mut_ptr(), x86::exp(_mm256_loadu_ps(x.as_ptr())));
    }
    out
}

/// The portable path at `level`, for tests.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(super) fn portable_for_test(
    level: SimdLevel,
    kv: &KvHead,
    q: &[f32],
    q_stride: usize,
    hd: usize,
    heads: usize,
    n_ctx0: usize,
    scale: f32,
    out: &mut [f32],
) {
    let pad = (n_ctx0 + out.len() / (hd * heads)).next_multiple_of(16);
    let a = Args {
        q,
        q_stride,
        hd,
        heads,
        n_ctx0,
        scale,
        pad,
    };
    portable(level, kv, &a, &mut vec![0.0; pad], out);
}
