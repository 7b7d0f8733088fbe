//! One GPU: its context and stream (one stream of its own, which decode graphs are captured
//! on), the kernel modules loaded once, and a typed launcher per
//! kernel (shapes from [`super::launch`]). The modules come from NVRTC at start when it is
//! present, else from the PTX `make cuda-check` wrote (`SLUICE_CUDA_PTX`, a directory of
//! `<module>.compute_90.ptx`), so a GPU machine whose NVRTC is another major version still runs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::kernels::{options, MODULES};
use super::launch::{self, Shape};
use crate::error::{Error, Result};

/// A device error, named.
pub fn driver(what: &str, e: DriverError) -> Error {
    Error::CudaUnavailable(format!("{what}: {e:?}"))
}

/// The launch configuration of a [`Shape`].
pub fn config(s: Shape) -> LaunchConfig {
    LaunchConfig {
        grid_dim: s.grid,
        block_dim: s.block,
        shared_mem_bytes: s.shared_bytes,
    }
}

/// A GPU with Sluice's kernels loaded.
#[derive(Debug)]
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Multiprocessors (the split-KV choice fills them).
    pub sms: usize,
}

/// What a kernel takes where the source allows none (an optional pointer).
const NULL: u64 = 0;

impl Gpu {
    /// GPU `ordinal`, kernels compiled for heads of `head_dim`.
    pub fn open(ordinal: usize, head_dim: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(|e| driver("cannot open the GPU", e))?;
        // SAFETY: every buffer of this GPU is used on the one stream below, in order, so cudarc's
        // per-buffer events (which would also be waits on events recorded outside a graph
        // capture) are not needed; no buffer exists yet.
        unsafe { ctx.disable_event_tracking() };
        // Its own stream: the legacy default stream cannot be captured into a graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| driver("cannot create a stream", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| driver("compute capability", e))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| driver("multiprocessor count", e))? as usize;
        let mut funcs = HashMap::new();
        for m in MODULES {
            let ptx = Self::ptx(m.name, &m.program(), head_dim, major, minor)?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| driver(&format!("loading module {}", m.name), e))?;
            for &k in m.kernels {
                let f = module
                    .load_function(k)
                    .map_err(|e| driver(&format!("kernel {k}"), e))?;
                funcs.insert(k, f);
            }
        }
        Ok(Self {
            ctx,
            stream,
            funcs,
            sms,
        })
    }

    fn ptx(name: &str, program: &str, head_dim: usize, major: i32, minor: i32) -> Result<Ptx> {
        if let Ok(dir) = std::env::var("SLUICE_CUDA_PTX") {
            let file = PathBuf::from(dir).join(format!("{name}.compute_90.ptx"));
            let text = std::fs::read_to_string(&file).map_err(|e| {
                Error::CudaUnavailable(format!("SLUICE_CUDA_PTX: {}: {e}", file.display()))
            })?;
            return Ok(Ptx::from_src(text));
        }
        let arch: &'static str = match (major, minor) {
            (9, _) => "compute_90",
            (8, 9) => "compute_89",
            (8, 6) => "compute_86",
            _ => "compute_80",
        };
        compile_ptx_with_opts(
            program,
            CompileOptions {
                arch: Some(arch),
                options: options(head_dim),
                name: Some(format!("{name}.cu")),
                ..Default::default()
            },
        )
        .map_err(|e| Error::CudaUnavailable(format!("NVRTC failed on {name}.cu: {e:?}")))
    }

    /// A loaded kernel by name (one of [`MODULES`]' kernels).
    pub fn function(&self, name: &str) -> &CudaFunction {
        &self.funcs[name]
    }

    fn f(&self, name: &str) -> &CudaFunction {
        self.function(name)
    }

    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(data)
            .map_err(|e| driver("copy to the GPU", e))
    }

    pub fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(|e| driver("GPU allocation", e))
    }

    pub fn download<T: cudarc::driver::DeviceRepr>(&self, src: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream
            .clone_dtoh(src)
            .map_err(|e| driver("copy from the GPU", e))
    }

    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver("GPU work", e))
    }

    /// `add_rms_norm_quant` over `rows` rows of `cols` (`residual` added into `x` first; the
    /// normed rows into `xn` when given).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_quant(
        &self,
        x: &mut CudaSlice<f32>,
        residual: Option<&CudaSlice<f32>>,
        w: &CudaSlice<f32>,
        eps: f32,
        rows: usize,
        cols: usize,
        qs: &mut CudaSlice<i8>,
        ds: &mut CudaSlice<f32>,
        xn: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let cols_i = cols as i32;
        let mut b = self.stream.launch_builder(self.f("add_rms_norm_quant"));
        b.arg(x);
        match residual {
            Some(r) => b.arg(r),
            None => b.arg(&NULL),
        };
        b.arg(w).arg(&eps).arg(&cols_i).arg(qs).arg(ds);
        match xn {
            Some(o) => b.arg(o),
            None => b.arg(&NULL),
        };
        // SAFETY: the argument list is the kernel's signature; the buffers hold `rows` rows of
        // `cols` (and `cols / 32` scale pairs), which is all it touches.
        unsafe { b.launch(config(launch::per_row(rows))) }
            .map(|_| ())
            .map_err(|e| driver("add_rms_norm_quant", e))
    }

    /// `swiglu_quant`: `silu(gate) * up` over `rows` rows of `cols`, quantized.
    pub fn swiglu_quant(
        &self,
        gate: &CudaSlice<f32>,
        up: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        qs: &mut CudaSlice<i8>,
        ds: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let cols_i = cols as i32;
        let mut b = self.stream.launch_builder(self.f("swiglu_quant"));
        b.arg(gate).arg(up).arg(&cols_i).arg(qs).arg(ds);
        // SAFETY: as `norm_quant`.
        unsafe { b.launch(config(launch::per_row(rows))) }
            .map(|_| ())
            .map_err(|e| driver("swiglu_quant", e))
    }

    /// `matvec_q4_1` / `matvec_q8_0`: `out[b * rows + r]` for `nbatch` (≤ 8) activation rows,
    /// `add` (which may be `out` itself: pass `add_out = true`) added as the epilogue.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec(
        &self,
        q8_0: bool,
        w: &CudaSlice<u8>,
        rows: usize,
        cols: usize,
        qs: &CudaSlice<i8>,
        ds: &CudaSlice<f32>,
        nbatch: usize,
        out: &mut CudaSlice<f32>,
        add_out: bool,
    ) -> Result<()> {
        assert!((1..=launch::MATVEC_MAX_BATCH).contains(&nbatch));
        let (rows_i, nb_i, nbatch_i) = (rows as i32, (cols / 32) as i32, nbatch as i32);
        let name = if q8_0 { "matvec_q8_0" } else { "matvec_q4_1" };
        // The epilogue reads `add[i]` and writes `out[i]` from the same thread, so passing the
        // output as its own addend is the residual connection.
        let out_ptr = {
            use cudarc::driver::DevicePtrMut;
            let (p, _sync) = out.device_ptr_mut(&self.stream);
            p
        };
        let add_ptr: u64 = if add_out { out_ptr } else { NULL };
        let mut b = self.stream.launch_builder(self.f(name));
        b.arg(w)
            .arg(&rows_i)
            .arg(&nb_i)
            .arg(qs)
            .arg(ds)
            .arg(&nbatch_i)
            .arg(&out_ptr)
            .arg(&add_ptr);
        // SAFETY: `w` holds `rows` rows of `cols / 32` blocks, the activations `nbatch` rows of
        // `cols`, `out` `nbatch * rows` floats (checked by the callers' shapes).
        unsafe { b.launch(config(launch::matvec(rows))) }
            .map(|_| ())
            .map_err(|e| driver(name, e))
    }

    /// `argmax_rows` over `rows` rows of `vocab` logits.
    pub fn argmax(
        &self,
        logits: &CudaSlice<f32>,
        rows: usize,
        vocab: usize,
        out: &mut CudaSlice<i32>,
    ) -> Result<()> {
        let vocab_i = vocab as i32;
        let mut b = self.stream.launch_builder(self.f("argmax_rows"));
        b.arg(logits).arg(&vocab_i).arg(out);
        // SAFETY: `rows` rows of `vocab` logits, one index per row.
        unsafe { b.launch(config(launch::per_row(rows))) }
            .map(|_| ())
            .map_err(|e| driver("argmax_rows", e))
    }

    /// `attn_decode` then `attn_combine` for `seq_lens.len()` sequences.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_decode(
        &self,
        q: &CudaSlice<f32>,
        q_rows: &CudaSlice<i32>,
        k_cache: &CudaSlice<u16>,
        v_cache: &CudaSlice<u16>,
        tables: &CudaSlice<i32>,
        max_blocks: usize,
        seq_lens: &CudaSlice<i32>,
        n_seqs: usize,
        max_len: usize,
        heads: (usize, usize, usize),
        scratch: (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (n_heads, n_kv, head_dim) = heads;
        let (shape, split_len, n_splits) = launch::decode(n_kv, n_seqs, max_len, self.sms);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let ints = [max_blocks, n_heads, n_kv].map(|v| v as i32);
        let (split_i, n_splits_i) = (split_len as i32, n_splits as i32);
        let (part_acc, part_ml) = scratch;
        let mut b = self.stream.launch_builder(self.f("attn_decode"));
        b.arg(q)
            .arg(q_rows)
            .arg(k_cache)
            .arg(v_cache)
            .arg(tables)
            .arg(&ints[0])
            .arg(seq_lens);
        b.arg(&ints[1])
            .arg(&ints[2])
            .arg(&scale)
            .arg(&split_i)
            .arg(&n_splits_i);
        b.arg(&mut *part_acc).arg(&mut *part_ml);
        // SAFETY: the tables hold `max_blocks` entries per sequence, every length is at most
        // `max_len`, and the partials hold `n_seqs * n_heads * n_splits` (sized by the caller
        // from `launch::decode`).
        unsafe { b.launch(config(shape)) }.map_err(|e| driver("attn_decode", e))?;
        let mut c = self.stream.launch_builder(self.f("attn_combine"));
        c.arg(&*part_acc)
            .arg(&*part_ml)
            .arg(q_rows)
            .arg(&ints[1])
            .arg(&n_splits_i)
            .arg(out);
        // SAFETY: as above; `out` holds every query row.
        unsafe { c.launch(config(launch::combine(n_heads, n_seqs, head_dim))) }
            .map(|_| ())
            .map_err(|e| driver("attn_combine", e))
    }
}
