//! Host-side arithmetic of the CUDA backend, tested on any machine: launch shapes, the split-KV
//! choice, decode-graph buckets and padding, KV slots from block tables, and the arena's size.

/// A kernel launch: grid, block, dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

fn shape(grid: (usize, usize, usize), threads: usize) -> Shape {
    let g = |v: usize| u32::try_from(v.max(1)).expect("grid dimension fits u32");
    Shape {
        grid: (g(grid.0), g(grid.1), g(grid.2)),
        block: (threads as u32, 1, 1),
        shared_bytes: 0,
    }
}

/// Activation rows one `matvec_*` launch takes (`MV_MAX_BATCH` in matvec.cu); a prefill runs its
/// rows in launches of this many.
pub const MATVEC_MAX_BATCH: usize = 8;
/// Warps (weight rows) per CTA of `matvec_*` (`MV_WARPS`).
pub const MATVEC_WARPS: usize = 4;
/// Query rows per CTA of `attn_prefill`.
pub const PREFILL_TILE: usize = 16;
/// Positions per KV block (`KV_BLOCK`).
pub const KV_BLOCK: usize = 16;

/// `add_rms_norm_quant`, `swiglu_quant`: a CTA of 256 per row.
pub fn per_row(rows: usize) -> Shape {
    shape((rows, 1, 1), 256)
}

/// `add_f32`, `silu_mul_f32`: a thread per element, 256 per CTA.
pub fn elementwise(n: usize) -> Shape {
    shape((n.div_ceil(256), 1, 1), 256)
}

/// `matvec_q4_1` / `matvec_q8_0` over `rows` weight rows.
pub fn matvec(rows: usize) -> Shape {
    shape((rows.div_ceil(MATVEC_WARPS), 1, 1), 32 * MATVEC_WARPS)
}

/// `rope_kv_store`: a CTA of 128 per row.
pub fn rope_kv(rows: usize) -> Shape {
    shape((rows, 1, 1), 128)
}

/// `attn_decode` for `n_seqs` sequences, the longest `max_len` positions, on a GPU with `sms`
/// multiprocessors: the split length (a multiple of 16 positions, at least 64) chosen so that
/// a lone sequence still fills about two CTAs per multiprocessor. Returns the launch and
/// `(split_len, n_splits)`.
pub fn decode(n_kv: usize, n_seqs: usize, max_len: usize, sms: usize) -> (Shape, usize, usize) {
    let ctas_wanted = 2 * sms;
    let per_split = n_kv * n_seqs;
    let splits_wanted = ctas_wanted.div_ceil(per_split.max(1)).max(1);
    let split_len = max_len
        .div_ceil(splits_wanted)
        .next_multiple_of(KV_BLOCK)
        .max(64);
    let n_splits = max_len.max(1).div_ceil(split_len);
    (shape((n_kv, n_seqs, n_splits), 128), split_len, n_splits)
}

/// `attn_combine`: a CTA per (head, sequence), a thread per dimension.
pub fn combine(n_heads: usize, n_seqs: usize, head_dim: usize) -> Shape {
    shape((n_heads, n_seqs, 1), head_dim)
}

/// `attn_prefill` for chunks of at most `max_rows` query rows.
pub fn prefill(n_heads: usize, max_rows: usize, n_seqs: usize) -> Shape {
    shape((n_heads, max_rows.div_ceil(PREFILL_TILE), n_seqs), 128)
}

/// The decode-graph batch sizes captured by default (the seed deployment's "Graph=4": four).
pub const GRAPH_BUCKETS: [usize; 4] = [1, 2, 4, 8];

/// The captured graph a decode batch of `n` runs in: the smallest bucket that holds it (its
/// extra rows are padding), or none (eager) above the largest or for an empty batch.
pub fn graph_bucket(n: usize, buckets: &[usize]) -> Option<usize> {
    if n == 0 {
        return None;
    }
    buckets.iter().copied().filter(|&b| b >= n).min()
}

/// Per-step inputs padded to a graph's bucket: padding rows repeat the last real row's token
/// and position and point at a scratch KV slot, so they compute harmlessly and write nowhere
/// that matters.
pub fn pad_inputs(
    tokens: &[u32],
    positions: &[u32],
    slots: &[i32],
    bucket: usize,
    scratch_slot: i32,
) -> (Vec<u32>, Vec<u32>, Vec<i32>) {
    assert!(!tokens.is_empty() && tokens.len() <= bucket);
    assert!(tokens.len() == positions.len() && tokens.len() == slots.len());
    let pad = bucket - tokens.len();
    let last = tokens.len() - 1;
    let mut t = tokens.to_vec();
    let mut p = positions.to_vec();
    let mut s = slots.to_vec();
    t.extend(std::iter::repeat_n(tokens[last], pad));
    p.extend(std::iter::repeat_n(positions[last], pad));
    s.extend(std::iter::repeat_n(scratch_slot, pad));
    (t, p, s)
}

/// The cache slot of each position (`table[pos / 16] * 16 + pos % 16`): what `rope_kv_store`
/// writes to and the attention kernels read from.
pub fn kv_slots(table: &[u32], positions: &[u32]) -> Vec<i32> {
    positions
        .iter()
        .map(|&p| {
            let (b, o) = (p as usize / KV_BLOCK, p as usize % KV_BLOCK);
            i32::try_from(table[b] as usize * KV_BLOCK + o).expect("slot fits i32")
        })
        .collect()
}

/// The model's sizes the arena is cut for.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

/// Bytes of the activation arena for steps of at most `max_rows` rows, allocated once (no
/// allocation in the decode loop): x, xn, q, k, v, attention out, gate, up, logits (f32), the
/// Q8_1 activations (i8 + two f32 per 32), and the split-KV partials for `max_seqs` sequences
/// of up to `max_splits` splits.
pub fn arena_bytes(d: Dims, max_rows: usize, max_seqs: usize, max_splits: usize) -> usize {
    let f32s = max_rows
        * (2 * d.hidden
            + (d.n_heads + 2 * d.n_kv) * d.head_dim
            + d.n_heads * d.head_dim
            + 2 * d.ffn
            + d.vocab);
    let widest = d.hidden.max(d.ffn);
    let q8 = max_rows * (widest + widest / 32 * 8);
    let parts = max_seqs * d.n_heads * max_splits * (d.head_dim + 2);
    (f32s + parts) * 4 + q8
}

/// KV tokens a pool in `free_bytes` of device memory holds at `mem_fraction`, for `layers`
/// layers of f16 keys and values, in whole blocks.
pub fn kv_pool_tokens(
    free_bytes: u64,
    mem_fraction: f64,
    layers: usize,
    n_kv: usize,
    head_dim: usize,
) -> usize {
    let per_token = (layers * 2 * n_kv * head_dim * 2) as u64;
    let budget = (free_bytes as f64 * mem_fraction.clamp(0.0, 1.0)) as u64;
    let tokens = (budget / per_token.max(1)) as usize;
    tokens / KV_BLOCK * KV_BLOCK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_batches_pick_the_smallest_bucket_that_holds_them() {
        let b = GRAPH_BUCKETS;
        let picks: Vec<_> = (0..=10).map(|n| graph_bucket(n, &b)).collect();
        assert_eq!(
            picks,
            [
                None,
                Some(1),
                Some(2),
                Some(4),
                Some(4),
                Some(8),
                Some(8),
                Some(8),
                Some(8),
                None,
                None
            ]
        );
        assert_eq!(
            graph_bucket(3, &[8, 2, 4]),
            Some(4),
            "order of the buckets does not matter"
        );
    }

    #[test]
    fn padding_repeats_the_last_row_into_a_scratch_slot() {
        let (t, p, s) = pad_inputs(&[5, 6, 7], &[10, 3, 40], &[160, 48, 640], 4, 9999);
        assert_eq!(t, [5, 6, 7, 7]);
        assert_eq!(p, [10, 3, 40, 40]);
        assert_eq!(s, [160, 48, 640, 9999]);
        let (t, _, _) = pad_inputs(&[1], &[0], &[0], 1, 9);
        assert_eq!(t, [1]);
    }

    #[test]
    fn kv_slots_follow_the_block_table() {
        // Logical blocks 0, 1, 2 live in physical blocks 7, 2, 30.
        let table = [7, 2, 30];
        assert_eq!(
            kv_slots(&table, &[0, 15, 16, 17, 47]),
            [112, 127, 32, 33, 495]
        );
    }

    #[test]
    fn a_lone_long_sequence_is_split_to_fill_the_gpu_and_short_ones_are_not() {
        // H200: 132 SMs; SmolLM2-135M: 3 kv heads.
        let (s, split_len, n) = decode(3, 1, 8192, 132);
        assert_eq!((split_len, n), (96, 86));
        assert_eq!(s.grid, (3, 1, 86));
        assert!(3 * n * 10 >= 19 * 132, "about two CTAs per SM");
        let (_, split_len, n) = decode(3, 64, 100, 132);
        assert_eq!((split_len, n), (64, 2), "at least 64 positions per split");
        let (_, _, n) = decode(3, 1, 0, 132);
        assert_eq!(n, 1, "an empty sequence still has one split to write");
        for len in [1, 63, 64, 65, 1000, 4096, 12288] {
            let (_, split_len, n) = decode(3, 1, len, 132);
            assert!(
                split_len.is_multiple_of(16)
                    && split_len * n >= len
                    && split_len * (n - 1) < len.max(1)
            );
        }
    }

    #[test]
    fn launch_shapes_cover_every_row() {
        assert_eq!(matvec(576).grid.0 * 4, 576);
        assert_eq!(matvec(577).grid.0, 145);
        assert_eq!(matvec(49152).block, (128, 1, 1));
        assert_eq!(per_row(8).grid, (8, 1, 1));
        assert_eq!(prefill(9, 8192, 1).grid, (9, 512, 1));
        assert_eq!(prefill(9, 17, 2).grid, (9, 2, 2));
        assert_eq!(combine(9, 4, 64).block, (64, 1, 1));
        assert_eq!(
            rope_kv(0).grid,
            (1, 1, 1),
            "an empty launch is still a valid shape"
        );
    }

    #[test]
    fn the_arena_and_pool_are_sized_from_the_model() {
        let smol = Dims {
            hidden: 576,
            ffn: 1536,
            n_heads: 9,
            n_kv: 3,
            head_dim: 64,
            vocab: 49152,
        };
        // One decode row: 2*576 + 15*64 + 9*64 + 2*1536 + 49152 = 54912 f32; the Q8_1 row of
        // 1536 is 1536 + 48*8 bytes; partials 9*(64+2) f32 per split.
        assert_eq!(arena_bytes(smol, 1, 1, 1), 54912 * 4 + 1920 + 9 * 66 * 4);
        assert_eq!(
            arena_bytes(smol, 8, 8, 4),
            8 * 54912 * 4 + 8 * 1920 + 8 * 9 * 4 * 66 * 4
        );
        // 30 layers * 2 * 3 * 64 * 2 bytes = 23040 bytes per token.
        assert_eq!(kv_pool_tokens(23_040 * 1000, 1.0, 30, 3, 64), 992);
        assert_eq!(kv_pool_tokens(23_040 * 1000, 0.5, 30, 3, 64), 496);
        assert_eq!(kv_pool_tokens(100, 0.9, 30, 3, 64), 0);
    }
}
