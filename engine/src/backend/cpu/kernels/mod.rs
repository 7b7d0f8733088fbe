//! CPU matrix kernels: quantized weights (Q4_1, Q8_0) times f32 activations, plus float weights
//! (F32, F16, BF16) and attention over the paged KV cache ([`attend_rows`]).
//!
//! # How a quantized matmul runs
//!
//! 1. The activations are quantized once per call to 8-bit blocks of 32, as llama.cpp's Q8_1:
//!    per block a scale `d = amax / 127`, 32 `i8` values, and `s = d * sum(q)` (see `quant`).
//! 2. Each weight block meets each activation block in an integer dot product (AVX-512 VNNI
//!    `vpdpbusd`, AVX2 `vpmaddubsw` + `vpmaddwd`, or portable scalar code), scaled by
//!    `d_w * d_x`; Q4_1's offset `m` contributes `m * s`.
//! 3. Work is split over the [`ThreadPool`] in tasks of (output-row chunk × token chunk). Inside a
//!    task, tiles of `R` weight rows × `C` activation rows reuse each unpacked weight block for
//!    several tokens (prefill and batched decode) and keep several accumulators in flight.
//!
//! With AVX-512 (with or without VNNI) and AVX2, a lane kernel (`lanes`) serves
//! every batch size of a matrix that carries a [`LaneMatrix`] (the CPU backend arranges one for
//! every quantized weight at load): 16 weight rows side by side, one per lane, so one
//! int-to-float conversion serves 16 rows.
//!
//! The instruction set is detected once ([`simd_level`]): the best level the CPU runs, except
//! that `avx512bf16` is chosen only where `vdpbf16ps` outruns f32 FMAs (AMD; on Intel's
//! Sapphire Rapids-class cores it issues at a quarter of their rate, and `avx512vnni`'s f32
//! attention is faster), and above it `amx` where the CPU has AMX tiles and Linux grants them
//! (attention by `tdpbf16ps` over a bf16 cache in the tiles' layout, [`KvFormat::Bf16Tiles`]).
//! `SLUICE_SIMD=scalar|avx2|avx2vnni|avx512|avx512vnni|avx512bf16|amx` forces
//! a level, or the best this CPU runs below it (`avx2` is AVX2 without AVX-VNNI, as on the
//! AVX2-only EPYCs; `avx512` is AVX-512 without VNNI), and the `*_with` functions let tests pick
//! a level explicitly (never above `SLUICE_SIMD` or the CPU, so forcing a level can never select
//! an unsupported instruction).

use std::ops::Range;
use std::sync::OnceLock;

use super::pool::ThreadPool;
use crate::dtype::GgmlType;
use crate::error::{Error, Result};

mod argmax;
mod attention;
mod f16;
mod flash;
#[cfg(target_arch = "x86_64")]
mod flash512;
#[cfg(target_arch = "x86_64")]
mod flash_amx;
#[cfg(target_arch = "x86_64")]
mod flash_bf16;
mod fused;
/// The body of a SIMD level's quantized `tile` (`avx2::tile`, `avx512::tile`): checks the
/// buffers against the shape, then runs the calling module's `q4_1_tile` or `q8_0_tile`
/// monomorphized for the tile (`nr` weight rows × `c` activation rows).
#[cfg(target_arch = "x86_64")]
macro_rules! quant_tile_body {
    ($tile:expr, $out:expr) => {{
        let super::QuantTile {
            dtype,
            nr,
            c,
            w,
            row_bytes,
            xq,
            xds,
            cols,
        } = $tile;
        let out: &mut [f32] = $out;
        let nb = cols / QK;
        assert!(cols.is_multiple_of(QK) && row_bytes == nb * dtype.type_size());
        assert!(w.len() >= nr * row_bytes && xq.len() >= c * cols && xds.len() >= c * 2 * nb);
        assert!(out.len() >= nr * c);
        let (w, xq, xds) = (w.as_ptr(), xq.as_ptr(), xds.as_ptr());
        macro_rules! go {
            ($f:ident) => {
                // SAFETY: the buffers hold `nr` weight rows and `c` activation rows (asserted
                // above), which is all the kernels read; the features are the caller's promise.
                unsafe {
                    match (nr, c) {
                        (4, 4) => $f::<4, 4>(w, row_bytes, xq, xds, cols, out),
                        (4, 2) => $f::<4, 2>(w, row_bytes, xq, xds, cols, out),
                        (4, 1) => $f::<4, 1>(w, row_bytes, xq, xds, cols, out),
                        (1, 4) => $f::<1, 4>(w, row_bytes, xq, xds, cols, out),
                        (1, 2) => $f::<1, 2>(w, row_bytes, xq, xds, cols, out),
                        (1, 1) => $f::<1, 1>(w, row_bytes, xq, xds, cols, out),
                        _ => unreachable!("unsupported tile {nr}x{c}"),
                    }
                }
            };
        }
        match dtype {
            GgmlType::Q4_1 => go!(q4_1_tile),
            GgmlType::Q8_0 => go!(q8_0_tile),
            other => unreachable!("{other} is not a quantized type"),
        }
    }};
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_lanes;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_lanes;
mod float;
mod huge;
mod lane_order;
#[cfg(target_arch = "x86_64")]
mod lanes;
mod norm;
#[cfg(target_arch = "x86_64")]
mod quant;
mod runs;
mod scalar;
mod silu;
mod simd16;
#[cfg(test)]
mod tests;
mod vexp;
#[cfg(target_arch = "x86_64")]
mod ymm2;

pub use argmax::{argmax, argmax_with};
pub use attention::{attend_rows, attend_rows_with, store_kv, KvFormat, KvHead};
pub use f16::{to_f16, to_f16_with};
pub use float::{axpy, axpy_with, dot_f32, dot_f32_with};
pub use fused::{Fused, Prologue};
pub use huge::{Arena, HugeBuf};
pub use lane_order::LaneMatrix;
pub use norm::{rms_norm, RowNorm};
use quant::QActs;
use runs::RowRuns;
pub use silu::{silu_mul, silu_mul_into_up, silu_mul_with};

/// A weight matrix in its stored (GGUF) layout: `rows` rows of `cols` elements, row-major; with
/// the same weights in lane order when the AVX-512 kernel is to read them.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    pub lanes: Option<&'a LaneMatrix>,
}

impl<'a> QMatrix<'a> {
    /// Checks that cols is a multiple of the block size and data.len() == rows * row_bytes.
    pub fn new(dtype: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self> {
        if !cols.is_multiple_of(dtype.block_size()) {
            return Err(Error::Corrupt(format!(
                "{dtype} matrix has {cols} columns, not a multiple of its block size {}",
                dtype.block_size()
            )));
        }
        let row_bytes = cols / dtype.block_size() * dtype.type_size();
        let expected = rows.checked_mul(row_bytes);
        if expected != Some(data.len()) {
            return Err(Error::Corrupt(format!(
                "{dtype} matrix of {rows} x {cols} needs {} bytes, got {}",
                expected.map_or_else(|| "too many".to_string(), |n| n.to_string()),
                data.len()
            )));
        }
        Ok(QMatrix {
            dtype,
            rows,
            cols,
            data,
            lanes: None,
        })
    }

    /// The same matrix, also in lane order (`lanes` must have been made from it).
    pub fn with_lanes(self, lanes: &'a LaneMatrix) -> Self {
        assert!(
            lanes.dtype() == self.dtype && lanes.rows() == self.rows,
            "lane-ordered copy of another matrix"
        );
        QMatrix {
            lanes: Some(lanes),
            ..self
        }
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.dtype.block_size() * self.dtype.type_size()
    }

    /// The stored bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    fn is_quantized(&self) -> bool {
        matches!(self.dtype, GgmlType::Q4_1 | GgmlType::Q8_0)
    }
}

/// The instruction set the kernels dispatch to, detected once at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    /// Portable Rust, no `std::arch`.
    Scalar,
    /// AVX2 + FMA + F16C: byte dot products by `vpmaddubsw` (the AVX2-only AMD EPYCs).
    Avx2,
    /// AVX2 with AVX-VNNI (`avxvnni`: Alder Lake and later, Sapphire Rapids, Zen 5): byte dot
    /// products by `vpdpbusd` on ymm; every other kernel is AVX2's.
    Avx2Vnni,
    /// AVX-512 F/BW/VL (plus FMA and F16C) without VNNI: byte dot products by `vpmaddubsw`.
    Avx512,
    /// AVX-512 F/BW/VL with VNNI (plus FMA and F16C): byte dot products by `vpdpbusd`.
    Avx512Vnni,
    /// AVX-512 VNNI with BF16 (`avx512_bf16`: Zen 4, Cooper Lake, Sapphire Rapids and later):
    /// attention's two small matrix products by `vdpbf16ps`; every other kernel is
    /// `avx512vnni`'s. Chosen by default only where it pays ([`bf16_attention_pays`]).
    Avx512Bf16,
    /// `avx512bf16` with AMX's tiles (`amx_tile amx_bf16`: Sapphire Rapids and later, where
    /// Linux grants the tile state): attention's two small matrix products by `tdpbf16ps`
    /// (`flash_amx`); every other kernel is `avx512vnni`'s.
    Amx,
}

impl SimdLevel {
    /// Every level, slowest first.
    pub const ALL: [SimdLevel; 7] = [
        SimdLevel::Scalar,
        SimdLevel::Avx2,
        SimdLevel::Avx2Vnni,
        SimdLevel::Avx512,
        SimdLevel::Avx512Vnni,
        SimdLevel::Avx512Bf16,
        SimdLevel::Amx,
    ];

    /// The level's name, as `SLUICE_SIMD` takes it.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx2Vnni => "avx2vnni",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Vnni => "avx512vnni",
            SimdLevel::Avx512Bf16 => "avx512bf16",
            SimdLevel::Amx => "amx",
        }
    }

    /// The levels other than [`simd_level`] that this CPU runs (under `SLUICE_SIMD`), which
    /// `SLUICE_SIMD` can force: the lower ones, and on Intel `avx512bf16`.
    pub fn alternatives() -> impl Iterator<Item = SimdLevel> {
        let (chosen, cap) = detected();
        SimdLevel::ALL
            .into_iter()
            .filter(move |&l| l != chosen && l.rank() <= cap.rank() && l.runs_here())
    }

    fn rank(self) -> u8 {
        match self {
            SimdLevel::Scalar => 1,
            SimdLevel::Avx2 => 2,
            SimdLevel::Avx2Vnni => 3,
            SimdLevel::Avx512 => 4,
            SimdLevel::Avx512Vnni => 5,
            SimdLevel::Avx512Bf16 => 6,
            SimdLevel::Amx => 7,
        }
    }

    fn from_rank(r: u8) -> SimdLevel {
        SimdLevel::ALL
            .into_iter()
            .find(|l| l.rank() == r)
            .unwrap_or(SimdLevel::Scalar)
    }

    /// The best level at or below `self` (in rank) that this CPU runs. The levels are not a
    /// chain of supersets: an AVX-512 VNNI Xeon of 2019-2021 has no AVX-VNNI, so below its own
    /// level comes `avx512`, then `avx2`.
    fn best_at_or_below(self) -> SimdLevel {
        SimdLevel::ALL
            .into_iter()
            .rev()
            .find(|l| l.rank() <= self.rank() && l.runs_here())
            .unwrap_or(SimdLevel::Scalar)
    }

    /// `self`, lowered to what this CPU supports under `SLUICE_SIMD`'s cap.
    fn clamp(self) -> SimdLevel {
        let (chosen, cap) = detected();
        // Every kernel call clamps its level, and outside tests that level is the chosen one:
        // answer it without asking the CPU's features again.
        if self == chosen {
            self
        } else {
            SimdLevel::from_rank(self.rank().min(cap.rank())).best_at_or_below()
        }
    }

    /// Whether this CPU has every instruction the level's kernels use.
    #[cfg(target_arch = "x86_64")]
    fn runs_here(self) -> bool {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
        match self {
            SimdLevel::Scalar => true,
            SimdLevel::Avx2 => avx2,
            SimdLevel::Avx2Vnni => avx2 && has!("avxvnni"),
            SimdLevel::Avx512 => avx512,
            SimdLevel::Avx512Vnni => avx512 && has!("avx512vnni"),
            SimdLevel::Avx512Bf16 => avx512 && has!("avx512vnni") && has!("avx512bf16"),
            SimdLevel::Amx => {
                SimdLevel::Avx512Bf16.runs_here() && has!("avx512dq") && flash_amx::usable()
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn runs_here(self) -> bool {
        self == SimdLevel::Scalar
    }
}

/// The chosen level and the highest one kernels may be asked for, detected once.
static LEVELS: OnceLock<(SimdLevel, SimdLevel)> = OnceLock::new();

/// The instruction set the kernels run at: the best this CPU runs (`avx512bf16` only where it
/// pays), or what `SLUICE_SIMD` forces (read once).
pub fn simd_level() -> SimdLevel {
    detected().0
}

/// ([`simd_level`], the cap): with `SLUICE_SIMD` both are the best level at or below it; without,
/// the cap is the best level this CPU runs and the chosen one may be below it.
fn detected() -> (SimdLevel, SimdLevel) {
    *LEVELS.get_or_init(|| {
        let forced = std::env::var("SLUICE_SIMD").ok().and_then(|v| {
            let level = SimdLevel::ALL.into_iter().find(|l| l.name() == v.trim());
            if level.is_none() {
                let known = "scalar, avx2, avx2vnni, avx512, avx512vnni, avx512bf16, amx";
                tracing::warn!(value = %v, known, "unknown SLUICE_SIMD; not forcing a level");
            }
            level
        });
        match forced {
            Some(forced) => {
                let level = forced.best_at_or_below();
                (level, level)
            }
            None => {
                let cap = SimdLevel::Amx.best_at_or_below();
                let chosen = if cap == SimdLevel::Avx512Bf16 && !bf16_attention_pays() {
                    SimdLevel::Avx512Vnni
                } else {
                    cap
                };
                (chosen, cap)
            }
        }
    })
}

/// Whether attention's products run faster by `vdpbf16ps` than by f32 FMAs on this CPU. Zen 4
/// issues `vdpbf16ps` like an FMA and does twice the multiply-adds with it: bf16 attention took
/// a 4K prefill from 7.25 to 4.31 s there. Intel's Sapphire Rapids-class cores issue it at
/// about a quarter of an FMA's rate (1.7 against 5.5-6.9 G instructions/s on one core), so
/// f32 attention is 26-30% faster (docs/performance.md).
#[cfg(target_arch = "x86_64")]
fn bf16_attention_pays() -> bool {
    // Leaf 0: the vendor string in EBX, EDX, ECX. (`__cpuid` is a safe function from Rust 1.94
    // on; the crate's minimum, 1.89, declares it unsafe.)
    #[allow(unused_unsafe)]
    // SAFETY: every x86_64 CPU has CPUID, and leaf 0 exists on all of them.
    let id = unsafe { std::arch::x86_64::__cpuid(0) };
    [id.ebx, id.edx, id.ecx]
        .map(u32::to_le_bytes)
        .as_flattened()
        == b"AuthenticAMD"
}

#[cfg(not(target_arch = "x86_64"))]
fn bf16_attention_pays() -> bool {
    false
}

/// Dequantizes one stored row (any supported dtype) into f32.
///
/// `src` holds `dst.len()` elements in `dtype`'s layout (a whole number of blocks).
pub fn dequantize_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) {
    scalar::dequantize_row(dtype, src, dst);
}

/// `y[i * w.rows + r] = sum_k W[r][k] * x[i * w.cols + k]` for `i < m` (`x` is `m` rows of
/// `w.cols` f32).
///
/// Reads the first `m * w.cols` elements of `x` and writes the first `m * w.rows` of `y`.
pub fn matmul(pool: &ThreadPool, w: &QMatrix, x: &[f32], m: usize, y: &mut [f32]) {
    matmul_multi_with(simd_level(), pool, &[*w], x, m, &mut [y]);
}

/// [`matmul`] at a chosen instruction set (lowered to what the CPU supports).
pub fn matmul_with(
    level: SimdLevel,
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) {
    matmul_multi_with(level, pool, &[*w], x, m, &mut [y]);
}

/// Several weights with the same input x (e.g. Q, K, V; or gate and up): one activation
/// quantization, one parallel dispatch. `ys[j]` gets the result for `ws[j]`, laid out as in
/// `matmul`.
pub fn matmul_multi(pool: &ThreadPool, ws: &[QMatrix], x: &[f32], m: usize, ys: &mut [&mut [f32]]) {
    matmul_multi_with(simd_level(), pool, ws, x, m, ys);
}

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
// SAFETY: every task writes a disjoint set of elements (its own rows × tokens), and the
// dispatching call holds the unique borrow of the buffer until all tasks are done.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// [`matmul_multi`] at a chosen instruction set (lowered to what the CPU supports).
pub fn matmul_multi_with(
    level: SimdLevel,
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
) {
    matmul_fused_with(level, pool, ws, x, m, ys, Fused::default());
}

/// [`matmul_multi`] with [`Fused`] operations.
pub fn matmul_fused(
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    fused: Fused<'_>,
) {
    matmul_fused_with(simd_level(), pool, ws, x, m, ys, fused);
}

/// [`matmul_fused`] at a chosen instruction set (lowered to what the CPU supports).
pub fn matmul_fused_with(
    level: SimdLevel,
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    fused: Fused<'_>,
) {
    assert_eq!(
        ws.len(),
        ys.len(),
        "matmul_multi: {} weights but {} outputs",
        ws.len(),
        ys.len()
    );
    if ws.is_empty() || m == 0 {
        return;
    }
    let level = level.clamp();
    let cols = ws[0].cols;
    for (w, y) in ws.iter().zip(ys.iter()) {
        assert_eq!(
            w.cols, cols,
            "matmul_multi: all weights must share the input width"
        );
        assert!(
            y.len() >= m * w.rows,
            "matmul: output has {} elements, need {}",
            y.len(),
            m * w.rows
        );
        debug_assert_eq!(w.data.len(), w.rows * w.row_bytes());
    }
    assert!(
        x.len() >= m * cols,
        "matmul: input has {} elements, need {}",
        x.len(),
        m * cols
    );
    let x = &x[..m * cols];
    let Fused {
        mut prologue,
        residual,
    } = fused;
    if let Some(p) = &prologue {
        assert!(
            p.out().len() >= m * cols,
            "matmul: prologue output too short"
        );
        if let Prologue::Norm(n) = p {
            assert_eq!(n.weight.len(), cols, "matmul: norm weight of another width");
        }
    }
    let residual = residual.map(|r| {
        assert!(
            ws.len() == 1 && r.len() >= m * ws[0].rows,
            "matmul: a residual needs one weight and its output's shape"
        );
        OutPtr(r.as_mut_ptr())
    });

    let quantized = ws.iter().any(QMatrix::is_quantized);
    let lane_level = cfg!(target_arch = "x86_64") && lane_kernel(level);
    // Batch invariance: every (weight row, token) product must be computed the same way
    // whatever else is in the batch, or a request's greedy output would depend on its
    // neighbours. The lanes kernel serves every batch size of lane-ordered weights on AVX-512
    // and AVX2 (a weight-repacking prefill kernel was tried and dropped: it rounded
    // differently, and was slower here).
    let use_lanes = lane_level && ws.iter().all(|w| !w.is_quantized() || w.lanes.is_some());
    #[cfg(target_arch = "x86_64")]
    let lane_kind = lanes::LaneKernel::for_level(level);
    let mut acts = if quantized {
        let mut a = quant::take_scratch();
        a.reset(m, cols);
        quant::quantize_parallel(level, pool, x, prologue.as_mut(), &mut a);
        Some(a)
    } else {
        if let Some(p) = prologue.as_mut() {
            p.apply(x, m, cols);
        }
        None
    };
    // The float kernels read the prologue's rows.
    let x = prologue.as_ref().map_or(x, |p| &p.out()[..m * cols]);

    // Tasks: the weights' rows laid end to end, in units of 16, cut into runs (a run may span
    // two matrices; see `RowRuns`) × chunks of tokens. Long prefills are also split by tokens
    // (the lane kernel regroups weights per 8 tokens anyway).
    let tok_chunk = if use_lanes {
        m.min(LANES_TOKENS_PER_TASK)
    } else if m > 8 {
        64
    } else {
        m
    };
    let runs = RowRuns::new(ws, pool.n_threads());
    let tok_chunks = m.div_ceil(tok_chunk);
    let n_tasks = runs.len() * tok_chunks;
    let outs: Vec<OutPtr> = ys.iter_mut().map(|y| OutPtr(y.as_mut_ptr())).collect();

    let acts_ref = acts.as_ref();
    let task = |t: usize| {
        let (run, tc) = (t % runs.len(), t / runs.len());
        let toks = tc * tok_chunk..((tc + 1) * tok_chunk).min(m);
        for (j, rows) in runs.pieces(run) {
            let w = &ws[j];
            match acts_ref {
                #[cfg(target_arch = "x86_64")]
                Some(a) if use_lanes && w.is_quantized() => {
                    // The lane kernel adds the residual as it stores (reading back its masked
                    // stores here stalled on store forwarding).
                    let packed = w.lanes.expect("lane order checked above");
                    let kernel = lane_kind.expect("a lane level has a lane kernel");
                    let (toks, out) = (toks.clone(), outs[j]);
                    lanes::block(kernel, packed, a, rows, toks, out, residual);
                    continue;
                }
                Some(a) if w.is_quantized() => {
                    quant_block(level, w, a, rows.clone(), toks.clone(), outs[j])
                }
                _ => float::float_block(level, w, x, rows.clone(), toks.clone(), outs[j].0),
            }
            if let Some(res) = residual {
                for t in toks.clone() {
                    let at = t * w.rows + rows.start;
                    // SAFETY: these outputs were just written by this task, and their places in
                    // the residual (as large as the output, asserted above) are this task's
                    // only; see `OutPtr`.
                    let (out, res) = unsafe {
                        (
                            std::slice::from_raw_parts(outs[j].0.add(at), rows.len()),
                            std::slice::from_raw_parts_mut(res.0.add(at), rows.len()),
                        )
                    };
                    for (r, &o) in res.iter_mut().zip(out) {
                        *r += o;
                    }
                }
            }
        }
    };
    pool.run(n_tasks, &task);

    if let Some(a) = acts.take() {
        quant::put_scratch(a);
    }
}

/// Whether `level` runs lane-ordered weights through a lane kernel (`lanes`); the
/// CPU backend arranges them when [`simd_level`] does.
pub fn lane_kernel(level: SimdLevel) -> bool {
    level != SimdLevel::Scalar
}

/// Most tokens per task on the lanes kernel.
const LANES_TOKENS_PER_TASK: usize = 64;

/// Weight rows per tile (the main tile; leftovers run one row at a time).
const TILE_R: usize = 4;

/// Computes the outputs of quantized weight `w` for `rows` × `toks` and stores them at `out`.
fn quant_block(
    level: SimdLevel,
    w: &QMatrix,
    acts: &QActs,
    rows: Range<usize>,
    toks: Range<usize>,
    out: OutPtr,
) {
    let rb = w.row_bytes();
    let (cols, nb) = (acts.cols, acts.nb);
    let mut i = toks.start;
    while i < toks.end {
        let c = match toks.end - i {
            n if n >= 4 => 4,
            n if n >= 2 => 2,
            _ => 1,
        };
        let xq = &acts.qs[i * cols..(i + c) * cols];
        let xds = &acts.ds[i * 2 * nb..(i + c) * 2 * nb];
        let mut r = rows.start;
        while r < rows.end {
            let nr = if rows.end - r >= TILE_R { TILE_R } else { 1 };
            let wd = &w.data[r * rb..(r + nr) * rb];
            let mut tile = [0f32; TILE_R * 4];
            let res = &mut tile[..nr * c];
            let tile = QuantTile {
                dtype: w.dtype,
                nr,
                c,
                w: wd,
                row_bytes: rb,
                xq,
                xds,
                cols,
            };
            tile_dispatch(level, tile, res);
            for ci in 0..c {
                for ri in 0..nr {
                    let idx = (i + ci) * w.rows + r + ri;
                    // SAFETY: `idx < m * w.rows <= y.len()` (checked by the caller), and this
                    // (token, row) pair belongs to this task only; see `OutPtr`.
                    unsafe { *out.0.add(idx) = res[ci * nr + ri] };
                }
            }
            r += nr;
        }
        i += c;
    }
}

/// One `nr` × `c` tile of a quantized matrix in stored order: weight rows `0..nr` (`row_bytes`
/// apart in `w`) against activation rows `0..c` (`cols` values apart in `xq`, `2 * cols / 32`
/// scales apart in `xds`). Its outputs go to `out[ci * nr + ri]`.
#[derive(Clone, Copy)]
struct QuantTile<'a> {
    dtype: GgmlType,
    nr: usize,
    c: usize,
    w: &'a [u8],
    row_bytes: usize,
    xq: &'a [i8],
    xds: &'a [f32],
    cols: usize,
}

/// Runs one tile at `level`.
fn tile_dispatch(level: SimdLevel, tile: QuantTile<'_>, out: &mut [f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => {
            // SAFETY: `level` was clamped to the detected level, so the CPU has AVX-512
            // F/BW/VL/VNNI, FMA and F16C.
            unsafe { avx512::tile(tile, out) }
        }
        // Without VNNI the stored layout runs AVX2's tile: it serves only matrices without lane
        // order, which the CPU backend never makes at a lane level (the tests run it).
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 | SimdLevel::Avx2 => {
            // SAFETY: `level` was clamped to the detected level, so the CPU has AVX2, FMA, F16C
            // (every AVX-512 level includes them).
            unsafe { avx2::tile(tile, out) }
        }
        _ => scalar::tile(tile, out),
    }
}
