//! The lane kernels: quantized matmul with 16 weight rows side by side, one per 32-bit lane.
//!
//! The stored-layout kernels ([`super::avx512`]) give each block 8 lanes of a `vpdpbusd`, so
//! every two blocks cost an int-to-float conversion, a scale and a horizontal sum per (weight
//! row, token). Here the weights are in lane order ([`LaneMatrix`], arranged once at load): for
//! each block, line `v` holds elements `4v..4v + 4` of the block in each of 16 rows' lanes, loaded
//! as stored. Each token then needs eight byte dot products against its own four bytes broadcast
//! to all lanes, which leave the block's dot product of every row in that row's lane; a
//! conversion, a multiply by `d_w * d_x` and an FMA finish the block for 16 rows, and one more
//! FMA adds the offset term (Q4_1's `m * s`, or `-128 * d * s` for Q8_0 bytes stored unsigned)
//! to a separate sum: these terms are large and mostly cancel the others, and summing them apart
//! keeps more of the result (teacher-forced agreement with llama.cpp: 97.7% against 95.8% with
//! one sum). Each block's loads are shared by up to 8 tokens, and each token's sums end up holding
//! its 16 outputs: no horizontal sums, no partial groups, and the activations are read in their
//! plain quantized layout.
//!
//! This module cuts a matmul into tiles ([`block`]) and runs each on the [`LaneKernel`] the
//! level picks; the tiles themselves are [`super::avx512_lanes`] (zmm) and [`super::avx2_lanes`]
//! (two ymm halves). Every kernel does the same integer dot products and, from there on, the same
//! conversion, scale, FMA and separate offset sum in the same order, so all give the same bits.
//! Every output is the same sequence of operations whatever the batch size, the tile or the task
//! it falls in, so a sequence's results do not depend on what else is in the batch.

use std::ops::Range;

use super::lane_order::{LaneMatrix, LANES};
use super::quant::QActs;
use super::{avx2_lanes, avx512_lanes, OutPtr, SimdLevel};
use crate::dtype::GgmlType;

/// Weight rows per tile: one per lane.
pub(super) const ROWS: usize = LANES;
/// Most activation rows per tile (its accumulators).
pub(super) const MAX_C: usize = 8;

/// Asks for the cache line at `p` into L1.
#[inline(always)]
fn prefetch(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// How a line of weight bytes (register `R`) meets a token's four bytes broadcast: the integer
/// dot product of each row's four bytes, added to `acc` (i16 pairs or i32, as the kind keeps
/// them).
pub(super) trait Dot<R> {
    /// Q8_0 bytes go in whole (VNNI) rather than split into nibbles.
    const WHOLE_BYTES: bool;
    /// `acc += w · x` per 32-bit lane (four byte products), in this kind's accumulator.
    ///
    /// # Safety
    /// The CPU has the kind's features.
    unsafe fn dot(acc: R, w: R, x: R) -> R;
    /// The accumulator as i32 lanes, times `scale` (1 or 16).
    ///
    /// # Safety
    /// As [`Dot::dot`].
    unsafe fn widen(acc: R, scale: i16) -> R;
}

/// `vpmaddubsw` into i16 pairs, widened once per block by `vpmaddwd` (exact for nibble weights:
/// a pair is at most 2 · 15 · 127, a block's eight lines 30,480). Q4_1 nibbles go in as they are
/// and, on zmm, Q8_0's unsigned bytes split into their two nibbles (`16 * hi + lo`), so it gives
/// the exact integer dot product `vpdpbusd` does (the AVX2 tile feeds Q8_0 signed instead, see
/// [`super::avx2_lanes`]).
pub(super) struct MaddUbs;

/// Implements [`Dot`] on register `$reg` for [`MaddUbs`], with that width's `vpaddw`,
/// `vpmaddubsw`, `vpmaddwd` and 16-bit broadcast.
macro_rules! maddubs_dot {
    ($reg:ty, $add:ident, $maddubs:ident, $madd:ident, $set1:ident) => {
        impl Dot<$reg> for MaddUbs {
            const WHOLE_BYTES: bool = false;
            #[inline(always)]
            unsafe fn dot(acc: $reg, w: $reg, x: $reg) -> $reg {
                // SAFETY: the calling kernel has the width's byte instructions.
                unsafe { $add(acc, $maddubs(w, x)) }
            }
            #[inline(always)]
            unsafe fn widen(acc: $reg, scale: i16) -> $reg {
                // SAFETY: as above.
                unsafe { $madd(acc, $set1(scale)) }
            }
        }
    };
}
pub(super) use maddubs_dot;

/// Defines a [`Dot`] kind `$name` on register `$reg` doing each line with one `vpdpbusd` (`$f`),
/// summing in i32.
macro_rules! vnni_dot {
    ($(#[$doc:meta])* $name:ident, $reg:ty, $f:ident) => {
        $(#[$doc])*
        pub(super) struct $name;

        impl Dot<$reg> for $name {
            const WHOLE_BYTES: bool = true;
            #[inline(always)]
            unsafe fn dot(acc: $reg, w: $reg, x: $reg) -> $reg {
                // SAFETY: the calling kernel has the kind's features.
                unsafe { $f(acc, w, x) }
            }
            #[inline(always)]
            unsafe fn widen(acc: $reg, _scale: i16) -> $reg {
                acc
            }
        }
    };
}
pub(super) use vnni_dot;

/// One tile of [`block`]: a group of 16 weight rows (`n` of them real) times `c` tokens.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// Tokens (at most `MAX_C`).
    pub c: usize,
    /// The group's bytes (laid out as [`LaneMatrix`] describes); the next group follows it.
    pub group: *const u8,
    pub n: usize,
    /// The tokens' quantized values, `nb * 32` apart.
    pub xq: *const i8,
    /// The tokens' `(d, s)` pairs, `2 * nb` apart.
    pub xds: *const f32,
    /// The tokens' block sums of quantized values, `nb` apart.
    pub xsum: *const i32,
    /// Where output `ci * stride + r` goes.
    pub out: *mut f32,
    /// The residual's place for the tile's outputs, or null.
    pub res: *mut f32,
    pub stride: usize,
}

impl Tile {
    /// The tile's group, block by block (checks that it has 1..=16 real rows).
    #[inline(always)]
    pub(super) fn blocks(&self, w: &LaneMatrix) -> Blocks {
        assert!((1..=ROWS).contains(&self.n));
        Blocks {
            nb: w.nb(),
            sb: w.scale_bytes(),
            vb: w.value_bytes(),
            scales: self.group,
            values: self.group.wrapping_add(w.scale_section()),
            next: w.group_bytes(),
        }
    }
}

/// A tile's group of weights, as blocks of scales and values (see [`LaneMatrix`]).
pub(super) struct Blocks {
    /// Blocks per row.
    pub nb: usize,
    /// Bytes of a block's scales, and of its values.
    sb: usize,
    vb: usize,
    /// The group's scale and value sections.
    scales: *const u8,
    values: *const u8,
    /// Bytes from this group to the next (the next tile's).
    next: usize,
}

impl Blocks {
    /// Block `b`'s scales and values; first asks for the next group's block into L1, a group
    /// ahead of use (in decode the weights stream from memory).
    #[inline(always)]
    pub(super) fn block(&self, b: usize) -> (*const u8, *const u8) {
        let sp = self.scales.wrapping_add(b * self.sb);
        let vp = self.values.wrapping_add(b * self.vb);
        for l in (0..self.vb).step_by(64) {
            prefetch(vp.wrapping_add(self.next + l));
        }
        if (b * self.sb).is_multiple_of(64) {
            prefetch(sp.wrapping_add(self.next));
        }
        (sp, vp)
    }
}

/// A tile kernel: `out[c * stride + r]` for `c < C`, `r < n`, also added to `res[..]` unless
/// null.
///
/// # Safety
/// The CPU has the kernel's features; the tile's pointers are valid as [`block`] says.
pub(super) type TileFn = unsafe fn(&LaneMatrix, Tile);

/// Defines `fn $name(q8: bool, c: usize) -> TileFn`: `$module::tile::<$dot, Q8, C>`,
/// compiled for `$features`, for Q8_0 (`q8`) or Q4_1 and `c` tokens (1..=8).
macro_rules! tile_fns {
    ($name:ident = $module:ident::tile::<$dot:ty>, $features:literal) => {
        /// The kernel's tile functions.
        fn $name(q8: bool, c: usize) -> TileFn {
            /// The tile compiled for the kernel's features.
            ///
            /// # Safety
            /// As [`TileFn`], on a CPU with these features.
            #[target_feature(enable = $features)]
            unsafe fn run<const Q8: bool, const C: usize>(w: &LaneMatrix, t: Tile) {
                // SAFETY: forwarded from the caller.
                unsafe { $module::tile::<$dot, Q8, C>(w, t) }
            }
            let by_c: [TileFn; MAX_C] = if q8 {
                [
                    run::<true, 1>,
                    run::<true, 2>,
                    run::<true, 3>,
                    run::<true, 4>,
                    run::<true, 5>,
                    run::<true, 6>,
                    run::<true, 7>,
                    run::<true, 8>,
                ]
            } else {
                [
                    run::<false, 1>,
                    run::<false, 2>,
                    run::<false, 3>,
                    run::<false, 4>,
                    run::<false, 5>,
                    run::<false, 6>,
                    run::<false, 7>,
                    run::<false, 8>,
                ]
            };
            by_c[c - 1]
        }
    };
}

// The kernels, each compiled for its features.
tile_fns!(
    avx512_vnni = avx512_lanes::tile::<avx512_lanes::Vnni>,
    "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"
);
tile_fns!(
    avx512_maddubs = avx512_lanes::tile::<MaddUbs>,
    "avx512f,avx512bw,avx512vl,fma,f16c"
);
tile_fns!(avx2_maddubs = avx2_lanes::tile::<MaddUbs>, "avx2,fma,f16c");
tile_fns!(
    avx2_avxvnni = avx2_lanes::tile::<avx2_lanes::AvxVnni>,
    "avx2,fma,f16c,avxvnni"
);
tile_fns!(
    avx2_avx512vl = avx2_lanes::tile::<avx2_lanes::Avx512Vl>,
    "avx2,fma,f16c,avx512vl,avx512vnni"
);

/// Which tile kernel runs: register width and byte dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaneKernel {
    /// zmm, `vpdpbusd` (AVX-512 VNNI).
    Avx512Vnni,
    /// zmm, `vpmaddubsw` + `vpmaddwd` (AVX-512 BW).
    Avx512MaddUbs,
    /// ymm, `vpmaddubsw` + `vpmaddwd` (any AVX2 CPU).
    Avx2MaddUbs,
    /// ymm, AVX-VNNI `vpdpbusd`.
    AvxVnni,
    /// ymm, `vpdpbusd` in its AVX-512 VNNI + VL encoding (same result): lets a CPU with AVX-512
    /// test the AVX-VNNI arithmetic.
    #[cfg_attr(not(test), allow(dead_code))]
    Avx512Vl,
}

impl LaneKernel {
    /// The kernel that serves `level` (`None` for the portable level).
    pub(crate) fn for_level(level: SimdLevel) -> Option<LaneKernel> {
        match level {
            SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => {
                Some(LaneKernel::Avx512Vnni)
            }
            SimdLevel::Avx512 => Some(LaneKernel::Avx512MaddUbs),
            SimdLevel::Avx2Vnni => Some(LaneKernel::AvxVnni),
            SimdLevel::Avx2 => Some(LaneKernel::Avx2MaddUbs),
            SimdLevel::Scalar => None,
        }
    }

    /// The tile functions of this kernel.
    fn tiles(self) -> fn(bool, usize) -> TileFn {
        match self {
            LaneKernel::Avx512Vnni => avx512_vnni,
            LaneKernel::Avx512MaddUbs => avx512_maddubs,
            LaneKernel::Avx2MaddUbs => avx2_maddubs,
            LaneKernel::AvxVnni => avx2_avxvnni,
            LaneKernel::Avx512Vl => avx2_avx512vl,
        }
    }
}

/// Outputs of lane-ordered weight `w` for `rows` × `toks` (`rows` starting at a group of 16),
/// stored at `out` (as `super::quant_block`) and added to `residual` (laid out alike) if any;
/// every [`LaneKernel`] gives the same bits.
///
/// Cuts the work into [`Tile`]s of 16 rows × up to 8 tokens. A tile's pointers are valid for
/// what its fields say: `group` is a whole group of `w`, tokens `c` rows of the activations, and
/// outputs `out + ci * stride + r` (and the residual's) for `ci < c`, `r < n` lie below
/// `m * w.rows` and belong to this task only (see `OutPtr`; the caller sized the output and the
/// residual so).
///
/// The caller must have checked that the CPU has `kernel`'s features (as
/// [`LaneKernel::for_level`] of a level no higher than [`super::simd_level`]).
pub(crate) fn block(
    kernel: LaneKernel,
    w: &LaneMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
    residual: Option<OutPtr>,
) {
    let q8 = match w.dtype() {
        GgmlType::Q8_0 => true,
        GgmlType::Q4_1 => false,
        other => unreachable!("{other} is not a quantized type"),
    };
    let tiles = kernel.tiles();
    let (nb, cols, gb) = (acts.nb, acts.cols, w.group_bytes());
    assert!(rows.end <= w.rows() && rows.start.is_multiple_of(ROWS));
    assert!(toks.end <= acts.m && nb == w.nb());
    assert!(acts.qs.len() >= acts.m * cols && acts.ds.len() >= acts.m * 2 * nb);
    assert!(acts.sums.len() >= acts.m * nb);
    let bytes = w.bytes();
    // Token tiles of nearly equal size, at most `MAX_C`.
    let parts = toks.len().div_ceil(MAX_C);
    let mut i = toks.start;
    for k in 0..parts {
        let c = (toks.end - i) / (parts - k);
        let (xq, xds) = (acts.qs[i * cols..].as_ptr(), acts.ds[i * 2 * nb..].as_ptr());
        let xsum = acts.sums[i * nb..].as_ptr();
        let tile = tiles(q8, c);
        for r in rows.clone().step_by(ROWS) {
            let at = i * w.rows() + r;
            let t = Tile {
                c,
                group: bytes[r / ROWS * gb..][..gb].as_ptr(),
                n: ROWS.min(rows.end - r),
                xq,
                xds,
                xsum,
                out: out.0.wrapping_add(at),
                res: residual.map_or(std::ptr::null_mut(), |p| p.0.wrapping_add(at)),
                stride: w.rows(),
            };
            // SAFETY: the tile's pointers are valid as said above; the caller checked the CPU
            // features.
            unsafe { tile(w, t) };
        }
        i += c;
    }
}

#[cfg(test)]
mod tests {
    use super::super::scalar::{f16_at, QK};
    use super::super::tests::{random_acts, random_matrix, Rng};
    use super::super::{quant, simd_level, QMatrix};
    use super::*;

    impl LaneKernel {
        const ALL: [LaneKernel; 5] = [
            LaneKernel::Avx2MaddUbs,
            LaneKernel::AvxVnni,
            LaneKernel::Avx512Vl,
            LaneKernel::Avx512MaddUbs,
            LaneKernel::Avx512Vnni,
        ];

        /// Whether this CPU can run the kernel at the level `SLUICE_SIMD` allows.
        fn supported(self) -> bool {
            let needs = match self {
                LaneKernel::Avx2MaddUbs => SimdLevel::Avx2,
                LaneKernel::AvxVnni => SimdLevel::Avx2Vnni,
                LaneKernel::Avx512MaddUbs => SimdLevel::Avx512,
                LaneKernel::Avx512Vl | LaneKernel::Avx512Vnni => SimdLevel::Avx512Vnni,
            };
            needs.clamp() == needs
        }
    }

    /// Runs `w · acts` through `kernel`: the outputs, then the residuals.
    fn run(kernel: LaneKernel, w: &LaneMatrix, acts: &QActs) -> Vec<f32> {
        let m = acts.m;
        let mut out = vec![f32::NAN; m * w.rows()];
        let mut res: Vec<f32> = (0..m * w.rows()).map(|i| i as f32 * 0.25).collect();
        let (o, r) = (OutPtr(out.as_mut_ptr()), OutPtr(res.as_mut_ptr()));
        block(kernel, w, acts, 0..w.rows(), 0..m, o, Some(r));
        out.extend(res);
        out
    }

    /// The lane formula, one (row, token) at a time: per block, the exact integer dot product of
    /// the stored bytes (Q8_0 as `q + 128`) with the token's, then `acc += dot · (d · dx)` and,
    /// apart, `macc += m · s` (Q8_0: `m = -128 · d`), each one rounding; `acc + macc` at the end.
    fn lane_formula(w: &QMatrix, acts: &QActs, r: usize, t: usize) -> f32 {
        let (row, q8) = (w.row(r), w.dtype == GgmlType::Q8_0);
        let bb = w.dtype.type_size();
        let (mut acc, mut macc) = (0f32, 0f32);
        for b in 0..acts.nb {
            let blk = &row[b * bb..][..bb];
            let x = &acts.qs[t * acts.cols + b * QK..][..QK];
            let dot: i32 = (0..QK)
                .map(|k| {
                    let u = if q8 {
                        blk[2 + k] as i8 as i32 + 128
                    } else {
                        (blk[4 + k % 16] >> (4 * (k / 16)) & 15) as i32
                    };
                    u * x[k] as i32
                })
                .sum();
            let d = f16_at(blk, 0);
            let m = if q8 { d * -128.0 } else { f16_at(blk, 2) };
            let (dx, sx) = (
                acts.ds[2 * (t * acts.nb + b)],
                acts.ds[2 * (t * acts.nb + b) + 1],
            );
            acc = (dot as f32).mul_add(d * dx, acc);
            macc = m.mul_add(sx, macc);
        }
        acc + macc
    }

    /// Every kernel this CPU has computes exactly the lane formula, bit for bit, in its outputs
    /// and in the residuals it adds them to (so all kernels agree); Q8_0 blocks of extreme bytes
    /// (-128 and 127, alternating or alone) against activations of ±127 included, where the byte
    /// products come nearest to overflowing `vpmaddubsw`.
    #[test]
    fn kernels_compute_the_lane_formula_exactly() {
        if simd_level() == SimdLevel::Scalar {
            return;
        }
        let mut rng = Rng(5);
        let shapes = [
            (19, 32 * 5, 11),
            (32, 32 * 18, 8),
            (5, 32, 1),
            (37, 32 * 7, 9),
        ];
        for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
            for (rows, cols, m) in shapes {
                let mut data = random_matrix(&mut rng, dtype, rows, cols);
                if dtype == GgmlType::Q8_0 {
                    // Row 0's first block -128 and 127 alternating, row 1's all -128, row 2's
                    // all 127.
                    let bb = dtype.type_size() * cols / QK;
                    for (k, b) in data[2..34].iter_mut().enumerate() {
                        *b = if k % 2 == 0 { 0x80 } else { 0x7F };
                    }
                    data[bb + 2..bb + 34].fill(0x80);
                    data[2 * bb + 2..2 * bb + 34].fill(0x7F);
                }
                let w = QMatrix::new(dtype, rows, cols, &data).expect("valid");
                let lanes = LaneMatrix::new(&w).expect("mapped").expect("quantized");
                let mut x = random_acts(&mut rng, m * cols);
                let extremes = x.len().min(64);
                x[..extremes].iter_mut().for_each(|v| *v = v.signum());
                let mut acts = QActs::default();
                acts.reset(m, cols);
                let (qs, ds, sums) = (&mut acts.qs, &mut acts.ds, &mut acts.sums);
                quant::quantize_rows(SimdLevel::Avx2, &x, qs, ds, sums, cols);
                for kernel in LaneKernel::ALL.into_iter().filter(|k| k.supported()) {
                    let got = run(kernel, &lanes, &acts);
                    let (out, res) = got.split_at(m * rows);
                    for (t, r) in (0..m).flat_map(|t| (0..rows).map(move |r| (t, r))) {
                        let at = t * rows + r;
                        let want = lane_formula(&w, &acts, r, t);
                        let what =
                            format!("{dtype} {rows}x{cols} m={m} {kernel:?} row {r} token {t}");
                        assert!(want.is_finite(), "{what}");
                        assert_eq!(out[at].to_bits(), want.to_bits(), "{what} output");
                        let added = at as f32 * 0.25 + want;
                        assert_eq!(res[at].to_bits(), added.to_bits(), "{what} residual");
                    }
                }
            }
        }
    }
}
