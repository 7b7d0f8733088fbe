//! Where the engine's arithmetic runs.
//!
//! The model is written against [`Backend`]: it owns the weights, the activation buffers and
//! the KV store, so a device backend keeps them all in device memory. [`cpu::CpuBackend`]
//! implements it with the kernels in [`cpu::kernels`]; `cuda::backend::CudaBackend` (feature
//! `cuda`) with NVRTC-compiled kernels. [`select`] builds the one `--device` names; a binary
//! built without `cuda` answers `--device cuda` with [`crate::error::Error::BackendNotCompiled`].

pub mod cpu;
pub mod cuda;
pub mod select;

use std::borrow::Cow;
use std::sync::Arc;

use crate::dtype::GgmlType;
use crate::error::Result;
use crate::kv::{KvSpec, SeqRows};
use crate::model::gguf::{GgufFile, TensorInfo};

/// A tensor in a GGUF file, to be turned into a backend weight.
#[derive(Clone, Debug)]
pub struct WeightSource {
    pub gguf: Arc<GgufFile>,
    pub info: TensorInfo,
}

impl WeightSource {
    /// Rows and row length of the tensor seen as a matrix (a vector is one row).
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.info.shape[0] as usize;
        (self.info.n_elements() as usize / cols.max(1), cols)
    }

    pub fn dtype(&self) -> GgmlType {
        self.info.dtype
    }

    pub fn bytes(&self) -> &[u8] {
        self.gguf.tensor_bytes(&self.info)
    }
}

/// The attention geometry a backend needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// The operations of a Llama forward pass.
///
/// Buffers hold `rows` rows of a known width; every operation is told how many rows are live.
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// A weight tensor resident on the device.
    type Weight: Send + Sync;
    /// An activation buffer on the device.
    type Buf: Send;
    /// The KV store on the device (all layers this model part owns).
    type Kv: Send;

    fn name(&self) -> &'static str;

    /// Bytes free for the KV pool, which `--mem-fraction` takes its share of: the host's
    /// available memory (the CPU's), or the GPU's free memory (a device backend's).
    fn memory_available(&self) -> Result<u64> {
        crate::kv::sizing::mem_available()
    }

    fn weight(&self, src: &WeightSource) -> Result<Self::Weight>;
    /// A zeroed buffer of `len` f32.
    fn alloc(&self, len: usize) -> Self::Buf;
    fn alloc_kv(&self, spec: KvSpec) -> Result<Self::Kv>;
    fn upload(&self, data: &[f32], dst: &mut Self::Buf);
    fn download(&self, src: &Self::Buf, len: usize) -> Vec<f32>;
    /// The first `len` values of a buffer as the host sees them: borrowed where the buffer is
    /// the host's (the CPU's: no copy), copied from a device.
    fn host_view<'a>(&self, src: &'a Self::Buf, len: usize) -> Cow<'a, [f32]> {
        Cow::Owned(self.download(src, len))
    }

    /// `out[i] = table[ids[i]]` (rows of width `table`'s columns).
    fn embed(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf) -> Result<()>;
    /// Row-wise RMS norm of `rows` rows of `x`, times `weight`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        weight: &Self::Weight,
        eps: f32,
        rows: usize,
        out: &mut Self::Buf,
    );
    /// `outs[j] = x · ws[j]ᵀ` for `rows` rows; weights sharing one input run together.
    fn matmul(&self, ws: &[&Self::Weight], x: &Self::Buf, rows: usize, outs: &mut [&mut Self::Buf]);
    /// `outs[j] = rms_norm(x) · ws[j]ᵀ` for `rows` rows, the normed rows left in `xn`: a norm and
    /// the products it feeds, which a backend may run as one step.
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul(
        &self,
        x: &Self::Buf,
        norm: &Self::Weight,
        eps: f32,
        rows: usize,
        xn: &mut Self::Buf,
        ws: &[&Self::Weight],
        outs: &mut [&mut Self::Buf],
    ) {
        self.rms_norm(x, norm, eps, rows, xn);
        self.matmul(ws, xn, rows, outs);
    }
    /// `x += y · wᵀ` for `rows` rows of `width` (a residual connection), the product left in
    /// `tmp`; a backend may run it as one step.
    fn matmul_add(
        &self,
        w: &Self::Weight,
        y: &Self::Buf,
        rows: usize,
        width: usize,
        tmp: &mut Self::Buf,
        x: &mut Self::Buf,
    ) {
        self.matmul(&[w], y, rows, &mut [tmp]);
        self.add_assign(x, tmp, rows * width);
    }
    /// `x += (silu(gate) * up) · wᵀ` for `rows` rows (SwiGLU over `ffn` columns, the down
    /// projection and the residual connection to `x` of `width`), which a backend may run as
    /// one step; `gate`, `up` and `tmp` are left clobbered.
    #[allow(clippy::too_many_arguments)]
    fn swiglu_matmul_add(
        &self,
        gate: &mut Self::Buf,
        up: &mut Self::Buf,
        w: &Self::Weight,
        rows: usize,
        ffn: usize,
        width: usize,
        tmp: &mut Self::Buf,
        x: &mut Self::Buf,
    ) {
        self.silu_mul(gate, up, rows * ffn);
        self.matmul_add(w, gate, rows, width, tmp, x);
    }
    /// Rotary embedding (adjacent pairs) on rows of `n_heads` heads, row `i` at `positions[i]`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        rope_dims: usize,
        base: f32,
    );
    /// Stores this batch's keys and values into `layer` of the KV store, then computes causal
    /// attention of `q` over each sequence's cached keys and values into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        shape: AttnShape,
        seqs: &[SeqRows<'_>],
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        out: &mut Self::Buf,
    );
    /// `gate = silu(gate) * up` over `len` elements.
    fn silu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize);
    /// `x += y` over `len` elements.
    fn add_assign(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// Copies rows `rows` (each `width` wide) of `x` into consecutive rows of `out`.
    fn gather_rows(&self, x: &Self::Buf, rows: &[usize], width: usize, out: &mut Self::Buf);
    /// Runs a forward pass's blocks, `body(seqs, hidden, rows)`, over `rows` rows of `hidden`
    /// (each `width` wide). A backend may replay a decode step from a captured graph (the CUDA
    /// backend's decode graphs): it may then call `body` with the batch padded (extra one-row
    /// sequences with no block table), on a buffer of its own, more than once, or with its
    /// operations recorded rather than run; so `body` must do nothing but call this backend's
    /// operations.
    #[allow(clippy::type_complexity)]
    fn run_blocks(
        &self,
        seqs: &[SeqRows<'_>],
        hidden: &mut Self::Buf,
        rows: usize,
        width: usize,
        body: &mut dyn FnMut(&[SeqRows<'_>], &mut Self::Buf, usize),
    ) {
        let _ = width;
        body(seqs, hidden, rows)
    }
}

/// The device a user asked for on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(format!("unknown device {other:?} (expected cpu or cuda)")),
        }
    }
}

impl Device {
    /// The name `--device` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        }
    }

    /// Fails with a clear error for a device this binary cannot drive.
    pub fn check_available(self) -> Result<()> {
        match self {
            Self::Cpu => Ok(()),
            #[cfg(not(feature = "cuda"))]
            Self::Cuda => Err(crate::error::Error::BackendNotCompiled("cuda")),
            // The driver, NVRTC and a GPU are probed before cudarc loads anything (its loaders
            // panic on a missing library).
            #[cfg(feature = "cuda")]
            Self::Cuda => cuda::probe::probe().map(|_| ()),
        }
    }
}
