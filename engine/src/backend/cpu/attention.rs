//! Causal grouped-query attention over the paged KV cache, on the thread pool.

use std::sync::Mutex;

use super::kernels::{attend_rows, KvFormat, KvHead};
use super::pool::ThreadPool;
use crate::backend::AttnShape;
use crate::kv::{SeqRows, BLOCK_SIZE};

/// Query rows per task: small enough to balance two threads on a prefill, large enough to
/// amortize the task.
const ROWS_PER_TASK: usize = 16;

/// One unit of work: some query rows of one sequence, `n_heads` query heads from `head`
/// (sharing one KV head).
#[derive(Clone, Copy)]
struct Task {
    seq: usize,
    row0: usize,
    n_rows: usize,
    head: usize,
    n_heads: usize,
}

/// Where one layer's keys and values lie in a paged cache (of f16 bits in the [`KvFormat::F16`]
/// layout described here; [`KvFormat::Bf16Tiles`] has its own within each head's run): KV head
/// `h`'s element `d` of position `i` of block `b` at `b * block + h * head + d * BLOCK_SIZE + i`
/// from `keys` (keys transposed within a block, see [`KvHead`]), at `b * block + h * head + i *
/// head_dim + d` from `values`. A head's block is one contiguous run.
#[derive(Clone, Copy, Debug)]
pub struct LayerKv<'a> {
    pub cache: &'a [u16],
    pub keys: usize,
    pub values: usize,
    /// Elements from one KV head to the next within a block.
    pub head: usize,
    /// Elements from one block to the next.
    pub block: usize,
    /// How each head's block holds its keys and values.
    pub format: KvFormat,
}

/// `out[row, head] = softmax(q·Kᵀ / √d) · V` over positions `0..=pos(row)` of the row's sequence;
/// query head `h` reads KV head `h / (n_heads / n_kv_heads)`. Keys and values of the batch must
/// already be in the cache.
pub fn attend(
    pool: &ThreadPool,
    shape: AttnShape,
    seqs: &[SeqRows<'_>],
    q: &[f32],
    kv: LayerKv<'_>,
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim,
    } = shape;
    let q_width = n_heads * head_dim;
    let group = n_heads / n_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();

    // The query heads of one KV head go together: they share every key and value load (at a
    // long context, decode attention streams the keys and values from memory), and the tiled
    // kernel scores them in independent chains (one query alone is one chain of FMAs a key
    // block, bound by the FMA's latency). That beats balancing the threads: after 4,096 tokens
    // of context, batch 2 on 2 threads decodes at 99.9 tok/s as 6 tasks of 3 heads against 83.4
    // as 18 tasks of one head, and batch 1 at 64.1 against 58.7 (Zen 3, medians of 3 and 6
    // rounds). Heads go alone only when there are fewer groups than threads.
    let row_chunks: usize = seqs.iter().map(|s| s.len.div_ceil(ROWS_PER_TASK)).sum();
    let per_task = if row_chunks * n_kv_heads >= pool.n_threads() {
        group
    } else {
        1
    };
    // A sequence's tasks go head by head: a thread then walks one KV head's keys and values
    // from task to task, which stay in its L2 (at 4,096 tokens, 1 MiB a head at `amx`), instead
    // of all three heads' in turn (pp4096 2.50–2.54 s against 2.63–2.67, pp8192 6.60–6.99
    // against 7.06–7.15, model 167, amx).
    let mut tasks = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        for head in (0..n_heads).step_by(per_task) {
            for row0 in (0..s.len).step_by(ROWS_PER_TASK) {
                tasks.push(Task {
                    seq: si,
                    row0,
                    n_rows: ROWS_PER_TASK.min(s.len - row0),
                    head,
                    n_heads: per_task,
                });
            }
        }
    }
    let size = |t: &Task| t.n_rows * t.n_heads * head_dim;
    let mut buf = vec![0.0; tasks.iter().map(size).sum()];
    let mut results: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(tasks.len());
    let mut rest = &mut buf[..];
    for t in &tasks {
        let (mine, more) = rest.split_at_mut(size(t));
        results.push(Mutex::new(mine));
        rest = more;
    }

    pool.run(tasks.len(), &|ti| {
        let t = tasks[ti];
        let s = &seqs[t.seq];
        let head = (t.head / group) * kv.head;
        let kv = KvHead {
            k: &kv.cache[kv.keys + head..],
            v: &kv.cache[kv.values + head..],
            head_dim,
            block_stride: kv.block,
            blocks: s.blocks,
            block_size: BLOCK_SIZE,
            format: kv.format,
        };
        let mut res = results[ti].lock().unwrap_or_else(|e| e.into_inner());
        let row = s.start + t.row0;
        attend_rows(
            &kv,
            &q[row * q_width + t.head * head_dim..],
            q_width,
            head_dim,
            t.n_heads,
            s.pos + t.row0 + 1,
            scale,
            &mut res,
        );
    });

    for (t, res) in tasks.iter().zip(results) {
        let res = res.into_inner().unwrap_or_else(|e| e.into_inner());
        let row0 = seqs[t.seq].start + t.row0;
        let width = t.n_heads * head_dim;
        for (r, res) in res.chunks_exact(width).enumerate() {
            out[(row0 + r) * q_width + t.head * head_dim..][..width].copy_from_slice(res);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CpuBackend, CpuKv};
    use super::*;
    use crate::backend::Backend;
    use crate::generate::Rng;
    use crate::kv::{KvSpec, BLOCK_SIZE};

    /// Dense reference: one sequence, contiguous positions.
    fn reference(shape: AttnShape, n: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let AttnShape {
            n_heads,
            n_kv_heads,
            head_dim: d,
        } = shape;
        let g = n_heads / n_kv_heads;
        let mut out = vec![0.0; n * n_heads * d];
        for i in 0..n {
            for h in 0..n_heads {
                let kvh = h / g;
                let qv = &q[i * n_heads * d + h * d..][..d];
                let s: Vec<f32> = (0..=i)
                    .map(|j| {
                        qv.iter()
                            .zip(&k[j * n_kv_heads * d + kvh * d..][..d])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            / (d as f32).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for t in 0..d {
                        out[i * n_heads * d + h * d + t] +=
                            w / z * v[j * n_kv_heads * d + kvh * d + t];
                    }
                }
            }
        }
        out
    }

    /// A one-layer KV cache of `n_blocks` blocks, as the backend lays it out and stores it.
    fn cache(shape: AttnShape, n_blocks: usize) -> CpuKv {
        layers(shape, 1, n_blocks)
    }

    /// A KV cache of `n_layers` layers of `n_blocks` blocks.
    fn layers(shape: AttnShape, n_layers: usize, n_blocks: usize) -> CpuKv {
        let spec = KvSpec {
            n_layers,
            n_blocks,
            kv_dim: shape.n_kv_heads * shape.head_dim,
            head_dim: shape.head_dim,
        };
        CpuBackend::new(1).alloc_kv(spec).expect("mapped")
    }

    /// Values an f16 cache holds exactly.
    fn f16_exact(v: Vec<f32>) -> Vec<f32> {
        v.into_iter()
            .map(|x| half::f16::from_f32(x).to_f32())
            .collect()
    }

    #[test]
    fn paged_attention_matches_dense_reference() {
        let shape = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 8,
        };
        let n = 37; // spans three blocks, the last partial
        let kv_dim = 16;
        let mut rng = Rng::new(7);
        let mut rnd = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.next_f32() - 0.5).collect() };
        let q = rnd(n * 32);
        let (k, v) = (f16_exact(rnd(n * kv_dim)), f16_exact(rnd(n * kv_dim)));
        // Scatter keys/values into non-contiguous blocks 5, 1, 3.
        let blocks = [5u32, 1, 3];
        let mut cache = cache(shape, 6);
        let seq = SeqRows {
            start: 0,
            len: n,
            pos: 0,
            blocks: &blocks,
        };
        cache.store(0, &[seq], &k, &v);
        let want = reference(shape, n, &q, &k, &v);
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let mut out = vec![0.0; n * 32];
            attend(&pool, shape, &[seq], &q, cache.layer(0), &mut out);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
            // The last row alone, as a decode step at position n-1, gives the same answer.
            let last = SeqRows {
                start: 0,
                len: 1,
                pos: n - 1,
                blocks: &blocks,
            };
            let mut one = vec![0.0; 32];
            let q_last = &q[(n - 1) * 32..];
            attend(&pool, shape, &[last], q_last, cache.layer(0), &mut one);
            for (a, b) in one.iter().zip(&want[(n - 1) * 32..]) {
                assert!((a - b).abs() < 1e-5);
            }
        }
    }

    /// Every layer, head and block has its own place: after all three layers are stored (their
    /// blocks out of order, the last one the pool's last), each layer attends to its own keys and
    /// values.
    #[test]
    fn layers_heads_and_blocks_keep_their_own_places() {
        let shape = AttnShape {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 32,
        };
        let (n, n_layers, kv_dim, q_width) = (40, 3, 64, 128);
        let mut rng = Rng::new(23);
        let mut rnd = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.next_f32() - 0.5).collect() };
        let blocks = [4u32, 0, 6];
        let mut cache = layers(shape, n_layers, 7);
        let seq = SeqRows {
            start: 0,
            len: n,
            pos: 0,
            blocks: &blocks,
        };
        let data: Vec<(Vec<f32>, Vec<f32>)> = (0..n_layers)
            .map(|_| (f16_exact(rnd(n * kv_dim)), f16_exact(rnd(n * kv_dim))))
            .collect();
        for (layer, (k, v)) in data.iter().enumerate() {
            cache.store(layer, &[seq], k, v);
        }
        let q = rnd(n * q_width);
        let pool = ThreadPool::new(2);
        for (layer, (k, v)) in data.iter().enumerate() {
            let want = reference(shape, n, &q, k, v);
            let mut out = vec![0.0; n * q_width];
            attend(&pool, shape, &[seq], &q, cache.layer(layer), &mut out);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 2e-3, "layer {layer}: {a} vs {b}");
            }
        }
    }

    /// A sequence's decode step gives the same bits alone as in a batch (where query heads are
    /// grouped differently into tasks).
    #[test]
    fn batched_sequences_match_each_alone() {
        let shape = AttnShape {
            n_heads: 9,
            n_kv_heads: 3,
            head_dim: 64,
        };
        let (q_width, kv_dim) = (9 * 64, 3 * 64);
        let mut rng = Rng::new(11);
        let mut rnd = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.next_f32() - 0.5).collect() };
        let mut cache = cache(shape, 12);
        let every: Vec<u32> = (0..12).collect();
        let all_slots = SeqRows {
            start: 0,
            len: 12 * BLOCK_SIZE,
            pos: 0,
            blocks: &every,
        };
        let (k, v) = (rnd(12 * BLOCK_SIZE * kv_dim), rnd(12 * BLOCK_SIZE * kv_dim));
        cache.store(0, &[all_slots], &k, &v);
        let tables: [&[u32]; 4] = [&[3, 0], &[7], &[1, 9, 4], &[11, 2, 5, 6]];
        let positions = [20, 9, 40, 51];
        let q = rnd(4 * q_width);
        let seqs: Vec<SeqRows> = (0..4)
            .map(|i| SeqRows {
                start: i,
                len: 1,
                pos: positions[i],
                blocks: tables[i],
            })
            .collect();
        let pool = ThreadPool::new(2);
        let mut all = vec![0.0; 4 * q_width];
        attend(&pool, shape, &seqs, &q, cache.layer(0), &mut all);
        for (i, seq) in seqs.iter().enumerate() {
            let alone = SeqRows { start: 0, ..*seq };
            let mut one = vec![0.0; q_width];
            let qi = &q[i * q_width..(i + 1) * q_width];
            attend(&pool, shape, &[alone], qi, cache.layer(0), &mut one);
            let want = &all[i * q_width..(i + 1) * q_width];
            assert!(one
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
