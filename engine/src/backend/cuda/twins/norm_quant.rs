//! Twins of `norm_quant.cu`.

use super::{warp_sum, WARP};

const THREADS: usize = 256;
const QK: usize = 32;

/// Q8_1 activations of rows of `cols`: values per row, `(d, s)` per block.
#[derive(Clone, Debug, PartialEq)]
pub struct Q8_1 {
    pub qs: Vec<i8>,
    pub ds: Vec<f32>,
}

/// `quantize_lane` over one block of 32 values.
pub fn quantize_block(y: &[f32], qs: &mut [i8], ds: &mut [f32]) {
    let amax = y.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(y) {
        let r = ((v * id).round_ties_even() as i32).clamp(-127, 127);
        *q = r as i8;
        sum += r;
    }
    ds[0] = d;
    ds[1] = d * sum as f32;
}

/// Quantizes whole rows (the kernels' Q8_1 layout).
pub fn quantize_rows(y: &[f32], cols: usize) -> Q8_1 {
    let mut out = Q8_1 {
        qs: vec![0; y.len()],
        ds: vec![0.0; y.len() / QK * 2],
    };
    for (b, (yb, qb)) in y
        .chunks_exact(QK)
        .zip(out.qs.chunks_exact_mut(QK))
        .enumerate()
    {
        quantize_block(yb, qb, &mut out.ds[2 * b..2 * b + 2]);
    }
    debug_assert!(y.len().is_multiple_of(cols));
    out
}

/// `add_rms_norm_quant`: returns the normed rows (`xn`) and their quantization; `x` gets the
/// residual added when one is given.
pub fn add_rms_norm_quant(
    x: &mut [f32],
    residual: Option<&[f32]>,
    w: &[f32],
    eps: f32,
    cols: usize,
) -> (Vec<f32>, Q8_1) {
    let mut xn = vec![0f32; x.len()];
    for (row, xr) in x.chunks_exact_mut(cols).enumerate() {
        if let Some(r) = residual {
            for (v, &add) in xr.iter_mut().zip(&r[row * cols..(row + 1) * cols]) {
                *v += add;
            }
        }
        // Thread t: columns t, t + 256, ...; warps by butterfly; warp 0's thread 0 in order.
        let mut per_thread = [0f32; THREADS];
        for (t, acc) in per_thread.iter_mut().enumerate() {
            for c in (t..cols).step_by(THREADS) {
                *acc = xr[c].mul_add(xr[c], *acc);
            }
        }
        let mut total = 0f32;
        for warp in per_thread.chunks_exact(WARP) {
            total += warp_sum(warp.try_into().expect("a warp"));
        }
        let scale = 1.0 / (total / cols as f32 + eps).sqrt();
        for ((o, &v), &wv) in xn[row * cols..(row + 1) * cols]
            .iter_mut()
            .zip(xr.iter())
            .zip(w)
        {
            *o = v * scale * wv;
        }
    }
    let q = quantize_rows(&xn, cols);
    (xn, q)
}

/// `swiglu_quant`: `silu(gate) * up`, quantized.
pub fn swiglu_quant(gate: &[f32], up: &[f32], cols: usize) -> (Vec<f32>, Q8_1) {
    let h: Vec<f32> = gate
        .iter()
        .zip(up)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    let q = quantize_rows(&h, cols);
    (h, q)
}
