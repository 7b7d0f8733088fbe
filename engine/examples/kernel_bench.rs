//! Times the CPU matmul and attention kernels on SmolLM2-135M's shapes.
//!
//! `cargo run --release -p sluice-engine --example kernel_bench [-- THREADS [M,M,... [FILTER]]]`
//! (default 2 threads, m = 1,8,512, every shape; `SLUICE_SIMD=scalar|avx2|avx512` caps the
//! instruction set). Prints µs per call and GMAC/s for each shape whose name contains FILTER at
//! each m (best of many batches) and estimates the matmuls of a whole step per m; then, unless
//! FILTER names none of them, one layer's batch-8 decode attention, one KV head's prefill
//! attention at 512, 4,096 and 8,192 positions (`KB_POSITIONS=N,N,...` for others; its blocks
//! one after the other as the cache lays out a sequence's run, or `KB_SPREAD=N` elements apart),
//! and a fused decode layer.

use std::time::{Duration, Instant};

use sluice_engine::backend::cpu::kernels::{
    attend_rows, axpy, dot_f32, matmul, matmul_multi, simd_level, HugeBuf, KvFormat, KvHead,
    LaneMatrix, QMatrix,
};
use sluice_engine::backend::cpu::pool::ThreadPool;
use sluice_engine::dtype::GgmlType;

const LAYERS: usize = 30;

/// `w` with the lane-ordered copy the CPU backend makes of quantized weights (leaked: it lives
/// as long as the benchmark).
fn as_the_backend_holds(w: QMatrix<'_>) -> QMatrix<'_> {
    match LaneMatrix::new(&w).expect("mapped") {
        Some(lanes) => w.with_lanes(Box::leak(Box::new(lanes))),
        None => w,
    }
}

/// (name, dtype, cols, rows, uses per layer); the head is used once per token.
const SHAPES: &[(&str, GgmlType, usize, usize, usize)] = &[
    ("q/o  576->576", GgmlType::Q4_1, 576, 576, 2),
    ("k/v  576->192", GgmlType::Q4_1, 576, 192, 2),
    ("gate/up 576->1536", GgmlType::Q4_1, 576, 1536, 2),
    ("down 1536->576", GgmlType::Q4_1, 1536, 576, 1),
    ("head 576->49152", GgmlType::Q8_0, 576, 49152, 0),
];

struct Rng(u64);

impl Rng {
    fn byte(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u8
    }
}

fn random_weights(rng: &mut Rng, dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let blocks = rows * cols / 32;
    let mut v = Vec::with_capacity(blocks * dtype.type_size());
    for _ in 0..blocks {
        // Scales 0.01 (f16 0x211F) and, for Q4_1, a minimum of -0.08 (f16 0xAD1F).
        v.extend([0x1F, 0x21]);
        if dtype == GgmlType::Q4_1 {
            v.extend([0x1F, 0xAD]);
        }
        v.extend((0..dtype.type_size() - v.len() % dtype.type_size()).map(|_| rng.byte()));
    }
    v
}

/// Time of one call: the fastest of many short batches (robust on a shared, noisy machine,
/// where the median would mostly measure other processes).
fn time_it(budget: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let start = Instant::now();
    f();
    let one = start.elapsed().max(Duration::from_nanos(100));
    // Batches of about 200 µs, so that some of them run undisturbed.
    let per_batch = (200e-6 / one.as_secs_f64()).clamp(1.0, 10_000.0) as u32;
    let mut best = Duration::MAX;
    let (t0, mut n) = (Instant::now(), 0);
    while n < 5 || (t0.elapsed() < budget && n < 2000) {
        let s = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        best = best.min(s.elapsed() / per_batch);
        n += 1;
    }
    best
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    println!(
        "kernel_bench: {threads} threads, SIMD level {:?}",
        simd_level()
    );
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let budget = Duration::from_millis(300);
    let empty = time_it(budget, || pool.run(pool.n_threads(), &|_| {}));
    println!(
        "pool.run with one empty task per thread: {:.2} us",
        empty.as_secs_f64() * 1e6
    );
    let ms: Vec<usize> = std::env::args()
        .nth(2)
        .map(|a| a.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 512]);
    let filter = std::env::args().nth(3).unwrap_or_default();
    // model_time[k]: estimated whole-model matmul time per step for m = ms[k].
    let mut model_time = vec![0f64; ms.len()];
    println!(
        "{:<20} {:>6} {:>12} {:>10}",
        "shape", "m", "us/call", "GMAC/s"
    );
    for &(name, dtype, cols, rows, per_layer) in SHAPES {
        if !name.contains(filter.as_str()) {
            continue;
        }
        let data = random_weights(&mut rng, dtype, rows, cols);
        let w = match QMatrix::new(dtype, rows, cols, &data) {
            Ok(w) => as_the_backend_holds(w),
            Err(e) => panic!("bad benchmark matrix: {e}"),
        };
        for (k, &m) in ms.iter().enumerate() {
            let x: Vec<f32> = (0..m * cols)
                .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let mut y = vec![0f32; m * rows];
            let t = time_it(budget, || matmul(&pool, &w, &x, m, &mut y));
            let macs = (m * rows * cols) as f64;
            println!(
                "{name:<20} {m:>6} {:>12.1} {:>10.1}",
                t.as_secs_f64() * 1e6,
                macs / t.as_secs_f64() / 1e9
            );
            let uses = if per_layer == 0 {
                1
            } else {
                per_layer * LAYERS
            };
            model_time[k] += uses as f64 * t.as_secs_f64();
        }
    }
    for (k, &m) in ms.iter().enumerate() {
        println!(
            "model matmuls at m={m}: {:.2} ms per step ({:.0} tok/s from matmuls alone)",
            model_time[k] * 1e3,
            m as f64 / model_time[k]
        );
    }

    if "attention".contains(filter.as_str()) {
        attention_bench(budget);
    }
    if "prefill attention".contains(filter.as_str()) {
        let ns: Vec<usize> = std::env::var("KB_POSITIONS")
            .ok()
            .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_else(|| vec![512, 4096, 8192]);
        prefill_attention_bench(budget, &ns);
    }
    if !filter.is_empty() {
        return;
    }
    // A decode layer as the model issues it: fused QKV and gate/up via matmul_multi.
    let mk =
        |rng: &mut Rng, rows: usize, cols: usize| random_weights(rng, GgmlType::Q4_1, rows, cols);
    let (dq, dk, dv, dout, dg, du, dd) = (
        mk(&mut rng, 576, 576),
        mk(&mut rng, 192, 576),
        mk(&mut rng, 192, 576),
        mk(&mut rng, 576, 576),
        mk(&mut rng, 1536, 576),
        mk(&mut rng, 1536, 576),
        mk(&mut rng, 576, 1536),
    );
    let q = |rows, cols, d| {
        as_the_backend_holds(QMatrix::new(GgmlType::Q4_1, rows, cols, d).expect("valid"))
    };
    let qkv = [q(576, 576, &dq), q(192, 576, &dk), q(192, 576, &dv)];
    let gu = [q(1536, 576, &dg), q(1536, 576, &du)];
    let (wo, wd) = (q(576, 576, &dout), q(576, 1536, &dd));
    for m in [1usize, 512] {
        let x: Vec<f32> = (0..m * 1536)
            .map(|i| ((i * 31) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let (mut yq, mut yk, mut yv) = (
            vec![0f32; m * 576],
            vec![0f32; m * 192],
            vec![0f32; m * 192],
        );
        let (mut yo, mut yg, mut yu, mut yd) = (
            vec![0f32; m * 576],
            vec![0f32; m * 1536],
            vec![0f32; m * 1536],
            vec![0f32; m * 576],
        );
        let t = time_it(budget, || {
            matmul_multi(
                &pool,
                &qkv,
                &x[..m * 576],
                m,
                &mut [&mut yq, &mut yk, &mut yv],
            );
            matmul(&pool, &wo, &x[..m * 576], m, &mut yo);
            matmul_multi(&pool, &gu, &x[..m * 576], m, &mut [&mut yg, &mut yu]);
            matmul(&pool, &wd, &x, m, &mut yd);
        });
        println!(
            "one layer (fused QKV, gate/up) m={m}: {:.1} us, x{LAYERS} layers = {:.2} ms",
            t.as_secs_f64() * 1e6,
            t.as_secs_f64() * 1e3 * LAYERS as f64
        );
    }
}

/// One KV head's prefill attention (3 query heads of 64) over `n` positions, in tasks of 16
/// query rows as the backend runs them, on one thread; with the estimate for the whole model
/// (30 layers, 3 KV heads, 2 threads).
fn prefill_attention_bench(budget: Duration, ns: &[usize]) {
    let (group, hd, bs) = (3, 64, 16);
    // KB_SPREAD=N: blocks N elements apart (the pool's block-major layout puts a head's blocks
    // 2 · 30 · 3 · 16 · 64 = 184,320 apart), in huge pages as the pool's.
    let spread: usize = std::env::var("KB_SPREAD")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(bs * hd);
    for &n in ns {
        let blocks: Vec<u32> = (0..n.div_ceil(bs) as u32).collect();
        let mut kh = HugeBuf::<u16>::zeroed(blocks.len() * spread).expect("mapped");
        let mut vh = HugeBuf::<u16>::zeroed(blocks.len() * spread).expect("mapped");
        for (b, (kc, vc)) in kh
            .as_mut_slice()
            .chunks_exact_mut(spread)
            .zip(vh.as_mut_slice().chunks_exact_mut(spread))
            .enumerate()
        {
            for i in 0..bs * hd {
                let j = b * bs * hd + i;
                kc[i] = half::f16::from_f32(((j * 7919) % 2001) as f32 / 1000.0 - 1.0).to_bits();
                vc[i] = half::f16::from_f32(((j * 7717) % 2001) as f32 / 1000.0 - 1.0).to_bits();
            }
        }
        let (kb, vb) = (kh.as_slice(), vh.as_slice());
        let q: Vec<f32> = (0..n * group * hd)
            .map(|i| ((i * 31) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let kv = KvHead {
            k: kb,
            v: vb,
            head_dim: hd,
            block_stride: spread,
            blocks: &blocks,
            block_size: bs,
            // The bits stand for keys and values in whichever format: timing, not answers.
            format: KvFormat::of(hd, bs),
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; 16 * group * hd];
        let t = time_it(budget, || {
            for r0 in (0..n).step_by(16) {
                let rows = 16.min(n - r0);
                let q = &q[r0 * group * hd..];
                let out = &mut out[..rows * group * hd];
                attend_rows(&kv, q, group * hd, hd, group, r0 + 1, scale, out);
            }
        });
        println!(
            "prefill attention, {n} positions, one KV head, 1 thread: {:.2} ms (model estimate {:.2} s)",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() * 30.0 * 3.0 / 2.0
        );
    }
}

/// One layer's decode attention at batch 8 (9 query heads on 3 KV heads of 64, contexts of
/// `ctx` positions in blocks of 16), on one thread: the kernel against a loop of per-position
/// `dot_f32`/`axpy` calls.
fn attention_bench(budget: Duration) {
    let (seqs, heads, kv_heads, hd, bs) = (8, 9, 3, 64, 16);
    for ctx in [64usize, 512, 4096] {
        let blocks_per_seq = ctx.div_ceil(bs);
        let slots = seqs * blocks_per_seq * bs;
        let stride = kv_heads * hd;
        let k: Vec<f32> = (0..slots * stride)
            .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let v: Vec<f32> = k.iter().rev().copied().collect();
        let bits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect()
        };
        let (kb, vb) = (bits(&k), bits(&v));
        let q: Vec<f32> = (0..seqs * heads * hd)
            .map(|i| ((i * 31) % 200) as f32 / 100.0 - 1.0)
            .collect();
        // Sequences' blocks interleaved, as a shared pool hands them out.
        let tables: Vec<Vec<u32>> = (0..seqs)
            .map(|s| (0..blocks_per_seq).map(|b| (b * seqs + s) as u32).collect())
            .collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; hd];
        let group = heads / kv_heads;
        let mut outs = vec![0f32; group * hd];
        let kernel = time_it(budget, || {
            for t in &tables {
                for kvh in 0..kv_heads {
                    // The engine's layout: per block, each KV head's 16 positions together.
                    let kv = KvHead {
                        k: &kb[kvh * bs * hd..],
                        v: &vb[kvh * bs * hd..],
                        head_dim: hd,
                        block_stride: bs * stride,
                        blocks: t,
                        block_size: bs,
                        format: KvFormat::of(hd, bs),
                    };
                    let q = &q[kvh * group * hd..];
                    attend_rows(&kv, q, group * hd, hd, group, ctx, scale, &mut outs);
                }
            }
        });
        let mut scores = vec![0f32; ctx];
        let calls = time_it(budget, || {
            for t in &tables {
                for h in 0..heads {
                    let qh = &q[h * hd..(h + 1) * hd];
                    let at = |p: usize| (t[p / bs] as usize * bs + p % bs) * stride + h / 3 * hd;
                    let mut max = f32::NEG_INFINITY;
                    for (p, sc) in scores.iter_mut().enumerate() {
                        *sc = dot_f32(qh, &k[at(p)..][..hd]) * scale;
                        max = max.max(*sc);
                    }
                    let mut sum = 0.0;
                    for sc in scores.iter_mut() {
                        *sc = (*sc - max).exp();
                        sum += *sc;
                    }
                    out.fill(0.0);
                    for (p, &w) in scores.iter().enumerate() {
                        axpy(w / sum, &v[at(p)..][..hd], &mut out);
                    }
                }
            }
        });
        println!(
            "attention batch 8, ctx {ctx}, one layer, 1 thread: kernel {:.1} us, per-position calls {:.1} us",
            kernel.as_secs_f64() * 1e6,
            calls.as_secs_f64() * 1e6
        );
    }
}
