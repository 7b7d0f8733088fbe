//! Portable kernels: the reference the SIMD paths are tested against, and the fallback on CPUs
//! without AVX2.

use half::{bf16, f16};

use crate::dtype::GgmlType;

pub(super) const QK: usize = 32;
pub(super) const Q4_1_BYTES: usize = 20;
pub(super) const Q8_0_BYTES: usize = 34;

#[inline(always)]
pub(super) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantizes `dst.len()` elements of `dtype` from `src`.
pub(super) fn dequantize_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let need = n / dtype.block_size() * dtype.type_size();
    assert!(
        n.is_multiple_of(dtype.block_size()),
        "dequantize_row: {n} is not a whole number of {dtype} blocks"
    );
    assert!(
        src.len() >= need,
        "dequantize_row: {} bytes for {n} {dtype} elements",
        src.len()
    );
    match dtype {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        GgmlType::Q4_1 => {
            for (db, blk) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q4_1_BYTES)) {
                let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                for j in 0..16 {
                    let q = blk[4 + j];
                    db[j] = d * (q & 0x0F) as f32 + m;
                    db[j + 16] = d * (q >> 4) as f32 + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (db, blk) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(Q8_0_BYTES)) {
                let d = f16_at(blk, 0);
                for (o, &q) in db.iter_mut().zip(&blk[2..]) {
                    *o = d * (q as i8) as f32;
                }
            }
        }
    }
}

/// Dot product of one stored quantized row with one quantized activation row, in the lane
/// kernels' arithmetic (`avx512_lanes`, `avx2_lanes`), so that every level gives the same bits:
/// per block the exact integer dot product (Q8_0's over the unsigned bytes `q + 128` those
/// kernels read), converted, scaled by `d_w * d_x` and added with an FMA, and the offset terms
/// (Q4_1's `m * s`, Q8_0's `-128 * d * s`) in a sum of their own, added last.
fn dot_row(dtype: GgmlType, w: &[u8], xq: &[i8], xds: &[f32]) -> f32 {
    let (mut acc, mut macc) = (0f32, 0f32);
    match dtype {
        GgmlType::Q4_1 => {
            for (b, blk) in w.chunks_exact(Q4_1_BYTES).enumerate() {
                let x = &xq[b * QK..(b + 1) * QK];
                let mut dot = 0i32;
                for j in 0..16 {
                    let q = blk[4 + j];
                    dot += (q & 0x0F) as i32 * x[j] as i32 + (q >> 4) as i32 * x[j + 16] as i32;
                }
                let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
                acc = (dot as f32).mul_add(d * xds[2 * b], acc);
                macc = m.mul_add(xds[2 * b + 1], macc);
            }
        }
        GgmlType::Q8_0 => {
            for (b, blk) in w.chunks_exact(Q8_0_BYTES).enumerate() {
                let x = &xq[b * QK..(b + 1) * QK];
                let dot: i32 = blk[2..]
                    .iter()
                    .zip(x)
                    .map(|(&q, &v)| ((q ^ 0x80) as i32) * v as i32)
                    .sum();
                let d = f16_at(blk, 0);
                acc = (dot as f32).mul_add(d * xds[2 * b], acc);
                macc = (d * -128.0).mul_add(xds[2 * b + 1], macc);
            }
        }
        other => unreachable!("{other} is not a quantized type"),
    }
    acc + macc
}

/// `out[ci * nr + ri]` = weight row `ri` · activation row `ci` of tile `t`.
pub(super) fn tile(t: super::QuantTile<'_>, out: &mut [f32]) {
    let (cols, nr, rb) = (t.cols, t.nr, t.row_bytes);
    let nb = cols / QK;
    for ci in 0..t.c {
        let xq = &t.xq[ci * cols..(ci + 1) * cols];
        let xds = &t.xds[ci * 2 * nb..(ci + 1) * 2 * nb];
        for ri in 0..nr {
            out[ci * nr + ri] = dot_row(t.dtype, &t.w[ri * rb..(ri + 1) * rb], xq, xds);
        }
    }
}

/// Dot product of a stored float row (F32/F16/BF16) with f32 values.
pub(super) fn dot_float_row(dtype: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    match dtype {
        GgmlType::F32 => w
            .chunks_exact(4)
            .zip(x)
            .map(|(s, &v)| f32::from_le_bytes([s[0], s[1], s[2], s[3]]) * v)
            .sum(),
        GgmlType::F16 => w
            .chunks_exact(2)
            .zip(x)
            .map(|(s, &v)| f16::from_le_bytes([s[0], s[1]]).to_f32() * v)
            .sum(),
        GgmlType::BF16 => w
            .chunks_exact(2)
            .zip(x)
            .map(|(s, &v)| bf16::from_le_bytes([s[0], s[1]]).to_f32() * v)
            .sum(),
        other => unreachable!("{other} is not a float type"),
    }
}

pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums: vectorizable and more accurate than one running sum.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}
