//! [`Backend`] on one GPU: weights, activation buffers and the KV cache in device memory, every
//! operation a launch of [`super::kernels`] on one stream.
//!
//! Per-step inputs (token ids, positions, KV slots, block tables, lengths) go through scratch
//! buffers that grow to the largest step seen and are then reused, as are the Q8_1 activations
//! and the split-KV partials: after the first steps of each shape nothing is allocated in the
//! decode loop. Decode steps are captured into CUDA graphs and replayed ([`replay`]); while a
//! step is recorded, the operations stage their per-step inputs into one buffer instead of
//! copying them, and hash their launches. The trait's operations return nothing, so a device
//! error after start (which the probe and [`Gpu::open`] cannot rule out, e.g. an Xid) ends the
//! process with its message.

mod replay;

use std::sync::Mutex;

use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, PushKernelArg, ValidAsZeroBits};

use super::device::{config, driver, Gpu};
use super::graphs::{Fingerprint, GraphConfig, Staging};
use super::launch::{self, MATVEC_MAX_BATCH};
use crate::backend::cpu::kernels::dequantize_row;
use crate::backend::{AttnShape, Backend, WeightSource};
use crate::dtype::GgmlType;
use crate::error::{Error, Result};
use crate::kv::{KvSpec, SeqRows, BLOCK_SIZE};

/// A weight on the device.
#[derive(Debug)]
pub enum CudaWeight {
    /// Q4_1 or Q8_0 rows as stored in the GGUF file.
    Matrix {
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        data: CudaSlice<u8>,
    },
    /// A norm's weights, as f32.
    Vector(CudaSlice<f32>),
}

/// The KV cache of the layers this part owns: per layer `[slot][kv head][head_dim]` f16.
#[derive(Debug)]
pub struct CudaKv {
    spec: KvSpec,
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
}

/// How the operations run: launched now, recorded into a graph being captured, or only
/// recorded (staged and hashed) for a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Mode {
    #[default]
    Eager,
    Capture,
    Replay,
}

/// Device buffers reused from step to step (grown, never shrunk), and the recording state.
#[derive(Debug, Default)]
struct Scratch {
    qs: Option<CudaSlice<i8>>,
    ds: Option<CudaSlice<f32>>,
    ints: Vec<Option<CudaSlice<i32>>>,
    /// RoPE's inverse frequencies, for `(rope_dims, head_dim, base bits)`.
    inv_freq: Option<((usize, usize, u32), CudaSlice<f32>)>,
    part_acc: Option<CudaSlice<f32>>,
    part_ml: Option<CudaSlice<f32>>,
    mode: Mode,
    /// The recorded step's per-step inputs and their device buffer.
    staging: Staging,
    staged: Option<CudaSlice<i32>>,
    fingerprint: Fingerprint,
    /// Why the recorded step cannot be a graph (an allocation, a failed launch).
    broken: Option<String>,
}

impl Scratch {
    fn recording(&self) -> bool {
        self.mode != Mode::Eager
    }

    fn break_recording(&mut self, why: impl Into<String>) {
        self.broken.get_or_insert_with(|| why.into());
    }
}

/// The CUDA backend.
#[derive(Debug)]
pub struct CudaBackend {
    gpu: Gpu,
    scratch: Mutex<Scratch>,
    graphs: Mutex<replay::Graphs>,
}

/// A device error inside an operation that cannot return one: the process cannot go on.
fn fatal(e: Error) -> ! {
    eprintln!("sluice-engine: the GPU failed: {e}");
    std::process::exit(70)
}

trait OrDie<T> {
    fn or_die(self) -> T;
}

impl<T> OrDie<T> for Result<T> {
    fn or_die(self) -> T {
        self.unwrap_or_else(|e| fatal(e))
    }
}

impl CudaBackend {
    /// GPU `ordinal`, kernels for heads of `head_dim`, decode graphs as
    /// [`GraphConfig::from_env`] says (on by default).
    pub fn new(ordinal: usize, head_dim: usize) -> Result<Self> {
        let cfg = GraphConfig::from_env().map_err(Error::InvalidRequest)?;
        Self::with_graphs(ordinal, head_dim, cfg)
    }

    /// GPU `ordinal`, decode graphs captured for `graphs`' buckets (none: every step eager).
    pub fn with_graphs(ordinal: usize, head_dim: usize, graphs: GraphConfig) -> Result<Self> {
        if graphs.enabled() {
            tracing::info!(
                "GPU {ordinal}: decode graphs for batches {:?}",
                graphs.buckets
            );
        } else {
            tracing::info!("GPU {ordinal}: decode graphs off, every step eager");
        }
        Ok(Self {
            gpu: Gpu::open(ordinal, head_dim)?,
            scratch: Mutex::default(),
            graphs: Mutex::new(replay::Graphs::new(graphs)),
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.gpu.stream).0
    }

    /// Grows `slot` to hold `n` elements (not while a step is recorded: that breaks the
    /// recording, and the step runs eagerly); returns its device pointer.
    fn grow<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        broken: &mut Option<String>,
        recording: bool,
        slot: &mut Option<CudaSlice<T>>,
        n: usize,
    ) -> u64 {
        if slot.as_ref().is_none_or(|s| s.len() < n) {
            if recording {
                broken.get_or_insert_with(|| "a scratch buffer had to grow".into());
                return 0;
            }
            *slot = Some(self.gpu.zeros::<T>(n.next_power_of_two()).or_die());
        }
        self.ptr(slot.as_ref().expect("grown"))
    }

    /// Copies `data` into scratch int buffer `i` (grown as needed); its device pointer. While a
    /// step is recorded, stages it instead (copied once before the graph launch).
    fn ints(&self, sc: &mut Scratch, i: usize, data: &[i32]) -> u64 {
        if sc.recording() {
            let off = sc.staging.stage(i as u8, data);
            return match &sc.staged {
                Some(buf) if off + data.len() <= buf.len() => self.ptr(buf) + (off * 4) as u64,
                _ => {
                    sc.break_recording("the staging buffer is full");
                    0
                }
            };
        }
        if sc.ints.len() <= i {
            sc.ints.resize_with(i + 1, || None);
        }
        let p = self.grow(&mut None, false, &mut sc.ints[i], data.len().max(1));
        let buf = sc.ints[i].as_mut().expect("grown");
        self.gpu
            .stream
            .memcpy_htod(data, &mut buf.slice_mut(..data.len()))
            .map_err(|e| driver("copy to the GPU", e))
            .or_die();
        p
    }

    /// Launches `name` now (eager or captured); while a step is recorded for a replay, only
    /// hashes the launch.
    fn launch(&self, sc: &mut Scratch, name: &str, shape: launch::Shape, args: &[Arg]) {
        if sc.recording() {
            let key: Vec<u64> = args.iter().map(Arg::bits).collect();
            sc.fingerprint
                .launch(name, (shape.grid, shape.block, shape.shared_bytes), key);
            if sc.mode == Mode::Replay {
                return;
            }
        }
        let mut b = self.gpu.stream.launch_builder(self.gpu.function(name));
        for a in args {
            match a {
                Arg::P(p) => b.arg(p),
                Arg::I(i) => b.arg(i),
                Arg::F(f) => b.arg(f),
            };
        }
        // SAFETY: every caller passes the kernel's own argument list (pointers to device buffers
        // that hold what the kernel touches for the launch's shape, checked by the model's sizes).
        let done = unsafe { b.launch(config(shape)) }.map_err(|e| driver(name, e));
        match done {
            // A failed capture is logged and the step runs eagerly from then on.
            Err(e) if sc.mode == Mode::Capture => sc.break_recording(e.to_string()),
            other => {
                other.or_die();
            }
        }
    }

    /// Quantizes `rows` rows of `cols` at `x` into the scratch Q8_1 buffers: their pointers.
    fn quantize(&self, sc: &mut Scratch, x: u64, rows: usize, cols: usize) -> (u64, u64) {
        let (qs, ds) = self.q8_1(sc, rows, cols);
        self.launch(
            sc,
            "quantize_q8_1",
            launch::per_row(rows),
            &[Arg::P(x), Arg::I(cols as i32), Arg::P(qs), Arg::P(ds)],
        );
        (qs, ds)
    }

    /// RMS norm of `rows` rows of `x` into `xn`, and its Q8_1 quantization into the scratch
    /// buffers: their pointers (one `add_rms_norm_quant` launch serves both).
    fn norm_quant(
        &self,
        sc: &mut Scratch,
        x: &CudaSlice<f32>,
        norm: &CudaWeight,
        eps: f32,
        rows: usize,
        xn: &CudaSlice<f32>,
    ) -> (u64, u64) {
        let cols = Self::cols(norm);
        let (qs, ds) = self.q8_1(sc, rows, cols);
        self.launch(
            sc,
            "add_rms_norm_quant",
            launch::per_row(rows),
            &[
                Arg::P(self.ptr(x)),
                Arg::P(0),
                Arg::P(self.vector(norm)),
                Arg::F(eps),
                Arg::I(cols as i32),
                Arg::P(qs),
                Arg::P(ds),
                Arg::P(self.ptr(xn)),
            ],
        );
        (qs, ds)
    }

    /// `out = q8_1(x) · wᵀ (+ out when add)` for `rows` activation rows, 8 at a time.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        sc: &mut Scratch,
        w: &CudaWeight,
        qs: u64,
        ds: u64,
        rows: usize,
        out: u64,
        add: bool,
    ) {
        let CudaWeight::Matrix {
            dtype,
            rows: wr,
            cols,
            data,
        } = w
        else {
            fatal(Error::Corrupt("a vector weight used as a matrix".into()))
        };
        let name = if *dtype == GgmlType::Q8_0 {
            "matvec_q8_0"
        } else {
            "matvec_q4_1"
        };
        let w = self.ptr(data);
        for first in (0..rows).step_by(MATVEC_MAX_BATCH) {
            let n = (rows - first).min(MATVEC_MAX_BATCH);
            let o = out + (first * wr * 4) as u64;
            self.launch(
                sc,
                name,
                launch::matvec(*wr),
                &[
                    Arg::P(w),
                    Arg::I(*wr as i32),
                    Arg::I((cols / 32) as i32),
                    Arg::P(qs + (first * cols) as u64),
                    Arg::P(ds + (first * cols / 32 * 2 * 4) as u64),
                    Arg::I(n as i32),
                    Arg::P(o),
                    Arg::P(if add { o } else { 0 }),
                ],
            );
        }
    }

    /// The scratch Q8_1 buffers for `rows` rows of `cols`: quants, then scale pairs.
    fn q8_1(&self, sc: &mut Scratch, rows: usize, cols: usize) -> (u64, u64) {
        let rec = sc.recording();
        let qs = self.grow(&mut sc.broken, rec, &mut sc.qs, rows * cols);
        let ds = self.grow(&mut sc.broken, rec, &mut sc.ds, rows * cols / 16);
        (qs, ds)
    }

    /// RoPE's inverse frequencies on the device, uploaded once (the CPU's angles).
    fn inv_freq(&self, sc: &mut Scratch, head_dim: usize, rope_dims: usize, base: f32) -> u64 {
        let key = (rope_dims, head_dim, base.to_bits());
        if sc.inv_freq.as_ref().is_none_or(|(k, _)| *k != key) {
            if sc.recording() {
                sc.break_recording("RoPE's frequencies changed");
                return 0;
            }
            let inv: Vec<f32> = (0..head_dim / 2)
                .map(|i| base.powf(-2.0 * i as f32 / rope_dims as f32))
                .collect();
            sc.inv_freq = Some((key, self.gpu.upload(&inv).or_die()));
        }
        self.ptr(&sc.inv_freq.as_ref().expect("uploaded").1)
    }

    fn vector(&self, w: &CudaWeight) -> u64 {
        match w {
            CudaWeight::Vector(v) => self.ptr(v),
            CudaWeight::Matrix { .. } => {
                fatal(Error::Corrupt("a matrix weight used as a vector".into()))
            }
        }
    }

    fn cols(w: &CudaWeight) -> usize {
        match w {
            CudaWeight::Matrix { cols, .. } => *cols,
            CudaWeight::Vector(v) => v.len(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A kernel argument: a device pointer, an int, a float.
enum Arg {
    P(u64),
    I(i32),
    F(f32),
}

impl Arg {
    /// The argument's bits (what a graph bakes in), for the step's fingerprint.
    fn bits(&self) -> u64 {
        match *self {
            Arg::P(p) => p,
            Arg::I(i) => u64::from(i as u32) | 1 << 32,
            Arg::F(f) => u64::from(f.to_bits()) | 2 << 32,
        }
    }
}

impl Backend for CudaBackend {
    type Weight = CudaWeight;
    type Buf = CudaSlice<f32>;
    type Kv = CudaKv;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn memory_available(&self) -> Result<u64> {
        let (free, _total) = self
            .gpu
            .ctx
            .mem_get_info()
            .map_err(|e| driver("reading the GPU's free memory", e))?;
        Ok(free as u64)
    }

    fn weight(&self, src: &WeightSource) -> Result<CudaWeight> {
        let (rows, cols) = src.rows_cols();
        if src.info.shape.len() == 1 {
            let mut data = vec![0.0; cols];
            dequantize_row(src.dtype(), src.bytes(), &mut data);
            return Ok(CudaWeight::Vector(self.gpu.upload(&data)?));
        }
        match src.dtype() {
            dtype @ (GgmlType::Q4_1 | GgmlType::Q8_0) => Ok(CudaWeight::Matrix {
                dtype,
                rows,
                cols,
                data: self.gpu.upload(src.bytes())?,
            }),
            other => Err(Error::CudaUnavailable(format!(
                "{} is {other}; the CUDA kernels take Q4_1 and Q8_0 matrices",
                src.info.name
            ))),
        }
    }

    fn alloc(&self, len: usize) -> CudaSlice<f32> {
        let mut sc = self.lock();
        if sc.mode == Mode::Capture {
            // Not expected (the step ran eagerly just before with the same rows), but an
            // allocation inside a capture would be part of the graph: this one is not kept.
            sc.break_recording("a buffer was allocated during the capture");
        }
        drop(sc);
        self.gpu.zeros(len).or_die()
    }

    /// One block more than `spec` asks for: block `spec.n_blocks` is the scratch block that a
    /// decode graph's padding rows write to and read from.
    fn alloc_kv(&self, spec: KvSpec) -> Result<CudaKv> {
        let per_layer = (spec.n_blocks + 1) * BLOCK_SIZE * spec.kv_dim;
        let mut k = Vec::with_capacity(spec.n_layers);
        let mut v = Vec::with_capacity(spec.n_layers);
        for _ in 0..spec.n_layers {
            k.push(self.gpu.zeros::<u16>(per_layer)?);
            v.push(self.gpu.zeros::<u16>(per_layer)?);
        }
        Ok(CudaKv { spec, k, v })
    }

    fn upload(&self, data: &[f32], dst: &mut CudaSlice<f32>) {
        self.gpu
            .stream
            .memcpy_htod(data, &mut dst.slice_mut(..data.len()))
            .map_err(|e| driver("copy to the GPU", e))
            .or_die();
    }

    fn download(&self, src: &CudaSlice<f32>, len: usize) -> Vec<f32> {
        self.gpu
            .stream
            .clone_dtoh(&src.slice(..len))
            .map_err(|e| driver("copy from the GPU", e))
            .or_die()
    }

    fn embed(&self, table: &CudaWeight, ids: &[u32], out: &mut CudaSlice<f32>) -> Result<()> {
        let CudaWeight::Matrix {
            dtype,
            rows,
            cols,
            data,
        } = table
        else {
            return Err(Error::Corrupt("the embedding table is a vector".into()));
        };
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= *rows) {
            return Err(Error::InvalidRequest(format!(
                "token id {id} is outside the vocabulary of {rows}"
            )));
        }
        if *dtype != GgmlType::Q8_0 {
            return Err(Error::CudaUnavailable(format!(
                "the embedding table is {dtype}; the CUDA kernels read Q8_0"
            )));
        }
        let ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let mut sc = self.lock();
        let idp = self.ints(&mut sc, 0, &ids);
        self.launch(
            &mut sc,
            "embed_q8_0",
            launch::rope_kv(ids.len()),
            &[
                Arg::P(self.ptr(data)),
                Arg::P(idp),
                Arg::I(*cols as i32),
                Arg::P(self.ptr(out)),
            ],
        );
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        weight: &CudaWeight,
        eps: f32,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) {
        let mut sc = self.lock();
        self.norm_quant(&mut sc, x, weight, eps, rows, out);
    }

    fn matmul(
        &self,
        ws: &[&CudaWeight],
        x: &CudaSlice<f32>,
        rows: usize,
        outs: &mut [&mut CudaSlice<f32>],
    ) {
        let mut sc = self.lock();
        let (qs, ds) = self.quantize(&mut sc, self.ptr(x), rows, Self::cols(ws[0]));
        for (w, out) in ws.iter().zip(outs.iter()) {
            self.product(&mut sc, w, qs, ds, rows, self.ptr(out), false);
        }
    }

    fn norm_matmul(
        &self,
        x: &CudaSlice<f32>,
        norm: &CudaWeight,
        eps: f32,
        rows: usize,
        xn: &mut CudaSlice<f32>,
        ws: &[&CudaWeight],
        outs: &mut [&mut CudaSlice<f32>],
    ) {
        let mut sc = self.lock();
        let (qs, ds) = self.norm_quant(&mut sc, x, norm, eps, rows, xn);
        for (w, out) in ws.iter().zip(outs.iter()) {
            self.product(&mut sc, w, qs, ds, rows, self.ptr(out), false);
        }
    }

    fn matmul_add(
        &self,
        w: &CudaWeight,
        y: &CudaSlice<f32>,
        rows: usize,
        _width: usize,
        _tmp: &mut CudaSlice<f32>,
        x: &mut CudaSlice<f32>,
    ) {
        let mut sc = self.lock();
        let (qs, ds) = self.quantize(&mut sc, self.ptr(y), rows, Self::cols(w));
        self.product(&mut sc, w, qs, ds, rows, self.ptr(x), true);
    }

    fn swiglu_matmul_add(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &mut CudaSlice<f32>,
        w: &CudaWeight,
        rows: usize,
        ffn: usize,
        _width: usize,
        _tmp: &mut CudaSlice<f32>,
        x: &mut CudaSlice<f32>,
    ) {
        let mut sc = self.lock();
        let (qs, ds) = self.q8_1(&mut sc, rows, ffn);
        self.launch(
            &mut sc,
            "swiglu_quant",
            launch::per_row(rows),
            &[
                Arg::P(self.ptr(gate)),
                Arg::P(self.ptr(up)),
                Arg::I(ffn as i32),
                Arg::P(qs),
                Arg::P(ds),
            ],
        );
        self.product(&mut sc, w, qs, ds, rows, self.ptr(x), true);
    }

    fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        rope_dims: usize,
        base: f32,
    ) {
        assert_eq!(head_dim, 64, "kernels compiled for heads of 64");
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let zeros = vec![0i32; pos.len()];
        let mut sc = self.lock();
        let pp = self.ints(&mut sc, 1, &pos);
        let sp = self.ints(&mut sc, 10, &zeros);
        let fp = self.inv_freq(&mut sc, head_dim, rope_dims, base);
        let xp = self.ptr(x);
        // q-style rows only: no kv heads, so nothing is stored.
        self.launch(
            &mut sc,
            "rope_kv_store",
            launch::rope_kv(pos.len()),
            &[
                Arg::P(xp),
                Arg::P(xp),
                Arg::P(xp),
                Arg::P(pp),
                Arg::P(fp),
                Arg::I(n_heads as i32),
                Arg::I(0),
                Arg::I(rope_dims as i32),
                Arg::P(sp),
                Arg::P(0),
                Arg::P(0),
            ],
        );
    }

    fn attention(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        shape: AttnShape,
        seqs: &[SeqRows<'_>],
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        v: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
    ) {
        let AttnShape {
            n_heads,
            n_kv_heads: n_kv,
            head_dim,
        } = shape;
        debug_assert!(layer < kv.spec.n_layers && n_kv * head_dim == kv.spec.kv_dim);
        // Padding rows of a decode graph use the scratch block past the pool (`alloc_kv`).
        let inputs = launch::attention_inputs(seqs, kv.spec.n_blocks as u32);
        let rows = inputs.slots.len();
        let max_blocks = inputs.width;
        let (kc, vc) = (self.ptr(&kv.k[layer]), self.ptr(&kv.v[layer]));
        let mut guard = self.lock();
        let sc = &mut *guard;
        let sp = self.ints(sc, 2, &inputs.slots);
        let tp = self.ints(sc, 3, &inputs.tables);
        // Store this step's keys and values (no rotation: RoPE ran on k already).
        let (kp, vp) = (self.ptr(k), self.ptr(v));
        self.launch(
            sc,
            "rope_kv_store",
            launch::rope_kv(rows),
            &[
                Arg::P(kp),
                Arg::P(kp),
                Arg::P(vp),
                Arg::P(sp),
                Arg::P(0),
                Arg::I(0),
                Arg::I(n_kv as i32),
                Arg::I(0),
                Arg::P(sp),
                Arg::P(kc),
                Arg::P(vc),
            ],
        );
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (qp, op) = (self.ptr(q), self.ptr(out));
        // Decode rows in one split-KV launch; each prefill chunk in a tiled one.
        let decode = &inputs.decode;
        if !decode.is_empty() {
            // The split plan follows the tables' width, not this step's lengths, so that a graph
            // (captured for the width) and an eager step split alike.
            let (grid, split_len, n_splits) =
                launch::decode(n_kv, decode.len(), max_blocks * BLOCK_SIZE, self.gpu.sms);
            let qr = self.ints(sc, 4, &inputs.q_rows);
            let lp = self.ints(sc, 5, &inputs.lens);
            let dt = self.ints(sc, 6, &inputs.decode_tables);
            let parts = decode.len() * n_heads * n_splits;
            let rec = sc.recording();
            let pa = self.grow(&mut sc.broken, rec, &mut sc.part_acc, parts * head_dim);
            let pm = self.grow(&mut sc.broken, rec, &mut sc.part_ml, parts * 2);
            self.launch(
                sc,
                "attn_decode",
                grid,
                &[
                    Arg::P(qp),
                    Arg::P(qr),
                    Arg::P(kc),
                    Arg::P(vc),
                    Arg::P(dt),
                    Arg::I(max_blocks as i32),
                    Arg::P(lp),
                    Arg::I(n_heads as i32),
                    Arg::I(n_kv as i32),
                    Arg::F(scale),
                    Arg::I(split_len as i32),
                    Arg::I(n_splits as i32),
                    Arg::P(pa),
                    Arg::P(pm),
                ],
            );
            self.launch(
                sc,
                "attn_combine",
                launch::combine(n_heads, decode.len(), head_dim),
                &[
                    Arg::P(pa),
                    Arg::P(pm),
                    Arg::P(qr),
                    Arg::I(n_heads as i32),
                    Arg::I(n_splits as i32),
                    Arg::P(op),
                ],
            );
        }
        for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.len > 1) {
            let args = [s.start as i32, s.len as i32, s.pos as i32];
            let fp = self.ints(sc, 7, &args[..1]);
            let cp = self.ints(sc, 8, &args[1..2]);
            let pp = self.ints(sc, 9, &args[2..]);
            let tp_i = tp + (i * max_blocks * 4) as u64;
            self.launch(
                sc,
                "attn_prefill",
                launch::prefill(n_heads, s.len, 1),
                &[
                    Arg::P(qp),
                    Arg::P(fp),
                    Arg::P(cp),
                    Arg::P(pp),
                    Arg::P(kc),
                    Arg::P(vc),
                    Arg::P(tp_i),
                    Arg::I(max_blocks as i32),
                    Arg::I(n_heads as i32),
                    Arg::I(n_kv as i32),
                    Arg::F(scale),
                    Arg::P(op),
                ],
            );
        }
    }

    fn silu_mul(&self, gate: &mut CudaSlice<f32>, up: &CudaSlice<f32>, len: usize) {
        self.launch(
            &mut self.lock(),
            "silu_mul_f32",
            launch::elementwise(len),
            &[
                Arg::P(self.ptr(gate)),
                Arg::P(self.ptr(up)),
                Arg::I(len as i32),
            ],
        );
    }

    fn add_assign(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, len: usize) {
        self.launch(
            &mut self.lock(),
            "add_f32",
            launch::elementwise(len),
            &[Arg::P(self.ptr(x)), Arg::P(self.ptr(y)), Arg::I(len as i32)],
        );
    }

    fn run_blocks(
        &self,
        seqs: &[SeqRows<'_>],
        hidden: &mut CudaSlice<f32>,
        rows: usize,
        width: usize,
        body: &mut dyn FnMut(&[SeqRows<'_>], &mut CudaSlice<f32>, usize),
    ) {
        self.run_graphed(seqs, hidden, rows, width, body);
    }

    fn gather_rows(
        &self,
        x: &CudaSlice<f32>,
        rows: &[usize],
        width: usize,
        out: &mut CudaSlice<f32>,
    ) {
        for (i, &r) in rows.iter().enumerate() {
            self.gpu
                .stream
                .memcpy_dtod(
                    &x.slice(r * width..(r + 1) * width),
                    &mut out.slice_mut(i * width..(i + 1) * width),
                )
                .map_err(|e| driver("copy on the GPU", e))
                .or_die();
        }
    }
}
