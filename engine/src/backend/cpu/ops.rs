//! Element-wise CPU operations of the forward pass (cheap next to the matmuls).

/// `out[r] = x[r] / rms(x[r]) * weight` for each of `rows` rows of width `weight.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, rows: usize, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x[..rows * d]
        .chunks_exact(d)
        .zip(out[..rows * d].chunks_exact_mut(d))
    {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// Rotary position embedding over rows of `n_heads` heads of `head_dim`, rotating adjacent
/// pairs `(2i, 2i+1)` of the first `rope_dims` dimensions by `pos * base^(-2i / rope_dims)`
/// (llama.cpp's "normal" RoPE, which Llama GGUFs expect since their Q and K are pre-permuted).
pub fn rope(
    x: &mut [f32],
    positions: &[u32],
    n_heads: usize,
    head_dim: usize,
    rope_dims: usize,
    base: f32,
) {
    let half = rope_dims / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| base.powf(-2.0 * i as f32 / rope_dims as f32))
        .collect();
    let mut cos_sin = vec![(0.0f32, 0.0f32); half];
    let width = n_heads * head_dim;
    for (row, &pos) in x.chunks_exact_mut(width).zip(positions) {
        for (cs, &f) in cos_sin.iter_mut().zip(&inv_freq) {
            let (s, c) = (pos as f32 * f).sin_cos();
            *cs = (c, s);
        }
        for head in row.chunks_exact_mut(head_dim) {
            for (pair, &(c, s)) in head[..rope_dims].chunks_exact_mut(2).zip(&cos_sin) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
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

    #[test]
    fn rope_rotates_adjacent_pairs_and_keeps_norms() {
        // head_dim 4: pairs (0,1) at frequency 1, (2,3) at base^(-1/2).
        let mut x = vec![1.0, 0.0, 0.0, 1.0];
        rope(&mut x, &[2], 1, 4, 4, 100.0);
        let (s0, c0) = 2.0f32.sin_cos();
        let (s1, c1) = (2.0f32 * 0.1).sin_cos();
        let want = [c0, s0, -s1, c1];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{x:?} vs {want:?}");
        }
        let mut y = vec![0.3, -0.7, 1.1, 0.2];
        rope(&mut y, &[0], 1, 4, 4, 100.0);
        assert_eq!(y, vec![0.3, -0.7, 1.1, 0.2], "position 0 is the identity");
    }

    #[test]
    fn silu_mul_values() {
        let mut g = [0.0, 1.0, -2.0];
        silu_mul(&mut g, &[5.0, 2.0, 1.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
        assert!((g[2] - (-2.0 / (1.0 + 2.0f32.exp()))).abs() < 1e-6);
    }
}
