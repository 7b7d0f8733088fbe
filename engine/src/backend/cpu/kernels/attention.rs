//! Attention inner loops over a paged KV cache: the scores, softmax and weighted sum of values
//! of some query rows of one head, in one dispatched call.

use std::cell::RefCell;

use super::SimdLevel;

/// One KV head of one sequence in a paged cache of f16 keys and values (as bits: llama.cpp's
/// default cache type; half the bytes a decode step streams, and exact to widen).
#[derive(Clone, Copy, Debug)]
pub struct KvHead<'a> {
    /// Keys: position `i` of block `b` at `b * block_stride + i * stride + off`.
    pub k: &'a [u16],
    /// Values, same layout.
    pub v: &'a [u16],
    /// Elements from one position of a block to the next.
    pub stride: usize,
    /// Elements from one block to the next (at least `block_size * stride`).
    pub block_stride: usize,
    /// This head's first element within a position.
    pub off: usize,
    /// The sequence's block table: position `p` is position `p % block_size` of block
    /// `blocks[p / block_size]`.
    pub blocks: &'a [u32],
    pub block_size: usize,
}

impl KvHead<'_> {
    /// Offset of position `p`'s first element in the caches.
    #[inline]
    fn at(&self, p: usize) -> usize {
        let bs = self.block_size;
        let (b, i) = if bs.is_power_of_two() {
            (p >> bs.trailing_zeros(), p & (bs - 1))
        } else {
            (p / bs, p % bs)
        };
        self.blocks[b] as usize * self.block_stride + i * self.stride + self.off
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention of some query rows of `heads` query heads that share the KV head `kv`.
///
/// For row `r` and head `g < heads`: `out[(r * heads + g) * hd..][..hd] = softmax(scale * q ·
/// K[p]) · V[p]` over positions `p < n_ctx0 + r`, with `q = q[r * q_stride + g * hd..][..hd]`;
/// `out.len()` is a multiple of `heads * hd`. The result is the same, bit for bit, as widening
/// each position's key and value to f32, then one [`super::dot_f32`] per position, `f32::exp`
/// and one [`super::axpy`] per position (on glibc, whose `expf` the AVX-512 path reproduces).
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
        bs > 0 && kv.off + hd <= st && bs * st <= kv.block_stride,
        "attend_rows: head outside the slot"
    );
    let n_max = n_ctx0 + n_rows - 1;
    let limit = kv.k.len().min(kv.v.len());
    assert!(
        kv.blocks[..n_max.div_ceil(bs)]
            .iter()
            .all(|&b| b as usize * kv.block_stride + bs * st <= limit),
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
                // SAFETY: the level is clamped to the detected one, so AVX-512 F/BW/VL are present;
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
    let mut wide = vec![0f32; hd];
    let widen = |src: &[u16], dst: &mut [f32]| {
        for (d, &h) in dst.iter_mut().zip(src) {
            *d = half::f16::from_bits(h).to_f32();
        }
    };
    for (i, o) in out.chunks_exact_mut(hd).enumerate() {
        let (r, g) = (i / a.heads, i % a.heads);
        let qr = &a.q[r * a.q_stride + g * hd..][..hd];
        let n = a.n_ctx0 + r;
        let mut max = f32::NEG_INFINITY;
        for (p, sc) in scores[..n].iter_mut().enumerate() {
            widen(&kv.k[kv.at(p)..][..hd], &mut wide);
            *sc = super::dot_f32_with(level, qr, &wide) * a.scale;
            max = max.max(*sc);
        }
        let mut sum = 0.0;
        for sc in scores[..n].iter_mut() {
            *sc = (*sc - max).exp();
            sum += *sc;
        }
        o.fill(0.0);
        for (p, &w) in scores[..n].iter().enumerate() {
            widen(&kv.v[kv.at(p)..][..hd], &mut wide);
            super::axpy_with(level, w / sum, &wide, o);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::vexp::exp;
    use super::{Args, KvHead};

    /// Most 16-float vectors per head.
    pub(super) const MAX_VECS: usize = 8;
    /// How many positions ahead keys are fetched.
    const KEY_AHEAD: usize = 8;

    /// Asks for the cache line at `p` into L1.
    #[inline(always)]
    fn prefetch(p: *const u16) {
        // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
    }

    /// The f16 values at `p` that `mask` selects (up to 16), widened to f32.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL; the selected values are readable.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    #[inline]
    unsafe fn load_f16(mask: __mmask16, p: *const u16) -> __m512 {
        // SAFETY: masked to readable values (caller's promise).
        _mm512_cvtph_ps(unsafe { _mm256_maskz_loadu_epi16(mask, p as *const i16) })
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
    /// AVX-512 F/BW/VL; `a.hd <= 16 * NV`; the caches hold every slot of the blocks of the positions
    /// used and `kv.off + hd <= kv.stride`; `a.q` holds every row's heads; `scores` holds
    /// `H` runs of `a.pad` floats; `out` holds the rows' `a.heads * hd` floats.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
                    let v = unsafe { load_f16(mask(j), vp.add(at + 16 * j)) };
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
    /// AVX-512 F/BW/VL; `q` holds the `hd` floats `mask` selects; every position's key lies inside the
    /// key cache; `s` holds `n` rounded up to 16 floats.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
        // Cache lines of one position's head: 32 f16 each.
        let lines = NV.div_ceil(2);
        // SAFETY: masked to the query's floats.
        let qv: [__m512; NV] =
            std::array::from_fn(|j| unsafe { _mm512_maskz_loadu_ps(mask(j), q.add(16 * j)) });
        // Scores, eight positions at a time (the last chunk padded with repeats of n - 1).
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for p0 in (0..n).step_by(8) {
            if fetch {
                for p in p0..(p0 + 8).min(n) {
                    let (ka, va) = (kv.at((p + KEY_AHEAD).min(n - 1)), kv.at(p));
                    for l in 0..lines {
                        prefetch(kp.wrapping_add(ka + 32 * l));
                        prefetch(vp.wrapping_add(va + 32 * l));
                    }
                }
            }
            let acc: [__m512; 8] = std::array::from_fn(|i| {
                let at = kv.at((p0 + i).min(n - 1));
                // Even and odd vectors in two sums, as `dot_f32` adds them.
                let (mut even, mut odd) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                for (j, &qj) in qv.iter().enumerate() {
                    // SAFETY: the key lies inside the key cache (caller's promise).
                    let k = unsafe { load_f16(mask(j), kp.add(at + 16 * j)) };
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
