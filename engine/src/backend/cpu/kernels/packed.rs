//! The packed "lane per block" layout for batched products (prefill) on AVX-512 VNNI.
//!
//! In the stored layout a `vpdpbusd` covers two blocks, so every two blocks cost an int-to-float
//! conversion and a scale per (weight row, token). Here a row's blocks are regrouped so one
//! 64-byte line holds four bytes of each of 16 blocks: `vpdpbusd` over a group's 8 lines leaves
//! one block's complete integer dot product in each i32 lane, and a single conversion and two
//! FMAs (`d_w * d_x` and the offset term) finish 16 blocks at once.
//!
//! A row of `nb` blocks is split greedily into groups of `G` = 16, 8, 4, 2, 1 blocks. A group has
//! `nv = max(G / 2, 1)` lines of bytes, each block owning `L = min(16 / G, 8)` lanes of 4 bytes;
//! lane `h` of block `j` in line `v` holds the block's elements `4t..4t + 4` with `t = v * L + h`.
//! After the byte lines come two lines of 16 f32: the block scale per lane, then the offset term
//! per lane (Q4_1: `m / L`; Q8_0: `-128 * d / L`, because Q8_0 weights are stored as `w + 128`,
//! unsigned, so both formats share one kernel). Activation rows use the same layout with signed
//! bytes, `d` and `s = d * sum(q)` (the lanes of one block repeat the block's `d` and `s`).
//! Weights are repacked per task (the cost is shared by all of the task's tokens), activations
//! once per call.

use std::arch::x86_64::*;
use std::ops::Range;

use super::quant::QActs;
use super::scalar::QK;
use super::{OutPtr, QMatrix};
use crate::dtype::GgmlType;

/// One 64-byte line of packed data.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Line(pub [u8; 64]);

impl Default for Line {
    fn default() -> Self {
        Line([0; 64])
    }
}

#[derive(Clone, Copy, Debug)]
struct Group {
    /// First block of the group.
    b0: usize,
    /// Blocks in the group.
    g: usize,
    /// Byte lines in the group.
    nv: usize,
    /// Lanes per block.
    l: usize,
}

/// Where each lane's bytes come from, for one source format; one entry per (group, line).
#[derive(Debug)]
struct Gathers {
    /// Byte offsets relative to the group's first block.
    idx: Vec<[i32; 16]>,
    /// Right shift per lane (4 for Q4_1's high nibbles).
    shift: Vec<[i32; 16]>,
}

/// The packed layout of a row of `nb` blocks.
#[derive(Debug)]
pub(crate) struct Plan {
    groups: Vec<Group>,
    /// Lines per packed row.
    pub row_lines: usize,
}

impl Plan {
    pub fn new(nb: usize) -> Plan {
        let mut groups = Vec::new();
        let (mut b0, mut row_lines) = (0, 0);
        for g in [16, 8, 4, 2, 1] {
            while nb - b0 >= g {
                let nv = (g / 2).max(1);
                groups.push(Group {
                    b0,
                    g,
                    nv,
                    l: (16 / g).min(8),
                });
                b0 += g;
                row_lines += nv + 2;
            }
        }
        Plan { groups, row_lines }
    }

    /// Gather offsets for blocks of `block_bytes` whose values start at `qs_off`; `nibbles`
    /// selects Q4_1's packing (element `e` in byte `e % 16`, high nibble when `e >= 16`).
    fn gathers(&self, block_bytes: usize, qs_off: usize, nibbles: bool) -> Gathers {
        let (mut idx, mut shift) = (Vec::new(), Vec::new());
        for gr in &self.groups {
            for v in 0..gr.nv {
                let (mut iv, mut sv) = ([0i32; 16], [0i32; 16]);
                for lane in 0..(gr.g * gr.l).min(16) {
                    let (j, h) = (lane / gr.l, lane % gr.l);
                    let t = v * gr.l + h;
                    let (byte, sh) = if nibbles {
                        (4 * (t % 4), 4 * (t / 4))
                    } else {
                        (4 * t, 0)
                    };
                    iv[lane] = (j * block_bytes + qs_off + byte) as i32;
                    sv[lane] = sh as i32;
                }
                idx.push(iv);
                shift.push(sv);
            }
        }
        Gathers { idx, shift }
    }
}

fn lane_mask(gr: &Group) -> u16 {
    if gr.g * gr.l >= 16 {
        0xFFFF
    } else {
        (1u16 << (gr.g * gr.l)) - 1
    }
}

/// Block index (relative to the group) of each lane, times `scale`.
fn lane_blocks(gr: &Group, scale: usize) -> [i32; 16] {
    std::array::from_fn(|lane| ((lane / gr.l).min(gr.g - 1) * scale) as i32)
}

/// Packs `nr` stored rows (`row_bytes` apart in `w`) of a Q4_1 or Q8_0 matrix into `out`
/// (`nr * plan.row_lines` lines).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn pack_weights(
    dtype: GgmlType,
    plan: &Plan,
    w: &[u8],
    row_bytes: usize,
    nr: usize,
    out: &mut [Line],
) {
    let q4 = dtype == GgmlType::Q4_1;
    let (bb, qs_off) = if q4 { (20, 4) } else { (34, 2) };
    assert!(matches!(dtype, GgmlType::Q4_1 | GgmlType::Q8_0));
    let nb = plan.groups.iter().map(|g| g.g).sum::<usize>();
    assert!(row_bytes == nb * bb && w.len() >= nr * row_bytes && out.len() >= nr * plan.row_lines);
    let gath = plan.gathers(bb, qs_off, q4);
    let nibble = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let mut o = out.as_mut_ptr();
    for r in 0..nr {
        let mut k = 0;
        for gr in &plan.groups {
            let mask = lane_mask(gr);
            // SAFETY: every gathered offset lies inside blocks `b0..b0 + g` of row `r` (at most
            // `block_bytes` past the block start), which `w` holds; `out` has room for the
            // row's `row_lines` lines, written in order through `o`.
            unsafe {
                let base = w.as_ptr().add(r * row_bytes + gr.b0 * bb);
                for _ in 0..gr.nv {
                    let idx = _mm512_loadu_si512(gath.idx[k].as_ptr() as *const _);
                    let g = _mm512_mask_i32gather_epi32::<1>(
                        _mm512_setzero_si512(),
                        mask,
                        idx,
                        base as *const _,
                    );
                    let v = if q4 {
                        let sh = _mm512_loadu_si512(gath.shift[k].as_ptr() as *const _);
                        _mm512_and_si512(_mm512_srlv_epi32(g, sh), nibble)
                    } else {
                        _mm512_xor_si512(g, flip)
                    };
                    _mm512_store_si512(o as *mut _, v);
                    o = o.add(1);
                    k += 1;
                }
                let bidx = lane_blocks(gr, bb);
                let dmi = _mm512_loadu_si512(bidx.as_ptr() as *const _);
                let dm = _mm512_mask_i32gather_epi32::<1>(
                    _mm512_setzero_si512(),
                    mask,
                    dmi,
                    base as *const _,
                );
                let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                let inv_l = _mm512_set1_ps(1.0 / gr.l as f32);
                let m = if q4 {
                    let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
                    _mm512_mul_ps(m, inv_l)
                } else {
                    _mm512_mul_ps(d, _mm512_set1_ps(-128.0 / gr.l as f32))
                };
                _mm512_store_ps(o as *mut f32, _mm512_maskz_mov_ps(mask, d));
                _mm512_store_ps(o.add(1) as *mut f32, _mm512_maskz_mov_ps(mask, m));
                o = o.add(2);
            }
        }
    }
}

/// Packs quantized activation rows (`qs`: rows of `cols` values, `ds`: rows of `(d, s)` pairs)
/// into `out` (`plan.row_lines` lines per row).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_acts(plan: &Plan, qs: &[i8], ds: &[f32], cols: usize, out: &mut [Line]) {
    let nb = cols / QK;
    let rows = qs.len() / cols;
    assert!(ds.len() >= rows * 2 * nb && out.len() >= rows * plan.row_lines);
    let gath = plan.gathers(QK, 0, false);
    let mut o = out.as_mut_ptr();
    for i in 0..rows {
        let mut k = 0;
        for gr in &plan.groups {
            let mask = lane_mask(gr);
            // SAFETY: offsets stay inside blocks `b0..b0 + g` of row `i` of `qs` and their
            // `(d, s)` pairs in `ds`; `out` has room for every row's lines, written in order.
            unsafe {
                let base = qs.as_ptr().add(i * cols + gr.b0 * QK);
                for _ in 0..gr.nv {
                    let idx = _mm512_loadu_si512(gath.idx[k].as_ptr() as *const _);
                    let v = _mm512_mask_i32gather_epi32::<1>(
                        _mm512_setzero_si512(),
                        mask,
                        idx,
                        base as *const _,
                    );
                    _mm512_store_si512(o as *mut _, v);
                    o = o.add(1);
                    k += 1;
                }
                let sbase = ds.as_ptr().add(i * 2 * nb + 2 * gr.b0);
                let bidx = lane_blocks(gr, 2);
                let di = _mm512_loadu_si512(bidx.as_ptr() as *const _);
                let d =
                    _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, di, sbase as *const _);
                let s = _mm512_mask_i32gather_ps::<4>(
                    _mm512_setzero_ps(),
                    mask,
                    di,
                    sbase.add(1) as *const _,
                );
                _mm512_store_ps(o as *mut f32, d);
                _mm512_store_ps(o.add(1) as *mut f32, s);
                o = o.add(2);
            }
        }
    }
}

/// `out[c * nr + r]` = packed weight row `r` · packed activation row `c`, for `nr` rows and `c`
/// activation rows (each `plan.row_lines` lines).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI and FMA.
pub(crate) unsafe fn tile(
    plan: &Plan,
    nr: usize,
    c: usize,
    w: &[Line],
    x: &[Line],
    out: &mut [f32],
) {
    let rl = plan.row_lines;
    assert!(w.len() >= nr * rl && x.len() >= c * rl && out.len() >= nr * c);
    let (w, x, g) = (w.as_ptr(), x.as_ptr(), &plan.groups[..]);
    // SAFETY: the buffers hold `nr` and `c` packed rows (asserted above); the features are the
    // caller's promise.
    unsafe {
        match (nr, c) {
            (2, 4) => tile_rc::<2, 4>(g, rl, w, x, out),
            (2, 2) => tile_rc::<2, 2>(g, rl, w, x, out),
            (2, 1) => tile_rc::<2, 1>(g, rl, w, x, out),
            (1, 4) => tile_rc::<1, 4>(g, rl, w, x, out),
            (1, 2) => tile_rc::<1, 2>(g, rl, w, x, out),
            (1, 1) => tile_rc::<1, 1>(g, rl, w, x, out),
            _ => unreachable!("unsupported packed tile {nr}x{c}"),
        }
    }
}

/// Weight rows per packed tile.
pub(crate) const TILE_R: usize = 2;

/// # Safety
/// AVX-512 F/BW/VL/VNNI and FMA; `w` holds `R` and `x` holds `C` packed rows of `rl` lines.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn tile_rc<const R: usize, const C: usize>(
    groups: &[Group],
    rl: usize,
    w: *const Line,
    x: *const Line,
    out: &mut [f32],
) {
    let mut acc = [[_mm512_setzero_ps(); R]; C];
    let mut off = 0;
    for gr in groups {
        let mut dot = [[_mm512_setzero_si512(); R]; C];
        for v in off..off + gr.nv {
            // SAFETY: line `v < rl` of each of the `R` weight and `C` activation rows.
            unsafe {
                let wv: [__m512i; R] =
                    std::array::from_fn(|r| _mm512_load_si512(w.add(r * rl + v) as *const _));
                for (ci, dot_c) in dot.iter_mut().enumerate() {
                    let xv = _mm512_load_si512(x.add(ci * rl + v) as *const _);
                    for r in 0..R {
                        dot_c[r] = _mm512_dpbusd_epi32(dot_c[r], wv[r], xv);
                    }
                }
            }
        }
        let s = off + gr.nv;
        // SAFETY: lines `s` and `s + 1` (scales and offset terms) of each row, `s + 1 < rl`.
        unsafe {
            let dw: [__m512; R] =
                std::array::from_fn(|r| _mm512_load_ps(w.add(r * rl + s) as *const f32));
            let mw: [__m512; R] =
                std::array::from_fn(|r| _mm512_load_ps(w.add(r * rl + s + 1) as *const f32));
            for ci in 0..C {
                let dx = _mm512_load_ps(x.add(ci * rl + s) as *const f32);
                let sx = _mm512_load_ps(x.add(ci * rl + s + 1) as *const f32);
                for r in 0..R {
                    let a = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(dot[ci][r]),
                        _mm512_mul_ps(dw[r], dx),
                        acc[ci][r],
                    );
                    acc[ci][r] = _mm512_fmadd_ps(mw[r], sx, a);
                }
            }
        }
        off = s + 2;
    }
    for (ci, acc_c) in acc.iter().enumerate() {
        for r in 0..R {
            out[ci * R + r] = _mm512_reduce_add_ps(acc_c[r]);
        }
    }
}

thread_local! {
    static PACKED_W: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`super::quant_block`]'s counterpart for the packed path: repacks the task's weight rows, then runs tiles.
pub(crate) fn packed_block(
    plan: &Plan,
    w: &QMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
) {
    let (rb, rl) = (w.row_bytes(), plan.row_lines);
    assert_eq!(acts.packed_row_lines, rl);
    let nrows = rows.len();
    PACKED_W.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.resize(nrows * rl, Line::default());
        // SAFETY: the packed path only runs at the (clamped, hence detected) AVX-512 level.
        unsafe {
            pack_weights(
                w.dtype,
                plan,
                &w.data[rows.start * rb..rows.end * rb],
                rb,
                nrows,
                &mut buf,
            )
        };
        let mut i = toks.start;
        while i < toks.end {
            let c = match toks.end - i {
                n if n >= 4 => 4,
                n if n >= 2 => 2,
                _ => 1,
            };
            let x = &acts.packed[i * rl..(i + c) * rl];
            let mut r = 0;
            while r < nrows {
                let nr = if nrows - r >= TILE_R { TILE_R } else { 1 };
                let mut res = [0f32; TILE_R * 4];
                // SAFETY: as above.
                unsafe { tile(plan, nr, c, &buf[r * rl..(r + nr) * rl], x, &mut res) };
                for ci in 0..c {
                    for ri in 0..nr {
                        let idx = (i + ci) * w.rows + rows.start + r + ri;
                        // SAFETY: `idx < m * w.rows <= y.len()` (checked by the caller), and
                        // this (token, row) pair belongs to this task only; see `OutPtr`.
                        unsafe { *out.0.add(idx) = res[ci * nr + ri] };
                    }
                }
                r += nr;
            }
            i += c;
        }
    });
}
