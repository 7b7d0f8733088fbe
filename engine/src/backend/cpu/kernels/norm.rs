//! RMS normalization of activation rows.

/// An RMS norm run on a product's input rows (see [`super::Prologue`]): `x / rms(x) * weight`.
#[derive(Debug)]
pub struct RowNorm<'a> {
    pub weight: &'a [f32],
    pub eps: f32,
    /// Receives the normed rows.
    pub out: &'a mut [f32],
}

/// `out[r] = x[r] / rms(x[r]) * weight` for each of `rows` rows of width `weight.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, rows: usize, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x[..rows * d]
        .chunks_exact(d)
        .zip(out[..rows * d].chunks_exact_mut(d))
    {
        let ss = sum_of_squares(xr) / d as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// `Σ x²`, in 16 interleaved partial sums (which the compiler keeps in one vector register; a
/// single running sum is a chain of dependent additions, 4 cycles per element), then summed in
/// lane order.
fn sum_of_squares(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a += v * v;
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 1.0, 0.0];
        let w = [1.0, 0.5, 2.0, 1.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &w, 1e-5, 2, &mut out);
        let rms = ((1.0 + 4.0 + 9.0 + 16.0) / 4.0f32 + 1e-5).sqrt();
        assert!((out[2] - 3.0 / rms * 2.0).abs() < 1e-6);
        let rms2 = (0.5f32 + 1e-5).sqrt();
        assert!((out[4] + 1.0 / rms2).abs() < 1e-6);
    }
}
