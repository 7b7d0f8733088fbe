//! Element-wise CPU operations of the forward pass (cheap next to the matmuls).

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

/// The rotary position embedding of one batch's positions: rotating adjacent pairs `(2i, 2i+1)`
/// of the first `rope_dims` dimensions of each head by `pos * base^(-2i / rope_dims)` (llama.cpp's
/// "normal" RoPE, which Llama GGUFs expect since their Q and K are pre-permuted). The rotations
/// are the same for Q and K and for every layer of a forward pass, so computed once (a `sin_cos`
/// per row and pair).
#[derive(Debug, Default)]
pub struct RopeTable {
    positions: Vec<u32>,
    rope_dims: usize,
    base: f32,
    /// `(cos, sin)` per row and pair.
    cos_sin: Vec<(f32, f32)>,
}

impl RopeTable {
    pub fn new(positions: &[u32], rope_dims: usize, base: f32) -> Self {
        let half = rope_dims / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| base.powf(-2.0 * i as f32 / rope_dims as f32))
            .collect();
        let cos_sin = positions
            .iter()
            .flat_map(|&pos| {
                inv_freq.iter().map(move |&f| {
                    let (s, c) = (pos as f32 * f).sin_cos();
                    (c, s)
                })
            })
            .collect();
        RopeTable {
            positions: positions.to_vec(),
            rope_dims,
            base,
            cos_sin,
        }
    }

    /// Whether this is the table of these positions and parameters.
    pub fn is_for(&self, positions: &[u32], rope_dims: usize, base: f32) -> bool {
        self.positions == positions && self.rope_dims == rope_dims && self.base == base
    }

    /// Rotates the rows of `x` (one per position).
    pub fn apply(&self, x: &mut [f32], n_heads: usize, head_dim: usize) {
        let half = self.rope_dims / 2;
        if half == 0 {
            return;
        }
        let width = n_heads * head_dim;
        for (row, cos_sin) in x
            .chunks_exact_mut(width)
            .zip(self.cos_sin.chunks_exact(half))
        {
            for head in row.chunks_exact_mut(head_dim) {
                for (pair, &(c, s)) in head[..self.rope_dims].chunks_exact_mut(2).zip(cos_sin) {
                    let (a, b) = (pair[0], pair[1]);
                    pair[0] = a * c - b * s;
                    pair[1] = a * s + b * c;
                }
            }
        }
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
        RopeTable::new(&[2], 4, 100.0).apply(&mut x, 1, 4);
        let (s0, c0) = 2.0f32.sin_cos();
        let (s1, c1) = (2.0f32 * 0.1).sin_cos();
        let want = [c0, s0, -s1, c1];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{x:?} vs {want:?}");
        }
        let mut y = vec![0.3, -0.7, 1.1, 0.2];
        RopeTable::new(&[0], 4, 100.0).apply(&mut y, 1, 4);
        assert_eq!(y, vec![0.3, -0.7, 1.1, 0.2], "position 0 is the identity");
    }
}
