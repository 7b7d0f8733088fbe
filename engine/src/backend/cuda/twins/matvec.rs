//! Twins of `matvec.cu`: one warp per weight row, four lanes per block, 8 blocks in flight.

use super::norm_quant::Q8_1;
use super::{warp_sum, WARP};

const QK: usize = 32;
const Q4_1_BYTES: usize = 20;
const Q8_0_BYTES: usize = 34;

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// The integer dot of one weight block with one activation block, as the four lanes' dp4a
/// partials summed (exact, so the order does not matter).
fn block_dot_q4_1(blk: &[u8], x: &[i8]) -> i32 {
    (0..16)
        .map(|j| {
            let q = blk[4 + j];
            i32::from(q & 0x0F) * i32::from(x[j]) + i32::from(q >> 4) * i32::from(x[j + 16])
        })
        .sum()
}

fn block_dot_q8_0(blk: &[u8], x: &[i8]) -> i32 {
    blk[2..2 + QK]
        .iter()
        .zip(x)
        .map(|(&w, &v)| i32::from(w as i8) * i32::from(v))
        .sum()
}

/// `matvec_q4_1` / `matvec_q8_0` for `nbatch` activation rows: `out[b * rows + r]`, plus
/// `add` (a residual) when given.
pub fn matvec(
    q8_0: bool,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &Q8_1,
    nbatch: usize,
    add: Option<&[f32]>,
) -> Vec<f32> {
    let nb = cols / QK;
    let bytes = if q8_0 { Q8_0_BYTES } else { Q4_1_BYTES };
    let mut out = vec![0f32; nbatch * rows];
    for r in 0..rows {
        let wr = &w[r * nb * bytes..(r + 1) * nb * bytes];
        for b in 0..nbatch {
            let xq = &x.qs[b * cols..(b + 1) * cols];
            let xds = &x.ds[b * 2 * nb..(b + 1) * 2 * nb];
            // Lane 4k (k = 0..8) holds blocks k, k + 8, ...; the other lanes hold nothing.
            let mut lanes = [0f32; WARP];
            for (k, lane) in lanes.iter_mut().step_by(4).enumerate() {
                let (mut acc, mut macc) = (0f32, 0f32);
                for ib in (k..nb).step_by(8) {
                    let blk = &wr[ib * bytes..(ib + 1) * bytes];
                    let xb = &xq[ib * QK..(ib + 1) * QK];
                    let d = f16_at(blk, 0);
                    if q8_0 {
                        acc = (block_dot_q8_0(blk, xb) as f32).mul_add(d * xds[2 * ib], acc);
                    } else {
                        acc = (block_dot_q4_1(blk, xb) as f32).mul_add(d * xds[2 * ib], acc);
                        macc = f16_at(blk, 2).mul_add(xds[2 * ib + 1], macc);
                    }
                }
                *lane = acc + macc;
            }
            let v = warp_sum(lanes);
            let i = b * rows + r;
            out[i] = add.map_or(v, |a| a[i] + v);
        }
    }
    out
}

/// `argmax_rows`: the largest logit's index, the lowest among equals.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = (f32::NEG_INFINITY, 0usize);
    for (i, &v) in logits.iter().enumerate() {
        if v > best.0 {
            best = (v, i);
        }
    }
    best.1 as u32
}
