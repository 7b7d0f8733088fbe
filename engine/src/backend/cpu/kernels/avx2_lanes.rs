//! Quantized matmul on AVX2 with 16 weight rows side by side: the lane kernel
//! ([`super::lanes`]) for CPUs without AVX-512, reading the same [`LaneMatrix`].
//!
//! A lane-ordered block line is 64 bytes: four bytes of each of 16 rows. Here each line is two
//! ymm halves of 8 rows, computed one after the other. Without VNNI the byte dot products are
//! `vpmaddubsw` (unsigned weight bytes × signed activation bytes, pairs summed into i16), which
//! saturates unless one side stays small, as llama.cpp arranges: the weights go in as nibbles
//! (0..=15). Q4_1's values are nibbles already; Q8_0's unsigned bytes (`q + 128`) are split into
//! their two nibbles, `16 * hi + lo`. A pair of nibble products is at most 2 · 15 · 127 = 3810, so
//! the eight lines of a block sum in i16 (at most 30,480) before one `vpmaddwd` widens them to
//! i32: the exact integer dot product `vpdpbusd` gives on AVX-512. Where the CPU has AVX-VNNI
//! (`avxvnni`, or AVX-512 VNNI with VL), `vpdpbusd` on ymm does each line in one instruction.
//!
//! From the integer dot product on, every step is the AVX-512 kernel's (the same conversion,
//! scale, FMA and separate offset sum, in the same order), so the outputs are bit for bit the
//! AVX-512 kernel's, and like it do not depend on the batch, the tile or the task.

use std::arch::x86_64::*;
use std::ops::Range;

use super::lane_order::{LaneMatrix, LANES};
use super::lanes::{each_tile, is_q8};
use super::quant::QActs;
use super::scalar::QK;
use super::OutPtr;

/// Weight rows per tile: one per lane of two ymm halves.
const ROWS: usize = LANES;

/// Asks for the cache line at `p` into L1.
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// How a line of weight bytes meets an activation's four bytes broadcast: the integer dot
/// product of each row's four bytes, added to `acc` (i16 pairs or i32, as the kind keeps them).
trait Dot {
    /// Q8_0 bytes go in whole (VNNI) rather than split into nibbles.
    const WHOLE_BYTES: bool;
    /// `acc += w · x` per 32-bit lane (four byte products), in this kind's accumulator.
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i;
    /// The accumulator as i32 lanes, times `scale` (1 or 16).
    unsafe fn widen(acc: __m256i, scale: i16) -> __m256i;
}

/// `vpmaddubsw` into i16 pairs, widened once per block (exact for nibble weights).
struct MaddUbs;

impl Dot for MaddUbs {
    const WHOLE_BYTES: bool = false;
    #[inline(always)]
    unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: AVX2 (the calling kernel's features).
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(w, x)) }
    }
    #[inline(always)]
    unsafe fn widen(acc: __m256i, scale: i16) -> __m256i {
        // SAFETY: AVX2 (the calling kernel's features).
        unsafe { _mm256_madd_epi16(acc, _mm256_set1_epi16(scale)) }
    }
}

/// Defines a [`Dot`] kind `$name` doing each line with one `vpdpbusd` (`$f`), summing in i32.
macro_rules! vnni_dot {
    ($(#[$doc:meta])* $name:ident, $f:ident, $features:literal) => {
        $(#[$doc])*
        struct $name;

        impl Dot for $name {
            const WHOLE_BYTES: bool = true;
            #[inline(always)]
            unsafe fn dot(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
                // SAFETY: the calling kernel has the kind's features.
                unsafe { $f(acc, w, x) }
            }
            #[inline(always)]
            unsafe fn widen(acc: __m256i, _scale: i16) -> __m256i {
                acc
            }
        }
    };
}

vnni_dot!(
    /// AVX-VNNI's `vpdpbusd` on ymm.
    AvxVnni, _mm256_dpbusd_avx_epi32, "avxvnni"
);
vnni_dot!(
    /// The same instruction in its AVX-512 VNNI + VL encoding (same result): lets a CPU with
    /// AVX-512 test the AVX-VNNI arithmetic.
    Avx512Vl, _mm256_dpbusd_epi32, "avx512vnni,avx512vl"
);

/// Which instruction does the byte dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DotKind {
    /// `vpmaddubsw` + `vpmaddwd` (any AVX2 CPU).
    MaddUbs,
    /// AVX-VNNI `vpdpbusd` on ymm.
    AvxVnni,
    /// AVX-512 VNNI `vpdpbusd` on ymm (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Avx512Vl,
}

impl DotKind {
    /// The best kind this CPU has for the AVX2 level (AVX-512 CPUs run the AVX-512 kernel, so
    /// only a true AVX-VNNI CPU leaves `vpmaddubsw`).
    pub(crate) fn detect() -> DotKind {
        if std::arch::is_x86_feature_detected!("avxvnni") {
            DotKind::AvxVnni
        } else {
            DotKind::MaddUbs
        }
    }

    /// Whether this CPU can run the kind.
    #[cfg(test)]
    pub(crate) fn supported(self) -> bool {
        use std::arch::is_x86_feature_detected as has;
        match self {
            DotKind::MaddUbs => true,
            DotKind::AvxVnni => has!("avxvnni"),
            DotKind::Avx512Vl => has!("avx512vnni") && has!("avx512vl"),
        }
    }
}

/// One group of 16 weight rows times `C` activation rows; arguments and layout as
/// [`super::lanes`]'s tile.
///
/// # Safety
/// The CPU features of `D` plus AVX2, FMA, F16C; `group` holds one group of `w` (`Q8` selects
/// Q8_0, else Q4_1), the activations hold `C` rows of `nb` blocks, and `out + c * stride + r`
/// (and `res + c * stride + r` unless null) is writable for `c < C`, `r < n`.
#[inline(always)]
// `c` indexes the token's accumulators and its activation bytes alike.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn tile<D: Dot, const Q8: bool, const C: usize>(
    w: &LaneMatrix,
    group: *const u8,
    n: usize,
    xq: *const i8,
    xds: *const f32,
    out: *mut f32,
    res: *mut f32,
    stride: usize,
) {
    let (nb, sb, vb) = (w.nb(), w.scale_bytes(), w.value_bytes());
    let cols = nb * QK;
    let (scales, values) = (group, group.wrapping_add(w.scale_section()));
    let next = w.group_bytes();
    assert!((1..=ROWS).contains(&n));
    // SAFETY (whole body): AVX2, FMA, F16C and `D`'s features are the caller's promise; every
    // pointer read is inside the group or the activations, as noted at each access.
    unsafe {
        let nibble = _mm256_set1_epi8(0x0F);
        let zero = _mm256_setzero_si256();
        // Per half and token, the scaled dot products and (apart) the offset terms.
        let mut acc = [[_mm256_setzero_ps(); C]; 2];
        let mut macc = [[_mm256_setzero_ps(); C]; 2];
        for b in 0..nb {
            let (sp, vp) = (scales.wrapping_add(b * sb), values.wrapping_add(b * vb));
            for l in (0..vb).step_by(64) {
                prefetch(vp.wrapping_add(next + l));
            }
            if (b * sb).is_multiple_of(64) {
                prefetch(sp.wrapping_add(next));
            }
            // The activations' four bytes of line `v`, per token.
            let x4 = |c: usize, v: usize| {
                let xb = xq.wrapping_add(c * cols + b * QK) as *const i32;
                // SAFETY: values `4v..4v + 4` of block `b` of activation row `c < C`.
                _mm256_set1_epi32(xb.add(v).read_unaligned())
            };
            for h in 0..2 {
                // The f16 scales (and Q4_1's offsets) of the half's 8 rows: 16 bytes each.
                let d = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(16 * h) as *const _));
                let m = if Q8 {
                    _mm256_mul_ps(d, _mm256_set1_ps(-128.0))
                } else {
                    _mm256_cvtph_ps(_mm_loadu_si128(sp.add(32 + 16 * h) as *const _))
                };
                // Integer dot products per token: low nibbles (or whole bytes) and high ones.
                let mut lo = [zero; C];
                let mut hi = [zero; C];
                if Q8 {
                    for v in 0..8 {
                        // SAFETY: half `h` of line `v` of the block's 512 value bytes.
                        let t = _mm256_loadu_si256(vp.add(64 * v + 32 * h) as *const _);
                        if D::WHOLE_BYTES {
                            for c in 0..C {
                                lo[c] = D::dot(lo[c], t, x4(c, v));
                            }
                        } else {
                            let (l, u) = (
                                _mm256_and_si256(t, nibble),
                                _mm256_and_si256(_mm256_srli_epi16::<4>(t), nibble),
                            );
                            for c in 0..C {
                                let x = x4(c, v);
                                lo[c] = D::dot(lo[c], l, x);
                                hi[c] = D::dot(hi[c], u, x);
                            }
                        }
                    }
                } else {
                    for k in 0..4 {
                        // SAFETY: half `h` of line `k` of the block's 256 value bytes: elements
                        // `4k..` in the low nibbles, `16 + 4k..` in the high ones.
                        let t = _mm256_loadu_si256(vp.add(64 * k + 32 * h) as *const _);
                        let l = _mm256_and_si256(t, nibble);
                        let u = _mm256_and_si256(_mm256_srli_epi16::<4>(t), nibble);
                        for c in 0..C {
                            lo[c] = D::dot(lo[c], l, x4(c, k));
                            lo[c] = D::dot(lo[c], u, x4(c, k + 4));
                        }
                    }
                }
                for c in 0..C {
                    let mut dot = D::widen(lo[c], 1);
                    if Q8 && !D::WHOLE_BYTES {
                        dot = _mm256_add_epi32(D::widen(hi[c], 16), dot);
                    }
                    // SAFETY: the pair of block `b` of activation row `c`.
                    let (dx, sx) = {
                        let p = xds.add(c * 2 * nb + 2 * b);
                        (*p, *p.add(1))
                    };
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(dx));
                    acc[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[h][c]);
                    macc[h][c] = _mm256_fmadd_ps(m, _mm256_set1_ps(sx), macc[h][c]);
                }
            }
        }
        for c in 0..C {
            let mut y = [0f32; ROWS];
            for h in 0..2 {
                let v = _mm256_add_ps(acc[h][c], macc[h][c]);
                _mm256_storeu_ps(y.as_mut_ptr().add(8 * h), v);
            }
            // SAFETY: outputs `c * stride + r` for `r < n`, and the residual's alike.
            let (o, r) = (out.add(c * stride), res.wrapping_add(c * stride));
            for (i, &yi) in y[..n].iter().enumerate() {
                *o.add(i) = yi;
                if !res.is_null() {
                    *r.add(i) += yi;
                }
            }
        }
    }
}

/// Defines `$name`, [`tile`] with dot kind `$dot` compiled for `$features`.
macro_rules! tile_with {
    ($name:ident, $dot:ty, $features:literal) => {
        /// [`tile`] compiled for its dot kind's features.
        ///
        /// # Safety
        /// As [`tile`], on a CPU with these features.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name<const Q8: bool, const C: usize>(
            w: &LaneMatrix,
            group: *const u8,
            n: usize,
            xq: *const i8,
            xds: *const f32,
            out: *mut f32,
            res: *mut f32,
            stride: usize,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe { tile::<$dot, Q8, C>(w, group, n, xq, xds, out, res, stride) }
        }
    };
}

tile_with!(tile_maddubs, MaddUbs, "avx2,fma,f16c");
tile_with!(tile_avxvnni, AvxVnni, "avx2,fma,f16c,avxvnni");
tile_with!(tile_avx512vl, Avx512Vl, "avx2,fma,f16c,avx512vl,avx512vnni");

/// Outputs of lane-ordered weight `w` for `rows` × `toks` (`rows` starting at a group of 16),
/// as [`super::lanes::block`]; every [`DotKind`] gives the same bits.
///
/// The caller must have checked that the CPU supports AVX2, FMA and F16C, and `kind`.
pub(crate) fn block(
    kind: DotKind,
    w: &LaneMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
    residual: Option<OutPtr>,
) {
    let q8 = is_q8(w);
    each_tile(w, acts, rows, toks, out, residual, |t| {
        let (g, n, xq, xds, o, r, s) = (t.group, t.n, t.xq, t.xds, t.out, t.res, t.stride);
        macro_rules! go {
            ($($c:literal)*) => {
                match (kind, q8, t.c) {
                    // SAFETY: the tile's pointers are valid as `each_tile` says; the caller
                    // checked the CPU features (and `kind`'s).
                    $((DotKind::MaddUbs, true, $c) => unsafe {
                        tile_maddubs::<true, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (DotKind::MaddUbs, false, $c) => unsafe {
                        tile_maddubs::<false, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (DotKind::AvxVnni, true, $c) => unsafe {
                        tile_avxvnni::<true, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (DotKind::AvxVnni, false, $c) => unsafe {
                        tile_avxvnni::<false, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (DotKind::Avx512Vl, true, $c) => unsafe {
                        tile_avx512vl::<true, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (DotKind::Avx512Vl, false, $c) => unsafe {
                        tile_avx512vl::<false, $c>(w, g, n, xq, xds, o, r, s)
                    },)*
                    _ => unreachable!("tile of {} tokens", t.c),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
    });
}

#[cfg(test)]
mod tests {
    use super::super::lanes::{self, ByteDot};
    use super::super::tests::{random_acts, random_matrix, Rng};
    use super::super::{quant, simd_level, QMatrix, SimdLevel};
    use super::*;
    use crate::dtype::GgmlType;

    /// A lane kernel: AVX2's with a dot kind, or AVX-512's with one.
    #[derive(Clone, Copy, Debug)]
    enum Kernel {
        Avx2(DotKind),
        Avx512(ByteDot),
    }

    /// Runs `w · x` (`m` tokens) through `kernel`.
    fn run(kernel: Kernel, w: &LaneMatrix, x: &[f32], m: usize, cols: usize) -> Vec<f32> {
        let mut acts = QActs::default();
        acts.reset(m, cols);
        quant::quantize_rows(SimdLevel::Avx2, x, &mut acts.qs, &mut acts.ds, cols);
        let mut out = vec![f32::NAN; m * w.rows()];
        let mut res: Vec<f32> = (0..m * w.rows()).map(|i| i as f32 * 0.25).collect();
        let (o, r) = (OutPtr(out.as_mut_ptr()), OutPtr(res.as_mut_ptr()));
        match kernel {
            Kernel::Avx2(kind) => block(kind, w, &acts, 0..w.rows(), 0..m, o, Some(r)),
            Kernel::Avx512(kind) => lanes::block(kind, w, &acts, 0..w.rows(), 0..m, o, Some(r)),
        }
        out.extend(res);
        out
    }

    /// Every dot-product kind this CPU has gives the same bits (outputs and residuals), and on an
    /// AVX-512 CPU those of the AVX-512 lane kernel with and without VNNI; Q8_0 blocks of extreme
    /// bytes included, where an unsplit `vpmaddubsw` would saturate.
    #[test]
    fn kinds_agree_bit_for_bit_with_the_avx512_kernel() {
        if simd_level() == SimdLevel::Scalar {
            return;
        }
        let mut rng = Rng(21);
        for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
            for (rows, cols, m) in [(19, 32 * 5, 11), (32, 32 * 18, 8), (5, 32, 1)] {
                let mut data = random_matrix(&mut rng, dtype, rows, cols);
                if dtype == GgmlType::Q8_0 {
                    // Row 0's first block all -128 and +127.
                    for (k, b) in data[2..34].iter_mut().enumerate() {
                        *b = if k % 2 == 0 { 0x80 } else { 0x7F };
                    }
                }
                let w = QMatrix::new(dtype, rows, cols, &data).expect("valid");
                let lanes = LaneMatrix::new(&w).expect("mapped").expect("quantized");
                let mut x = random_acts(&mut rng, m * cols);
                x[..32]
                    .iter_mut()
                    .for_each(|v| *v = if *v < 0.0 { -1.0 } else { 1.0 });
                let want = run(Kernel::Avx2(DotKind::MaddUbs), &lanes, &x, m, cols);
                assert!(want.iter().all(|v| v.is_finite()), "every output written");
                let mut others = vec![DotKind::AvxVnni, DotKind::Avx512Vl];
                others.retain(|k| k.supported());
                let mut runs: Vec<_> = others.into_iter().map(Kernel::Avx2).collect();
                if SimdLevel::Avx512.clamp() == SimdLevel::Avx512 {
                    runs.push(Kernel::Avx512(ByteDot::MaddUbs));
                }
                if simd_level() == SimdLevel::Avx512Vnni {
                    runs.push(Kernel::Avx512(ByteDot::Vnni));
                }
                for kernel in runs {
                    let got = run(kernel, &lanes, &x, m, cols);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{dtype} {rows}x{cols} m={m} {kernel:?}");
                }
            }
        }
    }
}
