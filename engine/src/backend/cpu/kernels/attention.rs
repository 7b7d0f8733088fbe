//! Attention inner loops over a paged KV cache: the scores, softmax and weighted sum of values
//! of some query rows of one head, in one dispatched call.

use std::cell::RefCell;

use super::SimdLevel;
#[cfg(target_arch = "x86_64")]
use super::{flash, flash512, flash_amx, flash_bf16};

/// How a cache holds one KV head's keys and values within a block of `bs` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    /// f16 bits (llama.cpp's default cache type; half the bytes a decode step streams, and exact
    /// to widen): keys transposed, `[element][position]`, values `[position][element]`.
    F16,
    /// bf16 bits in the layouts AMX's tiles read (`flash_amx`), so that no step converts them:
    /// keys `[element pair][position][2]` (a block's keys are its key tiles as they are), values
    /// `[position pair][element][2]`. Rounded once, on the way in, where the kernel would round
    /// every time it read them.
    Bf16Tiles,
}

impl KvFormat {
    /// The format attention at `level` (lowered to what the CPU runs) reads for heads of `hd`
    /// in blocks of `bs`: [`KvFormat::Bf16Tiles`] where the AMX kernel takes the shape.
    pub fn for_level(level: SimdLevel, hd: usize, bs: usize) -> KvFormat {
        #[cfg(target_arch = "x86_64")]
        if level.clamp() == SimdLevel::Amx && flash_amx::takes(hd, bs) {
            return KvFormat::Bf16Tiles;
        }
        let _ = (level, hd, bs);
        KvFormat::F16
    }

    /// [`KvFormat::for_level`] at [`super::simd_level`].
    pub fn of(hd: usize, bs: usize) -> KvFormat {
        KvFormat::for_level(super::simd_level(), hd, bs)
    }
}

/// Stores position `i` of one KV head's block in `format`: `key` and `value` (`hd` each) into the
/// block's keys `k` and values `v` (`hd * bs` elements each).
pub fn store_kv(
    format: KvFormat,
    i: usize,
    key: &[f32],
    value: &[f32],
    k: &mut [u16],
    v: &mut [u16],
) {
    let hd = key.len();
    let bs = k.len() / hd;
    assert!(value.len() == hd && i < bs && k.len() == hd * bs && v.len() == hd * bs);
    assert!(hd <= 256, "store_kv: head of {hd}");
    let mut bits = [0u16; 256];
    let bits = &mut bits[..hd];
    match format {
        KvFormat::F16 => {
            super::to_f16(key, bits);
            for (d, &x) in bits.iter().enumerate() {
                k[d * bs + i] = x;
            }
            super::to_f16(value, &mut v[i * hd..][..hd]);
        }
        #[cfg(target_arch = "x86_64")]
        KvFormat::Bf16Tiles => {
            // SAFETY: `Bf16Tiles` is chosen only where the AMX level runs (AVX-512 F/BF16), for
            // heads of 32 or 64 (multiples of 16); the lengths are equal.
            unsafe { flash_amx::to_bf16(key, bits) };
            for (d, &x) in bits.iter().enumerate() {
                k[(d / 2) * 2 * bs + 2 * i + d % 2] = x;
            }
            // SAFETY: as above.
            unsafe { flash_amx::to_bf16(value, bits) };
            for (d, &x) in bits.iter().enumerate() {
                v[(i / 2) * 2 * hd + 2 * d + i % 2] = x;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        KvFormat::Bf16Tiles => unreachable!("bf16 tiles off x86"),
    }
}

/// One KV head of one sequence in a paged cache, in a [`KvFormat`].
///
/// A block's keys are stored transposed, so that one vector load holds one element of 16
/// positions: the scores of a block's 16 positions are `head_dim` FMAs with the query's elements
/// broadcast, each key load shared by every query head of the group, and no horizontal sums.
#[derive(Clone, Copy, Debug)]
pub struct KvHead<'a> {
    /// Keys: with [`KvFormat::F16`], element `d` of position `i` of block `b` at `b *
    /// block_stride + d * block_size + i`.
    pub k: &'a [u16],
    /// Values: with [`KvFormat::F16`], element `d` of position `i` of block `b` at `b *
    /// block_stride + i * head_dim + d`.
    pub v: &'a [u16],
    /// How the blocks hold them: the format of [`KvFormat::for_level`] at the level attention
    /// runs at (checked).
    pub format: KvFormat,
    pub head_dim: usize,
    /// Elements from one block to the next (at least `block_size * head_dim`).
    pub block_stride: usize,
    /// The sequence's block table: position `p` is position `p % block_size` of block
    /// `blocks[p / block_size]`.
    pub blocks: &'a [u32],
    pub block_size: usize,
}

impl KvHead<'_> {
    /// The first element of position `p`'s block and `p`'s place in it.
    #[inline]
    fn block_of(&self, p: usize) -> (usize, usize) {
        let bs = self.block_size;
        let (b, i) = if bs.is_power_of_two() {
            (p >> bs.trailing_zeros(), p & (bs - 1))
        } else {
            (p / bs, p % bs)
        };
        (self.blocks[b] as usize * self.block_stride, i)
    }

    /// Offset of position `p`'s value in the value cache.
    #[inline]
    fn value_at(&self, p: usize) -> usize {
        let (base, i) = self.block_of(p);
        base + i * self.head_dim
    }

    /// Position `p`'s key, widened to f32.
    fn key(&self, p: usize, out: &mut [f32]) {
        let (base, i) = self.block_of(p);
        for (d, o) in out.iter_mut().enumerate() {
            *o = half::f16::from_bits(self.k[base + d * self.block_size + i]).to_f32();
        }
    }
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention of some query rows of `heads` query heads that share the KV head `kv`.
///
/// For row `r` and head `g < heads`: `out[(r * heads + g) * hd..][..hd] = softmax(scale * q ·
/// K[p]) · V[p]` over positions `p < n_ctx0 + r`, with `q = q[r * q_stride + g * hd..][..hd]`;
/// `out.len()` is a multiple of `heads * hd`. A row's result does not depend on the other rows or
/// on how heads are grouped into calls, nor on whether it is a prefill or a decode row; levels
/// agree within float tolerance (heads of 32, 64 or 128 floats in blocks of 16 take the tiled
/// online softmax of `flash` on AVX2 and of `flash512` on AVX-512; other shapes on AVX-512 the
/// per-row kernel here, which sums each score over the head's elements in two interleaved chains
/// and the weights in 8 lanes, and divides the weighted sum of values once; the portable path
/// sums in order and divides each weight).
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
    let bs = kv.block_size;
    assert!(
        bs > 0 && kv.head_dim == hd && bs * hd <= kv.block_stride,
        "attend_rows: head outside the block"
    );
    let n_max = n_ctx0 + n_rows - 1;
    let limit = kv.k.len().min(kv.v.len());
    assert!(
        kv.blocks[..n_max.div_ceil(bs)]
            .iter()
            .all(|&b| b as usize * kv.block_stride + bs * hd <= limit),
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
    let level = level.clamp();
    assert_eq!(
        kv.format,
        KvFormat::for_level(level, hd, bs),
        "attend_rows: a cache of another level's format"
    );
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar && flash::takes(hd, bs) {
        let call = flash::Call {
            q,
            q_stride,
            hd,
            heads,
            n_ctx0,
            scale,
        };
        if matches!(level, SimdLevel::Avx2 | SimdLevel::Avx2Vnni) {
            // SAFETY: the level is clamped to what the CPU runs, so AVX2, FMA and F16C are
            // present; every used block lies inside both caches and `q` holds every row's heads
            // (asserted above); `out` holds the rows.
            unsafe { flash::run_avx2(kv, &call, out) };
        } else if kv.format == KvFormat::Bf16Tiles {
            // SAFETY: as above, with AVX-512 F/BW/DQ/VL/BF16: the format is the AMX level's, which
            // runs here only where the tile state was granted (`flash_amx::usable`), for a
            // shape its kernel takes.
            unsafe { flash_amx::run(kv, &call, out) };
        } else if matches!(level, SimdLevel::Avx512Bf16 | SimdLevel::Amx) {
            // SAFETY: as above, with AVX-512 F/BW/VL/BF16.
            unsafe { flash_bf16::run(kv, &call, out) };
        } else {
            // SAFETY: as above, with AVX-512 F/BW/VL (both other AVX-512 levels).
            unsafe { flash512::run(kv, &call, out) };
        }
        return;
    }
    SCORES.with(|cell| {
        let mut scores = cell.borrow_mut();
        scores.resize(heads * args.pad, 0.0);
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx
                if hd <= 16 * x86::MAX_VECS && bs == 16 =>
            {
                // SAFETY: the level is clamped to what the CPU runs: AVX-512 F/BW/VL are present;
                // every used block lies inside both caches, `q` holds every row's heads (asserted
                // above); `scores` holds `heads` runs of `pad` floats.
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
            kv.key(p, &mut wide);
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
            widen(&kv.v[kv.value_at(p)..][..hd], &mut wide);
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
    /// AVX-512 F/BW/VL; `a.hd <= 16 * NV` and `kv.head_dim == a.hd`; `kv.block_size == 16`; the
    /// blocks of the positions used lie inside both caches; `a.q` holds every row's heads;
    /// `scores` holds `H` runs of `a.pad` floats; `out` holds the rows' `a.heads * hd` floats.
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
            let qh: [*const f32; H] =
                std::array::from_fn(|g| a.q[r * a.q_stride + (g0 + g) * hd..].as_ptr());
            // SAFETY: each head's query holds `hd` floats, the positions' blocks lie inside both
            // caches, and each `sp[g]` has `a.pad >= n` rounded up to 16 floats.
            let sum = unsafe { exp_scores::<H>(kv, qh, n, a.scale, sp) };
            let mut acc = [[_mm512_setzero_ps(); NV]; H];
            for p in 0..n {
                let at = kv.value_at(p);
                // SAFETY: `p < n <= a.pad`.
                let w: [__m512; H] =
                    std::array::from_fn(|g| _mm512_set1_ps(unsafe { *sp[g].add(p) }));
                // `j` picks the lane mask, the value vector and the accumulator column alike.
                #[allow(clippy::needless_range_loop)]
                for j in 0..NV {
                    // SAFETY: position `p`'s value (`hd` from `at`) lies inside the value cache
                    // (caller's promise).
                    let v = unsafe { load_f16(mask(j), vp.add(at + 16 * j)) };
                    for (acc_g, &w_g) in acc.iter_mut().zip(&w) {
                        acc_g[j] = _mm512_fmadd_ps(w_g, v, acc_g[j]);
                    }
                }
            }
            // The weighted sum of values, divided by the sum of the weights once at the end.
            for (g, (acc_g, &sum_g)) in acc.iter().zip(&sum).enumerate() {
                let dst = o[(g0 + g) * hd..][..hd].as_mut_ptr();
                let sum_g = _mm512_set1_ps(sum_g);
                for (j, &v) in acc_g.iter().enumerate() {
                    // SAFETY: the head's output holds `hd` floats; the store is masked to them.
                    unsafe {
                        _mm512_mask_storeu_ps(dst.add(16 * j), mask(j), _mm512_div_ps(v, sum_g))
                    };
                }
            }
        }
    }

    /// Writes `exp(score - max score)` of each query `q[g]` over positions `0..n` to
    /// `s[g][0..n]` and returns their sums, a block of 16 positions at a time: per element `d` of
    /// the head, one load of the 16 keys' element `d` and an FMA with `q[g][d]` broadcast for each
    /// head (two chains per head, even and odd `d`). Asks for the next block's keys and this
    /// block's values ahead of use (the KV cache of a decode step mostly comes from memory).
    ///
    /// # Safety
    /// AVX-512 F/BW/VL; `kv.block_size == 16`; each `q[g]` holds `kv.head_dim` floats; the blocks
    /// of positions `0..n` lie inside both caches; each `s[g]` holds `n` rounded up to 16 floats.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn exp_scores<const H: usize>(
        kv: &KvHead,
        q: [*const f32; H],
        n: usize,
        scale: f32,
        s: [*mut f32; H],
    ) -> [f32; H] {
        let (kp, vp, hd) = (kv.k.as_ptr(), kv.v.as_ptr(), kv.head_dim);
        let n_blocks = n.div_ceil(16);
        let mut vmax = [_mm512_set1_ps(f32::NEG_INFINITY); H];
        for b in 0..n_blocks {
            let base = kv.blocks[b] as usize * kv.block_stride;
            // 32 f16 a cache line; a block's keys (and values) are `16 * hd` contiguous ones.
            if let Some(&next) = kv.blocks[..n_blocks].get(b + 1) {
                let next = next as usize * kv.block_stride;
                for l in (0..16 * hd).step_by(32) {
                    prefetch(kp.wrapping_add(next + l));
                }
            }
            for l in (0..16 * hd).step_by(32) {
                prefetch(vp.wrapping_add(base + l));
            }
            // Two chains a head, for even and odd `d`, each in its own register.
            let mut even = [_mm512_setzero_ps(); H];
            let mut odd = [_mm512_setzero_ps(); H];
            let fma = |acc: &mut [__m512; H], d: usize| {
                // SAFETY: element `d < hd` of the block's 16 keys (caller's promise).
                let k = unsafe { load_f16(0xFFFF, kp.add(base + 16 * d)) };
                for (acc_g, &qg) in acc.iter_mut().zip(&q) {
                    // SAFETY: `d < hd` floats of the query.
                    let qd = _mm512_set1_ps(unsafe { *qg.add(d) });
                    *acc_g = _mm512_fmadd_ps(qd, k, *acc_g);
                }
            };
            for d in (0..hd - 1).step_by(2) {
                fma(&mut even, d);
                fma(&mut odd, d + 1);
            }
            if hd % 2 == 1 {
                fma(&mut even, hd - 1);
            }
            // Positions past `n` (the end of the last block) score -inf: weight 0.
            let live: __mmask16 = (u32::MAX >> (32 - (n - 16 * b).min(16))) as __mmask16;
            for (((&even_g, &odd_g), vmax_g), &sg) in even.iter().zip(&odd).zip(&mut vmax).zip(&s) {
                let sc = _mm512_mul_ps(_mm512_add_ps(even_g, odd_g), _mm512_set1_ps(scale));
                let sc = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), live, sc);
                // SAFETY: `16 * b + 16 <= n` rounded up to 16.
                unsafe { _mm512_storeu_ps(sg.add(16 * b), sc) };
                *vmax_g = _mm512_max_ps(*vmax_g, sc);
            }
        }
        std::array::from_fn(|g| {
            let (max, sg) = (_mm256_set1_ps(_mm512_reduce_max_ps(vmax[g])), s[g]);
            let mut sum = _mm256_setzero_ps();
            for p0 in (0..n).step_by(8) {
                // SAFETY: `p0 + 8 <= n` rounded up to 16; past `n` the scores are -inf.
                unsafe {
                    let e = exp(_mm256_sub_ps(_mm256_loadu_ps(sg.add(p0)), max));
                    _mm256_storeu_ps(sg.add(p0), e);
                    sum = _mm256_add_ps(sum, e);
                }
            }
            _mm512_reduce_add_ps(_mm512_zextps256_ps512(sum))
        })
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
