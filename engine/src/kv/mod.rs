//! The paged KV cache: fixed-size blocks of token slots, handed out by a [`BlockPool`] and
//! addressed per sequence through a [`BlockTable`], as in vLLM's paged attention. Attention
//! reads keys and values only through block tables, so sequences never need contiguous memory.

mod block_pool;
mod block_table;
pub mod sizing;

pub use block_pool::BlockPool;
pub use block_table::BlockTable;

/// Token slots per KV block.
pub const BLOCK_SIZE: usize = 16;

/// The size of one KV store: `n_blocks` blocks of [`BLOCK_SIZE`] slots, for `n_layers` layers,
/// each slot holding `kv_dim` keys and `kv_dim` values, in KV heads of `head_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub n_layers: usize,
    pub n_blocks: usize,
    pub kv_dim: usize,
    pub head_dim: usize,
}

impl KvSpec {
    /// Bytes of f16 keys and values this spec takes.
    pub fn bytes(&self) -> usize {
        self.n_blocks * sizing::block_bytes(self.n_layers, self.kv_dim)
    }
}

/// One sequence's rows in a forward batch.
///
/// Rows `start..start + len` of the batch are this sequence's tokens at positions
/// `pos..pos + len`; its keys and values live in the blocks of `blocks` (which must cover
/// positions up to `pos + len`).
#[derive(Clone, Copy, Debug)]
pub struct SeqRows<'a> {
    pub start: usize,
    pub len: usize,
    pub pos: usize,
    pub blocks: &'a [u32],
}

impl SeqRows<'_> {
    /// The cache slot of position `p` of this sequence.
    pub fn slot(&self, p: usize) -> usize {
        self.blocks[p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE
    }
}
