//! Host-side arithmetic of the CUDA backend, tested on any machine: launch shapes, the split-KV
//! choice, the attention's inputs from block tables (KV slots, tables, lengths), and the arena's
//! size. Decode-graph buckets and padding are in [`super::graphs`]; the KV pool's size is
//! `kv::sizing::blocks_for` with the GPU's free memory (`Backend::memory_available`).

use crate::kv::SeqRows;

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

/// What the attention kernels read for one step, from the batch's block tables: every row's
/// KV slot (where `rope_kv_store` writes its key and value), the tables `width` entries per
/// sequence (the rest block 0, never read: the kernels stop at each sequence's length), and for
/// the decode sequences (one row each) their indices, query rows, lengths and tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttnInputs {
    pub slots: Vec<i32>,
    pub width: usize,
    pub tables: Vec<i32>,
    pub decode: Vec<usize>,
    pub q_rows: Vec<i32>,
    pub lens: Vec<i32>,
    pub decode_tables: Vec<i32>,
}

/// The [`AttnInputs`] of `seqs`; a padding sequence (no table, `graphs::padded`) reads and
/// writes the scratch block `pad_block` only.
pub fn attention_inputs(seqs: &[SeqRows<'_>], pad_block: u32) -> AttnInputs {
    let table = |s: &SeqRows<'_>, j: usize| -> u32 {
        if s.blocks.is_empty() {
            if j == 0 {
                pad_block
            } else {
                0
            }
        } else {
            s.blocks.get(j).copied().unwrap_or(0)
        }
    };
    let slot_of = |s: &SeqRows<'_>, p: usize| -> i32 {
        let b = table(s, p / KV_BLOCK) as usize;
        i32::try_from(b * KV_BLOCK + p % KV_BLOCK).expect("slot fits i32")
    };
    let rows = seqs.iter().map(|s| s.start + s.len).max().unwrap_or(0);
    let mut slots = vec![0i32; rows];
    for s in seqs {
        for r in 0..s.len {
            slots[s.start + r] = slot_of(s, s.pos + r);
        }
    }
    let width = super::graphs::table_width(seqs.iter().map(|s| s.blocks.len()).max().unwrap_or(1));
    let tables: Vec<i32> = seqs
        .iter()
        .flat_map(|s| (0..width).map(move |j| table(s, j) as i32))
        .collect();
    let decode: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].len == 1).collect();
    AttnInputs {
        q_rows: decode.iter().map(|&i| seqs[i].start as i32).collect(),
        lens: decode.iter().map(|&i| (seqs[i].pos + 1) as i32).collect(),
        decode_tables: decode
            .iter()
            .flat_map(|&i| tables[i * width..(i + 1) * width].iter().copied())
            .collect(),
        slots,
        width,
        tables,
        decode,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn attention_reads_the_block_tables_padded_to_a_power_of_two() {
        // A decode row at position 17 (blocks 7, 2), a 3-row prefill chunk at 0 (block 30), and
        // one padding sequence (graphs::padded) on scratch block 99.
        let (a, b) = ([7u32, 2], [30u32]);
        let seqs = [
            SeqRows {
                start: 0,
                len: 1,
                pos: 17,
                blocks: &a,
            },
            SeqRows {
                start: 1,
                len: 3,
                pos: 0,
                blocks: &b,
            },
            SeqRows {
                start: 4,
                len: 1,
                pos: 0,
                blocks: &[],
            },
        ];
        let got = attention_inputs(&seqs, 99);
        assert_eq!(got.slots, [33, 480, 481, 482, 1584]);
        assert_eq!(got.width, 2);
        assert_eq!(got.tables, [7, 2, 30, 0, 99, 0]);
        assert_eq!(got.decode, [0, 2]);
        assert_eq!(got.q_rows, [0, 4]);
        assert_eq!(got.lens, [18, 1]);
        assert_eq!(got.decode_tables, [7, 2, 99, 0]);
        let three = [1u32, 2, 3];
        let wide = [SeqRows {
            start: 0,
            len: 1,
            pos: 40,
            blocks: &three,
        }];
        let got = attention_inputs(&wide, 0);
        assert_eq!(
            (got.width, got.tables),
            (4, vec![1, 2, 3, 0]),
            "3 blocks -> 4 wide"
        );
        assert_eq!(got.slots, [3 * 16 + 8]);
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
    fn the_arena_is_sized_from_the_model() {
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
    }
}
