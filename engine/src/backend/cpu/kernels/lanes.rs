//! Quantized matmul on AVX-512 VNNI with 16 weight rows side by side, one per lane.
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

/// One group of 16 weight rows (`group`, laid out as [`LaneMatrix`] describes, `n` of its lanes
/// stored) times `C` activation rows (quantized values `xq`, `nb * 32` apart; `(d, s)` pairs
/// `xds`, `2 * nb` apart): `out[c * stride + r]`, also added to `res[c * stride + r]` unless
/// `res` is null. Prefetches the group after it (`group_bytes` on), which is the next tile's.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, FMA, F16C; `group` holds one group of `w` (`Q8` selects Q8_0, else
/// Q4_1), the activations hold `C` rows of `nb` blocks, and `out + c * stride + r` (and
/// `res + c * stride + r` unless null) is writable for `c < C`, `r < n`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const Q8: bool, const C: usize>(
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
    let zero = _mm512_setzero_si512();
    // Per token, the scaled dot products and (apart: they are large and mostly cancel them)
    // the offset terms.
    let mut acc = [_mm512_setzero_ps(); C];
    let mut macc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        let (sp, vp) = (scales.wrapping_add(b * sb), values.wrapping_add(b * vb));
        // The next group's block, a group ahead of use: in decode the weights stream from memory.
        for l in (0..vb).step_by(64) {
            prefetch(vp.wrapping_add(next + l));
        }
        if (b * sb).is_multiple_of(64) {
            prefetch(sp.wrapping_add(next));
        }
        // The f16 scales (and Q4_1's offsets) of the 16 rows' blocks.
        let (d, m) = if Q8 {
            // SAFETY: the block's 32 scale bytes.
            let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(sp as *const _) });
            (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)))
        } else {
            // SAFETY: the block's 64 scale bytes.
            let dm = unsafe { _mm512_loadu_si512(sp as *const _) };
            (
                _mm512_cvtph_ps(_mm512_castsi512_si256(dm)),
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(dm)),
            )
        };
        // Line `v`: elements `4v..4v + 4` of each row's block, as unsigned bytes.
        let mut lines = [zero; 8];
        if Q8 {
            for (v, line) in lines.iter_mut().enumerate() {
                // SAFETY: line `v` of the block's 512 value bytes.
                *line = unsafe { _mm512_loadu_si512(vp.add(64 * v) as *const _) };
            }
        } else {
            let mask = _mm512_set1_epi8(0x0F);
            for k in 0..4 {
                // SAFETY: line `k` of the block's 256 value bytes.
                let t = unsafe { _mm512_loadu_si512(vp.add(64 * k) as *const _) };
                lines[k] = _mm512_and_si512(t, mask);
                lines[k + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(t), mask);
            }
        }
        for (c, (acc_c, macc_c)) in acc.iter_mut().zip(macc.iter_mut()).enumerate() {
            let xb = xq.wrapping_add(c * cols + b * QK) as *const i32;
            let mut dot = zero;
            for (v, &line) in lines.iter().enumerate() {
                // SAFETY: values `4v..4v + 4` of block `b` of activation row `c`.
                let x4 = unsafe { xb.add(v).read_unaligned() };
                dot = _mm512_dpbusd_epi32(dot, line, _mm512_set1_epi32(x4));
            }
            // SAFETY: the pair of block `b` of activation row `c`.
            let (dx, sx) = unsafe {
                let p = xds.add(c * 2 * nb + 2 * b);
                (*p, *p.add(1))
            };
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(dx));
            *acc_c = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc_c);
            *macc_c = _mm512_fmadd_ps(m, _mm512_set1_ps(sx), *macc_c);
        }
    }
    for (c, (&a, &ma)) in acc.iter().zip(&macc).enumerate() {
        let y = _mm512_add_ps(a, ma);
        // SAFETY: outputs `c * stride + r` for `r < n` (the mask), and the residual's alike.
        unsafe {
            _mm512_mask_storeu_ps(out.add(c * stride), rows, y);
            if !res.is_null() {
                let r = res.add(c * stride);
                let sum = _mm512_add_ps(_mm512_maskz_loadu_ps(rows, r), y);
                _mm512_mask_storeu_ps(r, rows, sum);
            }
        }
    }
}

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
/// tiles of 16 rows × up to 8 tokens.
///
/// The caller must have checked that the CPU supports AVX-512 F/BW/VL/VNNI, FMA and F16C.
pub(crate) fn block(
    w: &LaneMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
    residual: Option<OutPtr>,
) {
    let q8 = is_q8(w);
    each_tile(w, acts, rows, toks, out, residual, |t| {
        macro_rules! go {
            ($($c:literal)*) => {
                match (q8, t.c) {
                    // SAFETY: the tile's pointers are valid as `each_tile` says; the caller
                    // checked the CPU features.
                    $((true, $c) => unsafe {
                        tile::<true, $c>(w, t.group, t.n, t.xq, t.xds, t.out, t.res, t.stride)
                    },
                    (false, $c) => unsafe {
                        tile::<false, $c>(w, t.group, t.n, t.xq, t.xds, t.out, t.res, t.stride)
                    },)*
                    _ => unreachable!("tile of {} tokens", t.c),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8);
    });
}
