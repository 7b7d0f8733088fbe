//! Seeded inputs with the model's shapes and GGUF's block layouts, and the error measure, for the
//! twins' tests and the GPU check.

/// A small xorshift, so the inputs are the same on every run.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Rows in GGUF's Q4_1 (`d`, `m`, 16 bytes of nibbles: j low, j + 16 high), as the tiny test
/// model writes them.
pub fn q4_1(x: &[f32]) -> Vec<u8> {
    crate::dtype::quantize_q4_1(x)
}

/// Rows in GGUF's Q8_0 (`d`, 32 i8).
pub fn q8_0(x: &[f32]) -> Vec<u8> {
    crate::dtype::quantize_q8_0(x)
}

/// The largest |a - b| relative to the largest |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// `rope_kv_store` on one row set: rotary embedding of adjacent pairs at `positions` with the
/// host's `inv_freq` (`base^(-2i / rope_dims)`, as the CPU backend computes it).
pub fn rope(
    x: &mut [f32],
    positions: &[u32],
    n_heads: usize,
    head_dim: usize,
    rope_dims: usize,
    base: f32,
) {
    let half = rope_dims / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| base.powf(-2.0 * i as f32 / rope_dims as f32))
        .collect();
    for (row, &pos) in x.chunks_exact_mut(n_heads * head_dim).zip(positions) {
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &f) in inv.iter().enumerate() {
                let (s, c) = (pos as f32 * f).sin_cos();
                let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = x0 * c - x1 * s;
                head[2 * i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

/// A cache of `len` positions for `n_kv` heads, blocks scattered in the pool.
pub fn paged_cache(
    rng: &mut Rng,
    len: usize,
    n_kv: usize,
    d: usize,
) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let blocks = len.div_ceil(super::attention::KV_BLOCK);
    // Physical blocks in a shuffled order: logical b lives in (b * 7 + 3) % (blocks + 5).
    let table: Vec<i32> = (0..blocks)
        .map(|b| ((b * 7 + 3) % (blocks + 5)) as i32)
        .collect();
    let slots = (blocks + 5) * super::attention::KV_BLOCK;
    let k: Vec<f32> = rng
        .vec(slots * n_kv * d, 1.0)
        .into_iter()
        .map(super::f16_round)
        .collect();
    let v: Vec<f32> = rng
        .vec(slots * n_kv * d, 1.0)
        .into_iter()
        .map(super::f16_round)
        .collect();
    (k, v, table)
}
