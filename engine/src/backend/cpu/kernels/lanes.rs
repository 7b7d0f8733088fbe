//! Quantized matmul on AVX-512 with 16 weight rows side by side, one per lane.
//!
//! The stored-layout kernels ([`super::avx512`]) give each block 8 lanes of a `vpdpbusd`, so
//! every two blocks cost an int-to-float conversion, a scale and a horizontal sum per (weight
//! row, token). Here the weights are in lane order ([`LaneMatrix`], arranged once at load): for
//! each block, register `v` holds elements `4v..4v + 4` of the block in each of 16 rows' lanes,
//! loaded as stored. Each token then needs eight `vpdpbusd` against its own four bytes broadcast
//! to all lanes, which leave the block's dot product of every row in that row's lane; a
//! conversion, a multiply by `d_w * d_x` and an FMA finish the block for 16 rows, and one more
//! FMA adds the offset term (Q4_1's `m * s`, or `-128 * d * s` for Q8_0 bytes stored unsigned)
//! to a separate sum: these terms are large and mostly cancel the others, and summing them apart
//! keeps more of the result (teacher-forced agreement with llama.cpp: 97.7% against 95.8% with
//! one sum). Each block's loads are shared by up to 8 tokens, and each token's sums end up holding
//! its 16 outputs: no horizontal sums, no partial groups, and the activations are read in their
//! plain quantized layout.
//!
//! Without VNNI (Skylake-SP, Cascade Lake's predecessors, AVX-512 Zen 4 parts with it masked
//! off) the byte dot products are `vpmaddubsw` + `vpmaddwd` on zmm ([`ByteDot::MaddUbs`]), as
//! the AVX2 lane kernel does on ymm: Q4_1 nibbles go in as they are and Q8_0's unsigned bytes
//! split into their two nibbles (`16 * hi + lo`), so the i16 pair sums never saturate (a line's
//! pair is at most 2 · 15 · 127, eight lines 30,480) and widen to the exact integer dot product
//! `vpdpbusd` gives. Everything after it is shared, so both kinds give the same bits.
//!
//! Every output is the same sequence of operations whatever the batch size, the tile or the
//! task it falls in, so a sequence's results do not depend on what else is in the batch.

use std::arch::x86_64::*;
use std::ops::Range;

use super::lane_order::{LaneMatrix, LANES};
use super::quant::QActs;
use super::scalar::QK;
use super::OutPtr;
use crate::dtype::GgmlType;

/// Weight rows per tile: one per lane.
const ROWS: usize = LANES;
/// Most activation rows per tile (its accumulators).
const MAX_C: usize = 8;

/// Asks for the cache line at `p` into L1.
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// How a line of weight bytes meets a token's four bytes broadcast: the integer dot product of
/// each row's four bytes, added to `acc` (i16 pairs or i32, as the kind keeps them).
trait Dot {
    /// Q8_0 bytes go in whole (VNNI) rather than split into nibbles.
    const WHOLE_BYTES: bool;
    /// `acc += w · x` per 32-bit lane (four byte products), in this kind's accumulator.
    unsafe fn dot(acc: __m512i, w: __m512i, x: __m512i) -> __m512i;
    /// The accumulator as i32 lanes, times `scale` (1 or 16).
    unsafe fn widen(acc: __m512i, scale: i16) -> __m512i;
}

/// AVX-512 VNNI's `vpdpbusd`, summing in i32.
struct Vnni;

impl Dot for Vnni {
    const WHOLE_BYTES: bool = true;
    #[inline(always)]
    unsafe fn dot(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
        // SAFETY: AVX-512 VNNI (the calling kernel's features).
        unsafe { _mm512_dpbusd_epi32(acc, w, x) }
    }
    #[inline(always)]
    unsafe fn widen(acc: __m512i, _scale: i16) -> __m512i {
        acc
    }
}

/// AVX-512 BW's `vpmaddubsw` into i16 pairs, widened once per block by `vpmaddwd` (exact for
/// nibble weights).
struct MaddUbs;

impl Dot for MaddUbs {
    const WHOLE_BYTES: bool = false;
    #[inline(always)]
    unsafe fn dot(acc: __m512i, w: __m512i, x: __m512i) -> __m512i {
        // SAFETY: AVX-512 BW (the calling kernel's features).
        unsafe { _mm512_add_epi16(acc, _mm512_maddubs_epi16(w, x)) }
    }
    #[inline(always)]
    unsafe fn widen(acc: __m512i, scale: i16) -> __m512i {
        // SAFETY: AVX-512 BW (the calling kernel's features).
        unsafe { _mm512_madd_epi16(acc, _mm512_set1_epi16(scale)) }
    }
}

/// Which instruction does the AVX-512 lane kernel's byte dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ByteDot {
    /// `vpdpbusd` (AVX-512 VNNI).
    Vnni,
    /// `vpmaddubsw` + `vpmaddwd` (AVX-512 BW).
    MaddUbs,
}

/// One group of 16 weight rows (`group`, laid out as [`LaneMatrix`] describes, `n` of its lanes
/// stored) times `C` activation rows (quantized values `xq`, `nb * 32` apart; `(d, s)` pairs
/// `xds`, `2 * nb` apart): `out[c * stride + r]`, also added to `res[c * stride + r]` unless
/// `res` is null. Prefetches the group after it (`group_bytes` on), which is the next tile's.
///
/// # Safety
/// AVX-512 F/BW/VL, FMA, F16C and `D`'s features; `group` holds one group of `w` (`Q8` selects
/// Q8_0, else Q4_1), the activations hold `C` rows of `nb` blocks, and `out + c * stride + r`
/// (and `res + c * stride + r` unless null) is writable for `c < C`, `r < n`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
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
    let rows: __mmask16 = if n == ROWS { 0xFFFF } else { (1 << n) - 1 };
    // SAFETY (whole body): AVX-512 F/BW/VL, FMA, F16C and `D`'s features are the caller's
    // promise; every pointer read is inside the group or the activations, and every store inside
    // the outputs (and the residual), as noted at each access.
    unsafe {
        let zero = _mm512_setzero_si512();
        let nibble = _mm512_set1_epi8(0x0F);
        // Per token, the scaled dot products and (apart: they are large and mostly cancel them)
        // the offset terms.
        let mut acc = [_mm512_setzero_ps(); C];
        let mut macc = [_mm512_setzero_ps(); C];
        for b in 0..nb {
            let (sp, vp) = (scales.wrapping_add(b * sb), values.wrapping_add(b * vb));
            // The next group's block, a group ahead of use: in decode the weights stream from
            // memory.
            for l in (0..vb).step_by(64) {
                prefetch(vp.wrapping_add(next + l));
            }
            if (b * sb).is_multiple_of(64) {
                prefetch(sp.wrapping_add(next));
            }
            // The f16 scales (and Q4_1's offsets) of the 16 rows' blocks: the block's 32 (64)
            // scale bytes.
            let (d, m) = if Q8 {
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(sp as *const _));
                (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)))
            } else {
                let dm = _mm512_loadu_si512(sp as *const _);
                (
                    _mm512_cvtph_ps(_mm512_castsi512_si256(dm)),
                    _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(dm)),
                )
            };
            // Line `v`: elements `4v..4v + 4` of each row's block, as unsigned bytes (line `v`
            // of the block's 512 value bytes; Q4_1: line `k` of its 256, both nibbles).
            let mut lines = [zero; 8];
            if Q8 {
                for (v, line) in lines.iter_mut().enumerate() {
                    *line = _mm512_loadu_si512(vp.add(64 * v) as *const _);
                }
            } else {
                for k in 0..4 {
                    let t = _mm512_loadu_si512(vp.add(64 * k) as *const _);
                    lines[k] = _mm512_and_si512(t, nibble);
                    lines[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(t), nibble);
                }
            }
            for (c, (acc_c, macc_c)) in acc.iter_mut().zip(macc.iter_mut()).enumerate() {
                let xb = xq.wrapping_add(c * cols + b * QK) as *const i32;
                // Whole bytes (or low nibbles) and, for Q8_0 without VNNI, high nibbles.
                let (mut lo, mut hi) = (zero, zero);
                for (v, &line) in lines.iter().enumerate() {
                    // Values `4v..4v + 4` of block `b` of activation row `c`.
                    let x = _mm512_set1_epi32(xb.add(v).read_unaligned());
                    if Q8 && !D::WHOLE_BYTES {
                        let u = _mm512_and_si512(_mm512_srli_epi16::<4>(line), nibble);
                        lo = D::dot(lo, _mm512_and_si512(line, nibble), x);
                        hi = D::dot(hi, u, x);
                    } else {
                        lo = D::dot(lo, line, x);
                    }
                }
                let mut dot = D::widen(lo, 1);
                if Q8 && !D::WHOLE_BYTES {
                    dot = _mm512_add_epi32(D::widen(hi, 16), dot);
                }
                // The pair of block `b` of activation row `c`.
                let p = xds.add(c * 2 * nb + 2 * b);
                let (dx, sx) = (*p, *p.add(1));
                let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
                *acc_c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc_c);
                *macc_c = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), *macc_c);
            }
        }
        for (c, (&a, &ma)) in acc.iter().zip(&macc).enumerate() {
            let y = _mm512_add_ps(a, ma);
            // Outputs `c * stride + r` for `r < n` (the mask), and the residual's alike.
            _mm512_mask_storeu_ps(out.add(c * stride), rows, y);
            if !res.is_null() {
                let r = res.add(c * stride);
                let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(rows, r), y);
                _mm512_mask_storeu_ps(r, rows, sum);
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

tile_with!(
    tile_vnni,
    Vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"
);
tile_with!(tile_maddubs, MaddUbs, "avx512f,avx512bw,avx512vl,fma,f16c");

/// One tile of [`each_tile`]: a group of 16 weight rows (`n` of them real) times `c` tokens.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    /// Tokens (at most `MAX_C`).
    pub c: usize,
    pub group: *const u8,
    pub n: usize,
    pub xq: *const i8,
    pub xds: *const f32,
    pub out: *mut f32,
    /// The residual's place for the tile's outputs, or null.
    pub res: *mut f32,
    pub stride: usize,
}

/// Cuts `rows` × `toks` of lane-ordered weight `w` (`rows` starting at a group of 16) into
/// [`Tile`]s of 16 rows × up to 8 tokens and runs `f` on each. A tile's pointers are valid for
/// what its fields say: `group` is a whole group of `w`, tokens `c` rows of the activations, and
/// outputs `out + ci * stride + r` (and the residual's) for `ci < c`, `r < n` lie below
/// `m * w.rows` and belong to this task only (see `OutPtr`; the caller sized the output and the
/// residual so).
pub(crate) fn each_tile(
    w: &LaneMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
    residual: Option<OutPtr>,
    mut f: impl FnMut(Tile),
) {
    let (nb, cols, gb) = (acts.nb, acts.cols, w.group_bytes());
    assert!(rows.end <= w.rows() && rows.start.is_multiple_of(ROWS));
    assert!(toks.end <= acts.m && nb == w.nb());
    assert!(acts.qs.len() >= acts.m * cols && acts.ds.len() >= acts.m * 2 * nb);
    let bytes = w.bytes();
    // Token tiles of nearly equal size, at most `MAX_C`.
    let parts = toks.len().div_ceil(MAX_C);
    let mut i = toks.start;
    for k in 0..parts {
        let c = (toks.end - i) / (parts - k);
        let (xq, xds) = (acts.qs[i * cols..].as_ptr(), acts.ds[i * 2 * nb..].as_ptr());
        for r in rows.clone().step_by(ROWS) {
            let at = i * w.rows() + r;
            f(Tile {
                c,
                group: bytes[r / ROWS * gb..][..gb].as_ptr(),
                n: ROWS.min(rows.end - r),
                xq,
                xds,
                out: out.0.wrapping_add(at),
                res: residual.map_or(std::ptr::null_mut(), |p| p.0.wrapping_add(at)),
                stride: w.rows(),
            });
        }
        i += c;
    }
}

/// Whether `w` is Q8_0 (else Q4_1).
pub(crate) fn is_q8(w: &LaneMatrix) -> bool {
    match w.dtype() {
        GgmlType::Q8_0 => true,
        GgmlType::Q4_1 => false,
        other => unreachable!("{other} is not a quantized type"),
    }
}

/// Outputs of lane-ordered weight `w` for `rows` × `toks` (`rows` starting at a group of 16),
/// stored at `out` (as `super::quant_block`) and added to `residual` (laid out alike) if any, in
/// tiles of 16 rows × up to 8 tokens; both [`ByteDot`] kinds give the same bits.
///
/// The caller must have checked that the CPU supports AVX-512 F/BW/VL, FMA and F16C, and VNNI
/// for [`ByteDot::Vnni`].
pub(crate) fn block(
    kind: ByteDot,
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
                    $((ByteDot::Vnni, true, $c) => unsafe {
                        tile_vnni::<true, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (ByteDot::Vnni, false, $c) => unsafe {
                        tile_vnni::<false, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (ByteDot::MaddUbs, true, $c) => unsafe {
                        tile_maddubs::<true, $c>(w, g, n, xq, xds, o, r, s)
                    },
                    (ByteDot::MaddUbs, false, $c) => unsafe {
                        tile_maddubs::<false, $c>(w, g, n, xq, xds, o, r, s)
                    },)*
                    _ => unreachable!("tile of {} tokens", t.c),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
    });
}
