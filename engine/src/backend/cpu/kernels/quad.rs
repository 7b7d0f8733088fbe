//! The "quad" layout for small batches (decode) on AVX-512 VNNI, read straight from the stored
//! weights.
//!
//! The stored kernels ([`super::avx512`]) give each block 8 lanes of a `vpdpbusd`, so every two
//! blocks cost an int-to-float conversion and a scale per (weight row, token). Here one register
//! holds 16 bytes of each of four blocks (a *group*; block `j` owns lanes `4j..4j + 4`), so two
//! `vpdpbusd` cover the group's 128 products and one conversion, one multiply (`d_w * d_x` per
//! lane) and one FMA finish four blocks. The weight side costs a handful of shuffles per group
//! and row, shared by all tokens of the tile (up to 8):
//!
//! - Q4_1 (20-byte blocks): one `vpermt2d` of two overlapping 64-byte loads gathers the four
//!   16-byte nibble arrays; low nibbles are elements 0..16 of each block, high nibbles 16..32.
//! - Q8_0 (34-byte blocks): four 32-byte loads, two 128-bit inserts and two `vshufi64x2` give
//!   elements 0..16 and 16..32 of the four blocks; the bytes are flipped to unsigned (`w + 128`).
//!
//! A `vpermw` of the f16 scales spreads each block's `d` over its four lanes and collects the
//! offsets (Q4_1's `m`, Q8_0's `d`) of up to 16 blocks (a *super-group*) into the upper half of
//! one register, so the offset terms (`m * s`, or `-128 * d * s` for the unsigned Q8_0 bytes)
//! cost one FMA per 16 blocks.
//!
//! Activation rows are repacked once per call to match (see [`pack_acts`]). Lanes of blocks past
//! the end of a row are zero on both sides.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512::hsum8;
use super::packed::Line;
use super::quant::QActs;
use super::scalar::{Q4_1_BYTES, Q8_0_BYTES, QK};
use super::{OutPtr, QMatrix};
use crate::dtype::GgmlType;

/// Blocks per group.
const GB: usize = 4;
/// Blocks per super-group.
const SUPER: usize = 16;
/// Most activation rows per tile.
pub(crate) const MAX_C: usize = 8;

/// Lines per packed activation row of `nb` blocks.
///
/// Per super-group: for each group the lines `lo` (bytes 0..16 of its four blocks), `hi` (bytes
/// 16..32) and `d` (16 f32, each block's scale on its four lanes); then one line `s` (16 f32,
/// `d * sum(q)` per block).
pub(crate) fn row_lines(nb: usize) -> usize {
    3 * nb.div_ceil(GB) + nb.div_ceil(SUPER)
}

fn f32_line(v: &[f32; 16]) -> Line {
    let mut l = [0u8; 64];
    for (c, x) in l.chunks_exact_mut(4).zip(v) {
        c.copy_from_slice(&x.to_le_bytes());
    }
    Line(l)
}

/// Packs quantized activation rows (`qs`: rows of `cols` values, `ds`: rows of `(d, s)` pairs)
/// into `out` ([`row_lines`] lines per row).
pub(crate) fn pack_acts(qs: &[i8], ds: &[f32], cols: usize, out: &mut [Line]) {
    let nb = cols / QK;
    let rl = row_lines(nb);
    let rows = qs.len() / cols;
    assert!(ds.len() >= rows * 2 * nb && out.len() >= rows * rl);
    for (i, o) in out.chunks_exact_mut(rl).take(rows).enumerate() {
        let (q, d) = (
            &qs[i * cols..(i + 1) * cols],
            &ds[i * 2 * nb..(i + 1) * 2 * nb],
        );
        let mut k = 0;
        for s0 in (0..nb).step_by(SUPER) {
            let mut s = [0f32; 16];
            for g0 in (s0..nb.min(s0 + SUPER)).step_by(GB) {
                let (mut lo, mut hi, mut dx) = ([0u8; 64], [0u8; 64], [0f32; 16]);
                for j in 0..GB.min(nb - g0) {
                    let b = g0 + j;
                    for t in 0..16 {
                        lo[16 * j + t] = q[QK * b + t] as u8;
                        hi[16 * j + t] = q[QK * b + 16 + t] as u8;
                    }
                    dx[4 * j..4 * j + 4].fill(d[2 * b]);
                    s[b - s0] = d[2 * b + 1];
                }
                o[k] = Line(lo);
                o[k + 1] = Line(hi);
                o[k + 2] = f32_line(&dx);
                k += 3;
            }
            o[k] = f32_line(&s);
            k += 1;
        }
    }
}

/// `vpermw` indices for Q4_1 (u16 `10j` is block `j`'s `d`, `10j + 1` its `m`): `d` of block
/// `j` on halves `4j..4j + 4`, then the four `m` repeated (the mask picks one copy per group).
static Q4_1_SCALE_IDX: [u16; 32] = [
    0, 0, 0, 0, 10, 10, 10, 10, 20, 20, 20, 20, 30, 30, 30, 30, //
    1, 11, 21, 31, 1, 11, 21, 31, 1, 11, 21, 31, 1, 11, 21, 31,
];
/// The same for Q8_0, whose four `d` are loaded to halves 0, 17, 2 and 19.
static Q8_0_SCALE_IDX: [u16; 32] = [
    0, 0, 0, 0, 17, 17, 17, 17, 2, 2, 2, 2, 19, 19, 19, 19, //
    0, 17, 2, 19, 0, 17, 2, 19, 0, 17, 2, 19, 0, 17, 2, 19,
];

/// How far ahead of the current group each weight row is prefetched (see `avx512.rs`).
const PREFETCH_AHEAD: usize = 512;

/// Asks for the cache line at `p` into L1.
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint that cannot fault, whatever the address; SSE is in x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// Loads one group of `nbt` (1..=4) blocks of one weight row at `src`: the two byte registers
/// (elements 0..16 and 16..32 of each block, as unsigned bytes) and the raw f16 scales.
///
/// # Safety
/// AVX-512 F/BW/VL; `src` points at `nbt` whole blocks of the format (`Q8` selects Q8_0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn load_group<const Q8: bool>(src: *const u8, nbt: usize) -> (__m512i, __m512i, __m512i) {
    if Q8 {
        prefetch(src.wrapping_add(PREFETCH_AHEAD));
        prefetch(src.wrapping_add(PREFETCH_AHEAD + 64));
        prefetch(src.wrapping_add(PREFETCH_AHEAD + 128));
        let mut q = [_mm256_setzero_si256(); GB];
        for (j, qj) in q.iter_mut().enumerate().take(nbt) {
            // SAFETY: block `j < nbt` spans `src + 34j .. src + 34j + 34`, inside the group.
            *qj = unsafe { _mm256_loadu_si256(src.add(Q8_0_BYTES * j + 2) as *const __m256i) };
        }
        let z01 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q[0]), q[1]);
        let z23 = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q[2]), q[3]);
        // Halves 0 and 17 from `src` are blocks 0 and 1's `d`; halves 2 and 19 from `src + 64`
        // blocks 2 and 3's.
        let (k01, k23): (__mmask32, __mmask32) = match nbt {
            1 => (1, 0),
            2 => (1 | 1 << 17, 0),
            3 => (1 | 1 << 17, 1 << 2),
            _ => (1 | 1 << 17, 1 << 2 | 1 << 19),
        };
        // SAFETY: the masked loads read only the scales of blocks `j < nbt`.
        let d = unsafe {
            let d = _mm512_maskz_loadu_epi16(k01, src as *const i16);
            _mm512_mask_loadu_epi16(d, k23, src.add(64) as *const i16)
        };
        let flip = _mm512_set1_epi8(-128);
        let a = _mm512_xor_si512(_mm512_shuffle_i64x2::<0b10_00_10_00>(z01, z23), flip);
        let b = _mm512_xor_si512(_mm512_shuffle_i64x2::<0b11_01_11_01>(z01, z23), flip);
        (a, b, d)
    } else {
        prefetch(src.wrapping_add(PREFETCH_AHEAD));
        prefetch(src.wrapping_add(PREFETCH_AHEAD + 64));
        // SAFETY: a whole group is 80 bytes from `src`; a partial one is masked to its blocks.
        let (raw, raw16) = unsafe {
            if nbt == GB {
                (
                    _mm512_loadu_si512(src as *const _),
                    _mm512_loadu_si512(src.add(16) as *const _),
                )
            } else {
                let k = (1u16 << (5 * nbt)) - 1;
                (
                    _mm512_maskz_loadu_epi32(k, src as *const i32),
                    _mm512_setzero_si512(),
                )
            }
        };
        // Dwords 1..5, 6..10 and 11..15 of `raw` and 12..16 of `raw16` (16 bytes on) are the
        // four blocks' nibbles.
        let qidx = _mm512_set_epi32(31, 30, 29, 28, 14, 13, 12, 11, 9, 8, 7, 6, 4, 3, 2, 1);
        let q = _mm512_permutex2var_epi32(raw, qidx, raw16);
        let nibble = _mm512_set1_epi8(0x0F);
        let lo = _mm512_and_si512(q, nibble);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), nibble);
        (lo, hi, raw)
    }
}

/// Rows `0..n` (a multiple of `R`) of weight `w` times `C` packed activation rows, `R` rows at a
/// time: `out[c * stride + r]`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI, FMA, F16C; `w` holds `n` rows of `rb = nb * block bytes` bytes, `x`
/// holds `C` packed rows of `rl = row_lines(nb)` lines; `out + c * stride + r` is writable for
/// `c < C`, `r < n`. `R * C <= 8`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<const Q8: bool, const R: usize, const C: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    n: usize,
    x: *const Line,
    rl: usize,
    out: *mut f32,
    stride: usize,
) {
    let mut r0 = 0;
    while r0 < n {
        // SAFETY: rows `r0..r0 + R` are among the caller's `n`.
        let acc = unsafe { tile::<Q8, R, C>(w.add(r0 * rb), rb, nb, x, rl) };
        let mut v = [_mm512_setzero_ps(); 8];
        for c in 0..C {
            for r in 0..R {
                v[c * R + r] = acc[c][r];
            }
        }
        let mut sums = [0f32; 16];
        // SAFETY: 16 floats.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), hsum8(v)) };
        for c in 0..C {
            for r in 0..R {
                let k = c * R + r;
                // SAFETY: `c < C` and `r0 + r < n`, writable by the caller's promise.
                unsafe { *out.add(c * stride + r0 + r) = sums[4 * (k % 4) + k / 4] };
            }
        }
        r0 += R;
    }
}

/// Tile of `R` weight rows × `C` activation rows: the unreduced accumulators `[c][r]`.
///
/// # Safety
/// As [`rows`], for `R` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
#[inline]
unsafe fn tile<const Q8: bool, const R: usize, const C: usize>(
    w: *const u8,
    rb: usize,
    nb: usize,
    x: *const Line,
    rl: usize,
) -> [[__m512; R]; C] {
    let bb = if Q8 { Q8_0_BYTES } else { Q4_1_BYTES };
    let idx = if Q8 { &Q8_0_SCALE_IDX } else { &Q4_1_SCALE_IDX };
    // SAFETY: 64 bytes of a static array.
    let sidx = unsafe { _mm512_loadu_si512(idx.as_ptr() as *const _) };
    let zero = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); R]; C];
    let (mut b0, mut line) = (0, 0);
    while b0 < nb {
        let send = nb.min(b0 + SUPER);
        let mut scales = [zero; R];
        let mut g = 0;
        while b0 < send {
            let nbt = GB.min(nb - b0);
            let keep: __mmask32 = 0xFFFF | (0xF << (16 + 4 * g));
            let mut lo = [zero; R];
            let mut hi = [zero; R];
            let mut dw = [_mm512_setzero_ps(); R];
            for r in 0..R {
                // SAFETY: blocks `b0..b0 + nbt` of row `r` lie inside `w`.
                let (a, b, raw) = unsafe { load_group::<Q8>(w.add(r * rb + b0 * bb), nbt) };
                (lo[r], hi[r]) = (a, b);
                scales[r] = _mm512_mask_permutexvar_epi16(scales[r], keep, sidx, raw);
                dw[r] = _mm512_cvtph_ps(_mm512_castsi512_si256(scales[r]));
            }
            for (c, acc_c) in acc.iter_mut().enumerate() {
                // SAFETY: lines `line..line + 3 < rl` of packed row `c`.
                let (xl, xh, xd) = unsafe {
                    let p = x.add(c * rl + line);
                    (
                        _mm512_load_si512(p as *const _),
                        _mm512_load_si512(p.add(1) as *const _),
                        _mm512_load_ps(p.add(2) as *const f32),
                    )
                };
                for r in 0..R {
                    let dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo[r], xl), hi[r], xh);
                    let s = _mm512_mul_ps(dw[r], xd);
                    acc_c[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, acc_c[r]);
                }
            }
            b0 += nbt;
            line += 3;
            g += 1;
        }
        // Offsets of the super-group's blocks, one per lane.
        let off: [__m512; R] = std::array::from_fn(|r| {
            let v = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(scales[r]));
            if Q8 {
                _mm512_mul_ps(v, _mm512_set1_ps(-128.0))
            } else {
                v
            }
        });
        for (c, acc_c) in acc.iter_mut().enumerate() {
            // SAFETY: line `line < rl` of packed row `c`.
            let s = unsafe { _mm512_load_ps(x.add(c * rl + line) as *const f32) };
            for r in 0..R {
                acc_c[r] = _mm512_fmadd_ps(off[r], s, acc_c[r]);
            }
        }
        line += 1;
    }
    acc
}

/// Weight rows per tile for `c` activation rows (what fits in 32 registers).
fn tile_rows(c: usize) -> usize {
    match c {
        1 => 4,
        2..=4 => 2,
        _ => 1,
    }
}

/// Runs [`rows`] with `R = nr`, `C = c`.
///
/// # Safety
/// As [`rows`].
#[allow(clippy::too_many_arguments)]
unsafe fn rows_dispatch(
    q8: bool,
    nr: usize,
    c: usize,
    w: *const u8,
    rb: usize,
    nb: usize,
    n: usize,
    x: *const Line,
    rl: usize,
    out: *mut f32,
    stride: usize,
) {
    macro_rules! go {
        ($q8:literal) => {
            // SAFETY: forwarded from the caller.
            unsafe {
                match (nr, c) {
                    (4, 1) => rows::<$q8, 4, 1>(w, rb, nb, n, x, rl, out, stride),
                    (2, 2) => rows::<$q8, 2, 2>(w, rb, nb, n, x, rl, out, stride),
                    (2, 3) => rows::<$q8, 2, 3>(w, rb, nb, n, x, rl, out, stride),
                    (2, 4) => rows::<$q8, 2, 4>(w, rb, nb, n, x, rl, out, stride),
                    (1, 1) => rows::<$q8, 1, 1>(w, rb, nb, n, x, rl, out, stride),
                    (1, 2) => rows::<$q8, 1, 2>(w, rb, nb, n, x, rl, out, stride),
                    (1, 3) => rows::<$q8, 1, 3>(w, rb, nb, n, x, rl, out, stride),
                    (1, 4) => rows::<$q8, 1, 4>(w, rb, nb, n, x, rl, out, stride),
                    (1, 5) => rows::<$q8, 1, 5>(w, rb, nb, n, x, rl, out, stride),
                    (1, 6) => rows::<$q8, 1, 6>(w, rb, nb, n, x, rl, out, stride),
                    (1, 7) => rows::<$q8, 1, 7>(w, rb, nb, n, x, rl, out, stride),
                    (1, 8) => rows::<$q8, 1, 8>(w, rb, nb, n, x, rl, out, stride),
                    _ => unreachable!("unsupported quad tile {nr}x{c}"),
                }
            }
        };
    }
    if q8 {
        go!(true)
    } else {
        go!(false)
    }
}

/// [`super::quant_block`]'s counterpart for the quad layout (`acts.packed` holds it).
///
/// The caller must have checked that the CPU supports AVX-512 F/BW/VL/VNNI, FMA and F16C.
pub(crate) fn quad_block(
    w: &QMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
) {
    let (rb, nb, rl) = (w.row_bytes(), acts.nb, acts.packed_row_lines);
    assert_eq!(rl, row_lines(nb));
    assert!(acts.packed.len() >= toks.end * rl && rows.end <= w.rows);
    let q8 = match w.dtype {
        GgmlType::Q8_0 => true,
        GgmlType::Q4_1 => false,
        other => unreachable!("{other} is not a quantized type"),
    };
    // Token tiles of nearly equal size, at most `MAX_C`.
    let parts = toks.len().div_ceil(MAX_C);
    let mut i = toks.start;
    for k in 0..parts {
        let c = (toks.end - i) / (parts - k);
        let x = acts.packed[i * rl..(i + c) * rl].as_ptr();
        let nr = tile_rows(c);
        let main = rows.len() / nr * nr;
        for (r, n, nr) in [
            (rows.start, main, nr),
            (rows.start + main, rows.len() - main, 1),
        ] {
            if n == 0 {
                continue;
            }
            // SAFETY: rows `r..r + n` are inside `w` and tokens `i..i + c` inside the packed
            // activations (asserted above); outputs `(i + ci) * w.rows + r + ri` lie below
            // `m * w.rows <= y.len()` (checked by the caller) and belong to this task only (see
            // `OutPtr`); the caller checked the CPU features.
            unsafe {
                rows_dispatch(
                    q8,
                    nr,
                    c,
                    w.data[r * rb..].as_ptr(),
                    rb,
                    nb,
                    n,
                    x,
                    rl,
                    out.0.add(i * w.rows + r),
                    w.rows,
                )
            };
        }
        i += c;
    }
}
