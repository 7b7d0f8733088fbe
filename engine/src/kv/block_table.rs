//! One sequence's KV blocks.

use super::{BlockPool, BLOCK_SIZE};
use crate::error::Result;

/// The blocks holding one sequence's keys and values, in position order.
#[derive(Debug, Default, Clone)]
pub struct BlockTable {
    blocks: Vec<u32>,
}

impl BlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Token slots this table can hold.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_SIZE
    }

    /// Blocks needed beyond the current ones to hold `n_tokens`.
    pub fn blocks_needed(&self, n_tokens: usize) -> usize {
        n_tokens
            .div_ceil(BLOCK_SIZE)
            .saturating_sub(self.blocks.len())
    }

    /// Grows the table to hold `n_tokens` tokens; on failure nothing is taken.
    pub fn reserve(&mut self, pool: &mut BlockPool, n_tokens: usize) -> Result<()> {
        let need = self.blocks_needed(n_tokens);
        if need > 0 {
            self.blocks.extend(pool.allocate(need)?);
        }
        Ok(())
    }

    /// Gives every block back to the pool.
    pub fn release(&mut self, pool: &mut BlockPool) {
        pool.release(self.blocks.drain(..));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_whole_blocks() {
        let mut pool = BlockPool::new(3);
        let mut t = BlockTable::new();
        t.reserve(&mut pool, 1).unwrap();
        assert_eq!(t.capacity(), BLOCK_SIZE);
        t.reserve(&mut pool, BLOCK_SIZE).unwrap();
        assert_eq!(t.blocks().len(), 1);
        t.reserve(&mut pool, BLOCK_SIZE + 1).unwrap();
        assert_eq!(t.blocks().len(), 2);
        assert!(t.reserve(&mut pool, 4 * BLOCK_SIZE).is_err());
        assert_eq!(t.blocks().len(), 2, "a failed reserve takes nothing");
        t.release(&mut pool);
        assert_eq!(pool.n_free(), 3);
    }
}
