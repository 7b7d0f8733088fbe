//! A pool of KV blocks with O(1) allocation and release.

use crate::error::{Error, Result};

/// Hands out KV block ids `0..n_blocks`, each allocation in ascending order: from a fresh pool
/// the lowest first, one after the other; freed blocks are the first handed out again, in the
/// order they were freed in. So a sequence's blocks mostly come in runs of consecutive ids, which
/// the CPU backend's cache lays out one after the other for each head (`CpuKv`).
#[derive(Debug, Clone)]
pub struct BlockPool {
    free: Vec<u32>,
    n_blocks: usize,
}

impl BlockPool {
    pub fn new(n_blocks: usize) -> Self {
        Self {
            free: (0..n_blocks as u32).rev().collect(),
            n_blocks,
        }
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Takes `n` blocks, or none at all if fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<u32>> {
        if n > self.free.len() {
            return Err(Error::OutOfKvBlocks {
                needed: n,
                free: self.free.len(),
            });
        }
        let at = self.free.len() - n;
        let mut taken = self.free.split_off(at);
        // The free list's top is its end.
        taken.reverse();
        Ok(taken)
    }

    /// Returns blocks to the pool; the next allocation takes the first of them first.
    pub fn release(&mut self, blocks: impl IntoIterator<Item = u32>) {
        let at = self.free.len();
        for b in blocks {
            debug_assert!(
                (b as usize) < self.n_blocks && !self.free.contains(&b),
                "double free of block {b}"
            );
            self.free.push(b);
        }
        // The free list's top is its end: the first of them on top.
        self.free[at..].reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_all_or_nothing_and_recycles() {
        let mut pool = BlockPool::new(4);
        let a = pool.allocate(3).unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(pool.n_free(), 1);
        assert!(matches!(
            pool.allocate(2),
            Err(Error::OutOfKvBlocks { needed: 2, free: 1 })
        ));
        assert_eq!(pool.n_free(), 1, "a failed allocation takes nothing");
        pool.release(a);
        assert_eq!(pool.n_free(), 4);
        let mut all = pool.allocate(4).unwrap();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }

    #[test]
    fn hands_out_ascending_runs() {
        let mut pool = BlockPool::new(8);
        assert_eq!(pool.allocate(3).unwrap(), vec![0, 1, 2]);
        let b = pool.allocate(2).unwrap();
        assert_eq!(b, vec![3, 4]);
        pool.release(b);
        assert_eq!(pool.allocate(1).unwrap(), vec![3], "the freed run first");
        assert_eq!(pool.allocate(3).unwrap(), vec![4, 5, 6]);
    }
}
