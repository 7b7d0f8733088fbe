//! How many KV blocks a rank gets: a fixed number of tokens, or a fraction of the memory left
//! after the weights.

use super::BLOCK_SIZE;
use crate::error::{Error, Result};

/// The user's choice (`--kv-tokens N` or `--mem-fraction F`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBudget {
    Tokens(usize),
    /// Fraction of the memory available when the rank starts (after its weights are mapped).
    MemFraction(f64),
}

/// Bytes of one KV block for `n_layers` layers of width `kv_dim`.
pub fn block_bytes(n_layers: usize, kv_dim: usize) -> usize {
    2 * n_layers * BLOCK_SIZE * kv_dim * std::mem::size_of::<u16>()
}

/// Memory the kernel says is available (`MemAvailable` in /proc/meminfo), in bytes.
pub fn mem_available() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
        Error::InvalidRequest(format!(
            "cannot read /proc/meminfo to size the KV pool: {e}"
        ))
    })?;
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| {
            Error::InvalidRequest("no MemAvailable in /proc/meminfo; use --kv-tokens".into())
        })
}

/// KV blocks for a rank holding `n_layers` layers; `available` is the memory a
/// [`KvBudget::MemFraction`] takes its share of (the backend's: host or GPU memory), asked only
/// then.
pub fn blocks_for(
    budget: KvBudget,
    n_layers: usize,
    kv_dim: usize,
    available: impl FnOnce() -> Result<u64>,
) -> Result<usize> {
    let blocks = match budget {
        KvBudget::Tokens(t) => t.div_ceil(BLOCK_SIZE),
        KvBudget::MemFraction(f) => {
            if !(f > 0.0 && f <= 1.0) {
                return Err(Error::InvalidRequest(format!(
                    "--mem-fraction {f} is not in (0, 1]"
                )));
            }
            (available()? as f64 * f) as usize / block_bytes(n_layers.max(1), kv_dim)
        }
    };
    if blocks == 0 {
        return Err(Error::InvalidRequest(
            "the KV pool would hold no blocks".into(),
        ));
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_by_tokens_and_by_memory() {
        let unasked = || -> Result<u64> { panic!("a token budget needs no memory figure") };
        assert_eq!(
            blocks_for(KvBudget::Tokens(100), 10, 192, unasked).unwrap(),
            7
        );
        // Keys and values, f16.
        assert_eq!(block_bytes(10, 192), 2 * 10 * 16 * 192 * 2);
        let b = blocks_for(KvBudget::MemFraction(0.01), 10, 192, mem_available).unwrap();
        assert!(b > 0 && (b * block_bytes(10, 192)) as u64 <= mem_available().unwrap() / 100 + 1);
        // A GPU with 80 GB free, half of it: 40 GB / 122,880 bytes a block.
        let gpu = || Ok(80_000_000_000);
        assert_eq!(
            blocks_for(KvBudget::MemFraction(0.5), 10, 192, gpu).unwrap(),
            40_000_000_000 / block_bytes(10, 192)
        );
        assert!(blocks_for(KvBudget::MemFraction(1.5), 10, 192, mem_available).is_err());
        assert!(blocks_for(KvBudget::Tokens(0), 10, 192, mem_available).is_err());
    }
}
