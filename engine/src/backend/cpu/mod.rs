//! The CPU backend: quantized kernels with runtime SIMD dispatch, run on a persistent thread pool.

mod attention;
pub mod kernels;
mod ops;
pub mod pool;

use self::kernels::QMatrix;
use self::pool::ThreadPool;
use super::{AttnShape, Backend, WeightSource};
use crate::error::{Error, Result};
use crate::kv::{KvSpec, SeqRows, BLOCK_SIZE};

/// Runs the forward pass on this machine's cores.
#[derive(Debug)]
pub struct CpuBackend {
    pool: ThreadPool,
}

impl CpuBackend {
    /// A backend running on `n_threads` threads (the caller's included).
    pub fn new(n_threads: usize) -> Self {
        Self {
            pool: ThreadPool::new(n_threads.max(1)),
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
        }
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
}

/// A weight on the CPU: matrices stay in the mapped GGUF, vectors are expanded to f32.
#[derive(Debug)]
pub enum CpuWeight {
    Matrix {
        src: WeightSource,
        rows: usize,
        cols: usize,
    },
    Vector(Vec<f32>),
}

impl CpuWeight {
    fn matrix(&self) -> QMatrix<'_> {
        match self {
            Self::Matrix { src, rows, cols } => QMatrix {
                dtype: src.dtype(),
                rows: *rows,
                cols: *cols,
                data: src.bytes(),
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

/// Keys and values of every layer of one model part, `[layer][slot][kv_dim]`.
#[derive(Debug)]
pub struct CpuKv {
    spec: KvSpec,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
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
        QMatrix::new(src.dtype(), rows, cols, src.bytes())?;
        Ok(CpuWeight::Matrix {
            src: src.clone(),
            rows,
            cols,
        })
    }

    fn alloc(&self, len: usize) -> Vec<f32> {
        vec![0.0; len]
    }

    fn alloc_kv(&self, spec: KvSpec) -> Result<CpuKv> {
        let per_layer = spec.n_blocks * BLOCK_SIZE * spec.kv_dim;
        // vec![0.0; n] maps zeroed pages lazily: untouched blocks cost no resident memory.
        let k = (0..spec.n_layers).map(|_| vec![0.0; per_layer]).collect();
        let v = (0..spec.n_layers).map(|_| vec![0.0; per_layer]).collect();
        Ok(CpuKv { spec, k, v })
    }

    fn upload(&self, data: &[f32], dst: &mut Vec<f32>) {
        dst[..data.len()].copy_from_slice(data);
    }

    fn download(&self, src: &Vec<f32>, len: usize) -> Vec<f32> {
        src[..len].to_vec()
    }

    fn download_owned(&self, mut src: Vec<f32>, len: usize) -> Vec<f32> {
        src.truncate(len);
        src
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
        ops::rms_norm(x, weight.vector(), eps, rows, out);
    }

    fn matmul(&self, ws: &[&CpuWeight], x: &Vec<f32>, rows: usize, outs: &mut [&mut Vec<f32>]) {
        let mats: Vec<QMatrix<'_>> = ws.iter().map(|w| w.matrix()).collect();
        let mut ys: Vec<&mut [f32]> = outs
            .iter_mut()
            .zip(&mats)
            .map(|(o, m)| &mut o[..rows * m.rows])
            .collect();
        kernels::matmul_multi(&self.pool, &mats, &x[..rows * mats[0].cols], rows, &mut ys);
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
        ops::rope(x, positions, n_heads, head_dim, rope_dims, base);
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
        let kv_dim = kv.spec.kv_dim;
        let (kc, vc) = (&mut kv.k[layer], &mut kv.v[layer]);
        for s in seqs {
            for r in 0..s.len {
                let slot = s.slot(s.pos + r);
                let row = (s.start + r) * kv_dim;
                kc[slot * kv_dim..(slot + 1) * kv_dim].copy_from_slice(&k[row..row + kv_dim]);
                vc[slot * kv_dim..(slot + 1) * kv_dim].copy_from_slice(&v[row..row + kv_dim]);
            }
        }
        attention::attend(&self.pool, shape, seqs, q, kc, vc, out);
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        // One `exp` per element: at batch 8 this is ~1 ms a step, worth both cores.
        const CHUNK: usize = 4096;
        let parts: Vec<std::sync::Mutex<(&mut [f32], &[f32])>> = gate[..len]
            .chunks_mut(CHUNK)
            .zip(up[..len].chunks(CHUNK))
            .map(std::sync::Mutex::new)
            .collect();
        self.pool.run(parts.len(), &|i| {
            let mut p = parts[i].lock().unwrap_or_else(|e| e.into_inner());
            let (g, u) = &mut *p;
            ops::silu_mul(g, u);
        });
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
