//! The CPU backend: quantized kernels with runtime SIMD dispatch, run on a persistent thread pool.

mod attention;
pub mod kernels;
mod ops;
pub mod pool;

use std::sync::Mutex;

use self::kernels::{Arena, HugeBuf, LaneMatrix, QMatrix};
use self::pool::ThreadPool;
use super::{AttnShape, Backend, WeightSource};
use crate::error::{Error, Result};
use crate::kv::{KvSpec, SeqRows, BLOCK_SIZE};

/// Runs the forward pass on this machine's cores.
#[derive(Debug)]
pub struct CpuBackend {
    pool: ThreadPool,
    /// The last batch's rotations, reused by every layer's Q and K.
    rope: Mutex<ops::RopeTable>,
    /// Huge pages holding the lane-ordered weights.
    weights: Arena,
}

impl CpuBackend {
    /// A backend running on `n_threads` threads (the caller's included).
    pub fn new(n_threads: usize) -> Self {
        Self {
            pool: ThreadPool::new(n_threads.max(1)),
            rope: Mutex::default(),
            weights: Arena::default(),
        }
    }

    /// A pipeline rank's backend: as [`CpuBackend::new`], or, when `shared_cores` (other ranks'
    /// busy threads share these cores), one whose idle workers spin only briefly before they
    /// park.
    pub fn for_rank(n_threads: usize, shared_cores: bool) -> Self {
        if !shared_cores {
            return Self::new(n_threads);
        }
        Self {
            pool: ThreadPool::sharing_cores(n_threads.max(1)),
            rope: Mutex::default(),
            weights: Arena::default(),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// `outs[j] = x · ws[j]ᵀ` for `rows` rows, with `fused`'s operations.
    fn fused_matmul(
        &self,
        ws: &[&CpuWeight],
        x: &[f32],
        rows: usize,
        outs: &mut [&mut Vec<f32>],
        fused: kernels::Fused<'_>,
    ) {
        let mats: Vec<QMatrix<'_>> = ws.iter().map(|w| w.matrix()).collect();
        let mut ys: Vec<&mut [f32]> = outs
            .iter_mut()
            .zip(&mats)
            .map(|(o, m)| &mut o[..rows * m.rows])
            .collect();
        let x = &x[..rows * mats[0].cols];
        kernels::matmul_fused(&self.pool, &mats, x, rows, &mut ys, fused);
    }
}

/// A weight on the CPU: matrices stay in the mapped GGUF (quantized ones also in lane order
/// when the AVX-512 kernel runs), vectors are expanded to f32.
#[derive(Debug)]
pub enum CpuWeight {
    Matrix {
        src: WeightSource,
        rows: usize,
        cols: usize,
        lanes: Option<LaneMatrix>,
    },
    Vector(Vec<f32>),
}

impl CpuWeight {
    fn matrix(&self) -> QMatrix<'_> {
        match self {
            Self::Matrix {
                src,
                rows,
                cols,
                lanes,
            } => QMatrix {
                dtype: src.dtype(),
                rows: *rows,
                cols: *cols,
                data: src.bytes(),
                lanes: lanes.as_ref(),
            },
            Self::Vector(_) => panic!("a vector weight used as a matrix"),
        }
    }

    fn vector(&self) -> &[f32] {
        match self {
            Self::Vector(data) => data,
            Self::Matrix { .. } => panic!("a matrix weight used as a vector"),
        }
    }
}

/// Keys and values of every layer of one model part as f16 bits (bf16 where attention runs on
/// AMX tiles: [`kernels::KvFormat`]), in one mapping, head by head:
/// `[layer][keys, values][kv_head][block]`, each head's keys `[head_dim][position]` within a
/// block (transposed, see [`kernels::KvHead`]) and values `[position][head_dim]`. A head's blocks
/// lie one after the other, so the blocks that the pool hands a sequence in a run
/// ([`crate::kv::BlockPool`]) are one contiguous stream for attention to read: with the
/// block-major layout before it (`[block][layer][keys, values][kv_head]`, a head's blocks 360
/// KiB apart), one KV head's prefill attention took 11.1–11.8 ms at 4,096 positions and
/// 50.4–52.2 ms at 8,192, against 9.7–9.8 and 38.8–39.1 contiguous (`kernel_bench`,
/// `KB_SPREAD`, amx, model 167). The mapping is lazy, on huge pages where the kernel gives them:
/// a block first used costs a page in each head's run (2 MiB, 1,024 blocks, with huge pages).
#[derive(Debug)]
pub struct CpuKv {
    spec: KvSpec,
    buf: HugeBuf<u16>,
}

impl CpuKv {
    /// Elements of one layer's keys (or values): every block of every head.
    fn plane(&self) -> usize {
        self.spec.n_blocks * BLOCK_SIZE * self.spec.kv_dim
    }

    /// Elements of one head's run of one layer's keys (or values): every block of the head.
    fn run(&self) -> usize {
        self.spec.n_blocks * BLOCK_SIZE * self.spec.head_dim
    }

    /// Maps the first page of every head's run now, at start: the first requests would
    /// otherwise fault one in each run at once (with huge pages, 2 MiB each, 60 a rank of 10
    /// layers), which took their TTFT p95 from 0.6-0.7 s to 1.3-1.4 s at 256:128 C4 (three ranks,
    /// amx, model 167). A page of each run only: the rest of the pool stays unmapped until used.
    fn map_first_pages(&mut self) {
        let run = self.run();
        let cache = self.buf.as_mut_slice();
        for first in cache.iter_mut().step_by(run.max(1)) {
            // A write maps the page; volatile, so that storing the zero it holds stays.
            // SAFETY: `first` is a valid, aligned, exclusive reference.
            unsafe { std::ptr::write_volatile(first, 0) };
        }
    }

    /// Layer `layer`'s place in the cache.
    fn layer(&self, layer: usize) -> attention::LayerKv<'_> {
        let hd = self.spec.head_dim;
        let keys = 2 * layer * self.plane();
        attention::LayerKv {
            cache: self.buf.as_slice(),
            keys,
            values: keys + self.plane(),
            head: self.run(),
            block: BLOCK_SIZE * hd,
            format: kernels::KvFormat::of(hd, BLOCK_SIZE),
        }
    }

    /// Stores the keys and values of `seqs`' rows (`k`, `v`: `[row][kv_dim]`, in the spec's
    /// heads) for `layer`, in the format attention reads at this level (see [`kernels::KvFormat`]).
    fn store(&mut self, layer: usize, seqs: &[SeqRows<'_>], k: &[f32], v: &[f32]) {
        let (kv_dim, hd) = (self.spec.kv_dim, self.spec.head_dim);
        let at = self.layer(layer);
        let (keys, values, head, block, format) =
            (at.keys, at.values, at.head, at.block, at.format);
        let cache = self.buf.as_mut_slice();
        for s in seqs {
            for r in 0..s.len {
                let slot = s.slot(s.pos + r);
                let (b, i) = (slot / BLOCK_SIZE, slot % BLOCK_SIZE);
                let row = (s.start + r) * kv_dim;
                for h in 0..kv_dim / hd {
                    let base = b * block + h * head;
                    // A head's keys lie a plane below its values.
                    let (low, high) = cache.split_at_mut(values + base);
                    kernels::store_kv(
                        format,
                        i,
                        &k[row + h * hd..][..hd],
                        &v[row + h * hd..][..hd],
                        &mut low[keys + base..][..hd * BLOCK_SIZE],
                        &mut high[..hd * BLOCK_SIZE],
                    );
                }
            }
        }
    }
}

impl Backend for CpuBackend {
    type Weight = CpuWeight;
    type Buf = Vec<f32>;
    type Kv = CpuKv;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn weight(&self, src: &WeightSource) -> Result<CpuWeight> {
        let (rows, cols) = src.rows_cols();
        if src.info.shape.len() == 1 {
            let mut data = vec![0.0; cols];
            kernels::dequantize_row(src.dtype(), src.bytes(), &mut data);
            return Ok(CpuWeight::Vector(data));
        }
        let m = QMatrix::new(src.dtype(), rows, cols, src.bytes())?;
        // The lane kernel reads its own copy of the weights (the mapped file's pages are then
        // only read once, here).
        let lanes = if kernels::lane_kernel(kernels::simd_level()) {
            LaneMatrix::new_in(&self.weights, &m)?
        } else {
            None
        };
        Ok(CpuWeight::Matrix {
            src: src.clone(),
            rows,
            cols,
            lanes,
        })
    }

    fn alloc(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn alloc_kv(&self, spec: KvSpec) -> Result<CpuKv> {
        // Zeroed pages are mapped lazily: a block costs resident memory once used (see `CpuKv`).
        let mut kv = CpuKv {
            spec,
            buf: HugeBuf::zeroed(spec.bytes() / std::mem::size_of::<u16>())?,
        };
        kv.map_first_pages();
        Ok(kv)
    }

    fn upload(&self, data: &[f32], dst: &mut Vec<f32>) {
        dst[..data.len()].copy_from_slice(data);
    }

    fn download(&self, src: &Vec<f32>, len: usize) -> Vec<f32> {
        src[..len].to_vec()
    }

    fn host_view<'a>(&self, src: &'a Vec<f32>, len: usize) -> std::borrow::Cow<'a, [f32]> {
        std::borrow::Cow::Borrowed(&src[..len])
    }

    fn embed(&self, table: &CpuWeight, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let m = table.matrix();
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= m.rows {
                return Err(Error::InvalidRequest(format!(
                    "token id {id} is outside the vocabulary of {}",
                    m.rows
                )));
            }
            kernels::dequantize_row(
                m.dtype,
                m.row(id as usize),
                &mut out[i * m.cols..(i + 1) * m.cols],
            );
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        weight: &CpuWeight,
        eps: f32,
        rows: usize,
        out: &mut Vec<f32>,
    ) {
        kernels::rms_norm(x, weight.vector(), eps, rows, out);
    }

    fn matmul(&self, ws: &[&CpuWeight], x: &Vec<f32>, rows: usize, outs: &mut [&mut Vec<f32>]) {
        self.fused_matmul(ws, x, rows, outs, kernels::Fused::default());
    }

    fn norm_matmul(
        &self,
        x: &Vec<f32>,
        norm: &CpuWeight,
        eps: f32,
        rows: usize,
        xn: &mut Vec<f32>,
        ws: &[&CpuWeight],
        outs: &mut [&mut Vec<f32>],
    ) {
        let fused = kernels::Fused {
            prologue: Some(kernels::Prologue::Norm(kernels::RowNorm {
                weight: norm.vector(),
                eps,
                out: xn,
            })),
            residual: None,
        };
        self.fused_matmul(ws, x, rows, outs, fused);
    }

    fn matmul_add(
        &self,
        w: &CpuWeight,
        y: &Vec<f32>,
        rows: usize,
        width: usize,
        tmp: &mut Vec<f32>,
        x: &mut Vec<f32>,
    ) {
        let fused = kernels::Fused {
            prologue: None,
            residual: Some(&mut x[..rows * width]),
        };
        self.fused_matmul(&[w], y, rows, &mut [tmp], fused);
    }

    #[allow(clippy::too_many_arguments)]
    fn swiglu_matmul_add(
        &self,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        w: &CpuWeight,
        rows: usize,
        ffn: usize,
        width: usize,
        tmp: &mut Vec<f32>,
        x: &mut Vec<f32>,
    ) {
        let up = &mut up[..rows * ffn];
        let fused = kernels::Fused {
            prologue: Some(kernels::Prologue::SwiGlu { up }),
            residual: Some(&mut x[..rows * width]),
        };
        self.fused_matmul(&[w], gate, rows, &mut [tmp], fused);
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        rope_dims: usize,
        base: f32,
    ) {
        let mut table = self.rope.lock().unwrap_or_else(|e| e.into_inner());
        if !table.is_for(positions, rope_dims, base) {
            *table = ops::RopeTable::new(positions, rope_dims, base);
        }
        table.apply(x, n_heads, head_dim);
    }

    fn attention(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        shape: AttnShape,
        seqs: &[SeqRows<'_>],
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        out: &mut Vec<f32>,
    ) {
        assert_eq!(
            shape.head_dim, kv.spec.head_dim,
            "the cache's heads are of another size"
        );
        kv.store(layer, seqs, k, v);
        attention::attend(&self.pool, shape, seqs, q, kv.layer(layer), out);
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        // The forward pass runs SwiGLU inside the down projection (`swiglu_matmul_add`).
        kernels::silu_mul(&mut gate[..len], &up[..len]);
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        for (a, b) in x[..len].iter_mut().zip(&y[..len]) {
            *a += b;
        }
    }

    fn gather_rows(&self, x: &Vec<f32>, rows: &[usize], width: usize, out: &mut Vec<f32>) {
        for (i, &r) in rows.iter().enumerate() {
            out[i * width..(i + 1) * width].copy_from_slice(&x[r * width..(r + 1) * width]);
        }
    }
}
