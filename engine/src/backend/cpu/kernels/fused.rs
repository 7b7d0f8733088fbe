//! What a product runs besides multiplying: a pass over its input rows first (RMS norm, SwiGLU)
//! and a residual add after, each inside the product's parallel passes.

use super::{rms_norm, silu_mul_into_up, RowNorm};

/// What a product does besides multiplying, in its own parallel passes instead of serial ones
/// around it: the results are the bits of the separate operations.
#[derive(Debug, Default)]
pub struct Fused<'a> {
    /// A pass over the input rows first; the product then reads its result.
    pub prologue: Option<Prologue<'a>>,
    /// Add the output (of the one weight) to these rows afterwards: a residual connection.
    pub residual: Option<&'a mut [f32]>,
}

/// What runs over a product's input rows first (row by row, in the parallel quantization).
#[derive(Debug)]
pub enum Prologue<'a> {
    /// An RMS norm, into its `out`.
    Norm(RowNorm<'a>),
    /// SwiGLU: the input is the gate; `up[i] = silu(gate[i]) * up[i]` (see [`super::silu_mul`]).
    SwiGlu { up: &'a mut [f32] },
}

impl Prologue<'_> {
    /// Where its rows go.
    pub(super) fn out(&self) -> &[f32] {
        match self {
            Prologue::Norm(n) => n.out,
            Prologue::SwiGlu { up } => up,
        }
    }

    /// The same pass over consecutive runs of `len` elements of its output, apart.
    pub(super) fn split(&mut self, len: usize) -> Vec<Prologue<'_>> {
        match self {
            Prologue::Norm(n) => n
                .out
                .chunks_mut(len)
                .map(|out| {
                    Prologue::Norm(RowNorm {
                        weight: n.weight,
                        eps: n.eps,
                        out,
                    })
                })
                .collect(),
            Prologue::SwiGlu { up } => up
                .chunks_mut(len)
                .map(|up| Prologue::SwiGlu { up })
                .collect(),
        }
    }

    /// Makes its first `rows` rows (of `cols`) from the input rows `x`; returns them.
    pub(super) fn apply(&mut self, x: &[f32], rows: usize, cols: usize) -> &[f32] {
        let n = rows * cols;
        match self {
            Prologue::Norm(norm) => rms_norm(x, norm.weight, norm.eps, rows, norm.out),
            Prologue::SwiGlu { up } => silu_mul_into_up(&x[..n], &mut up[..n]),
        }
        &self.out()[..n]
    }
}
