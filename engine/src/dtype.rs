//! Element types of GGUF tensors (ggml's `ggml_type`) and their block layouts.

use crate::error::{Error, Result};

/// A ggml tensor element type that the engine can read.
///
/// Quantized types store elements in blocks: `block_size` elements in `type_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    /// 32 elements: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit values; `x = d * q + m`.
    Q4_1,
    /// 32 elements: f16 scale `d`, 32 signed bytes; `x = d * q`.
    Q8_0,
}

impl GgmlType {
    /// Maps ggml's numeric type id; unknown or unsupported ids are an error naming the id.
    pub fn from_id(id: u32) -> Result<Self> {
        Ok(match id {
            0 => Self::F32,
            1 => Self::F16,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            30 => Self::BF16,
            other => return Err(Error::UnsupportedTensorType(other)),
        })
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::BF16 => 30,
        }
    }

    /// Elements per block (1 for plain float types).
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_1 | Self::Q8_0 => 32,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }

    /// Bytes taken by `n` elements; `None` if `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Quantizes `x` (a whole number of 32-blocks) to ggml's Q4_1 layout.
pub fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 20);
    for b in x.chunks_exact(32) {
        let (min, max) = b
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let d = (max - min) / 15.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend_from_slice(&half::f16::from_f32(min).to_le_bytes());
        let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..16 {
            out.push(q(b[j]) | (q(b[j + 16]) << 4));
        }
    }
    out
}

/// Quantizes `x` (a whole number of 32-blocks) to ggml's Q8_0 layout.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / 32 * 34);
    for b in x.chunks_exact(32) {
        let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
        out.extend(b.iter().map(|&v| (v * id).round() as i8 as u8));
    }
    out
}
