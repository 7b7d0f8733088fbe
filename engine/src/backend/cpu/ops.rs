//! RoPE on the CPU: a batch's rotations, computed once and applied to Q and K of every layer.

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
