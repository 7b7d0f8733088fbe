//! Decode steps as CUDA graphs (`Backend::run_blocks` of [`CudaBackend`]); the decisions are
//! [`graphs`]' and tested on the CPU.
//!
//! A decode step of a shape with no graph runs eagerly on the bucket's own hidden-state buffer,
//! its batch padded to the bucket, and is then captured (stream capture of the same operations,
//! their per-step inputs staged at fixed offsets of one device buffer). A later step of that
//! shape is recorded without launching anything: if its launches hash to the capture's, its
//! staged inputs are copied to the device and the graph is launched; if not (a buffer moved),
//! it runs eagerly and is captured again. A failed capture is logged once and its shape runs
//! eagerly from then on. The hidden rows are copied into the bucket's buffer before and back
//! after, so the graph does not depend on where the caller keeps them.

use std::collections::HashMap;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice};

use super::{CudaBackend, Mode, OrDie, Scratch};
use crate::backend::cuda::device::driver;
use crate::backend::cuda::graphs::{
    self, staging_capacity, Fingerprint, GraphConfig, GraphSet, GraphStats, Plan, StepShape,
};
use crate::kv::SeqRows;

/// An instantiated graph.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as no two use it at once
// (cuda-driver-api "graphs-thread-safety"); `Graphs` is only reached through the backend's
// mutex.
unsafe impl Send for Graph {}

/// The backend's graphs and each bucket's hidden-state buffer.
pub(super) struct Graphs {
    cfg: GraphConfig,
    set: GraphSet<Graph>,
    hidden: HashMap<usize, CudaSlice<f32>>,
}

impl std::fmt::Debug for Graphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graphs")
            .field("cfg", &self.cfg)
            .field("set", &self.set)
            .finish()
    }
}

impl Graphs {
    pub(super) fn new(cfg: GraphConfig) -> Self {
        Self {
            cfg,
            set: GraphSet::default(),
            hidden: HashMap::new(),
        }
    }
}

/// What recording a step gave.
struct Recorded {
    fingerprint: u64,
    broken: Option<String>,
}

type Body<'b> = dyn FnMut(&[SeqRows<'_>], &mut CudaSlice<f32>, usize) + 'b;

impl CudaBackend {
    /// What the decode graphs did so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.graph_lock().set.stats
    }

    fn graph_lock(&self) -> std::sync::MutexGuard<'_, Graphs> {
        self.graphs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Backend::run_blocks`: a decode step a bucket holds is replayed or captured, anything
    /// else runs as it is.
    pub(super) fn run_graphed(
        &self,
        seqs: &[SeqRows<'_>],
        hidden: &mut CudaSlice<f32>,
        rows: usize,
        width: usize,
        body: &mut Body<'_>,
    ) {
        let mut g = self.graph_lock();
        let Some(shape) = g.cfg.decode_shape(seqs, rows) else {
            drop(g);
            return body(seqs, hidden, rows);
        };
        let plan = g.set.plan(shape);
        if plan == Plan::Eager {
            g.set.stats.eager += 1;
            drop(g);
            return body(seqs, hidden, rows);
        }
        let bucket = shape.bucket;
        let padded = graphs::padded(seqs, bucket);
        let mut own = match g.hidden.remove(&bucket) {
            Some(b) if b.len() >= bucket * width => b,
            _ => self.gpu.zeros::<f32>(bucket * width).or_die(),
        };
        let n = rows * width;
        self.copy(hidden, &mut own, n);
        self.prepare_staging(shape);
        let mut replayed = false;
        if plan == Plan::Replay {
            let rec = self.record(Mode::Replay, || body(&padded, &mut own, bucket));
            let fingerprint = if rec.broken.is_some() {
                0
            } else {
                rec.fingerprint
            };
            if let Some(graph) = g.set.replay(shape, fingerprint) {
                self.upload_staging();
                graph
                    .0
                    .launch()
                    .map_err(|e| driver("graph launch", e))
                    .or_die();
                replayed = true;
            }
        }
        if !replayed {
            body(&padded, &mut own, bucket);
            self.capture(&mut g.set, shape, || body(&padded, &mut own, bucket));
        }
        self.copy(&own, hidden, n);
        g.hidden.insert(bucket, own);
    }

    fn copy(&self, from: &CudaSlice<f32>, to: &mut CudaSlice<f32>, n: usize) {
        self.gpu
            .stream
            .memcpy_dtod(&from.slice(..n), &mut to.slice_mut(..n))
            .map_err(|e| driver("copy on the GPU", e))
            .or_die();
    }

    /// The staging buffer, large enough for a step of `shape` (grown here, never while a step
    /// is recorded: its address is part of every graph that stages into it).
    fn prepare_staging(&self, shape: StepShape) {
        let need = staging_capacity(shape.bucket, shape.table_width);
        let mut sc = self.lock();
        if sc.staged.as_ref().is_none_or(|b| b.len() < need) {
            sc.staged = Some(self.gpu.zeros::<i32>(need).or_die());
        }
    }

    /// Copies the recorded step's staged inputs to the device, before its graph runs.
    fn upload_staging(&self) {
        let mut guard = self.lock();
        let sc: &mut Scratch = &mut guard;
        let (data, buf) = (&sc.staging.data, sc.staged.as_mut().expect("prepared"));
        self.gpu
            .stream
            .memcpy_htod(data.as_slice(), &mut buf.slice_mut(..data.len()))
            .map_err(|e| driver("copy to the GPU", e))
            .or_die();
    }

    /// Runs `body` with the operations in `mode`, from an empty staging area and fingerprint.
    fn record(&self, mode: Mode, body: impl FnOnce()) -> Recorded {
        {
            let mut sc = self.lock();
            sc.mode = mode;
            sc.staging.clear();
            sc.fingerprint = Fingerprint::default();
            sc.broken = None;
        }
        body();
        let mut sc = self.lock();
        sc.mode = Mode::Eager;
        Recorded {
            fingerprint: sc.fingerprint.finish(),
            broken: sc.broken.take(),
        }
    }

    /// Captures `body` into a graph for `shape`; on failure, logs it and marks the shape eager.
    fn capture(&self, set: &mut GraphSet<Graph>, shape: StepShape, body: impl FnOnce()) {
        let stream = &self.gpu.stream;
        // Thread-local: the other ranks' threads on this GPU go on allocating and copying.
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        let result = match stream.begin_capture(mode) {
            Err(e) => Err(format!("begin capture: {e:?}")),
            Ok(()) => {
                let rec = self.record(Mode::Capture, body);
                let graph = stream.end_capture(CUgraphInstantiate_flags(0));
                match (rec.broken, graph) {
                    (Some(why), _) => Err(why),
                    (None, Err(e)) => Err(format!("end capture: {e:?}")),
                    (None, Ok(None)) => Err("the capture recorded nothing".into()),
                    (None, Ok(Some(g))) => Ok((rec.fingerprint, g)),
                }
            }
        };
        match result {
            Ok((fingerprint, g)) => set.insert(shape, fingerprint, Graph(g)),
            Err(why) => {
                if set.fail(shape, why.clone()) {
                    tracing::warn!(
                        "CUDA graph capture failed for decode batches of {} (block tables {} \
                         wide); those run eagerly: {why}",
                        shape.bucket,
                        shape.table_width
                    );
                }
            }
        }
    }
}
