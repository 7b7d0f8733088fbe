//! Decode graphs, host side: which captured graph a decode step replays, how its batch is padded,
//! what a capture is keyed by and when it is captured again, and the staging area the per-step
//! inputs go through. Pure Rust, tested on any machine; `backend` (feature `cuda`) drives it.
//!
//! A decode step (every sequence one new row) of `n` sequences runs in the graph of the smallest
//! bucket `b >= n`, its batch padded with `b - n` sequences that have no block table (the backend
//! points them at a scratch KV block, so they write nowhere that matters). What the graph bakes
//! in is its [`StepShape`] (bucket and block-table width) and every pointer and scalar of its
//! launches (their [`Fingerprint`]); what changes from step to step (positions, KV slots, block
//! tables, lengths) is staged into one device buffer copied before the launch. A step is replayed
//! when a graph of its shape exists and recording its operations gives the same fingerprint;
//! otherwise it runs eagerly and is captured for the next one (so a new table width, a batch in a
//! new bucket, or buffers reallocated by a longer prefill each cost one capture).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::kv::SeqRows;

/// The decode-graph batch sizes captured by default (the seed deployment's "Graph=4": four).
pub const DEFAULT_BUCKETS: [usize; 4] = [1, 2, 4, 8];

/// The environment variable that configures decode graphs: `off` (or `0`, `false`), `on` (the
/// default buckets), or a comma-separated list of batch sizes.
pub const GRAPHS_ENV: &str = "SLUICE_CUDA_GRAPHS";

/// Graphs kept per backend (the least recently used beyond this are dropped).
pub const MAX_GRAPHS: usize = 32;

/// Which decode batches are captured: none when `buckets` is empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphConfig {
    pub buckets: Vec<usize>,
}

impl Default for GraphConfig {
    fn default() -> Self {
        Self {
            buckets: DEFAULT_BUCKETS.to_vec(),
        }
    }
}

impl GraphConfig {
    /// The configuration [`GRAPHS_ENV`] names (unset: the default buckets).
    pub fn from_env() -> Result<Self, String> {
        Self::parse(std::env::var(GRAPHS_ENV).ok().as_deref())
    }

    /// Parses a [`GRAPHS_ENV`] value; anything else is an error naming it, never ignored.
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        let Some(v) = value.map(str::trim) else {
            return Ok(Self::default());
        };
        match v.to_ascii_lowercase().as_str() {
            "" | "on" | "true" => return Ok(Self::default()),
            "off" | "0" | "false" | "none" => return Ok(Self { buckets: vec![] }),
            _ => {}
        }
        let mut buckets = v
            .split(',')
            .map(|p| match p.trim().parse::<usize>() {
                Ok(b) if b > 0 => Ok(b),
                _ => Err(format!(
                    "{GRAPHS_ENV}={v:?}: {p:?} is not a batch size (expected off, on, or a list \
                     such as 1,2,4,8)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        buckets.sort_unstable();
        buckets.dedup();
        Ok(Self { buckets })
    }

    pub fn enabled(&self) -> bool {
        !self.buckets.is_empty()
    }

    /// The captured graph a decode batch of `n` runs in: the smallest bucket that holds it (its
    /// extra rows are padding), or none (eager) above the largest or for an empty batch.
    pub fn bucket(&self, n: usize) -> Option<usize> {
        if n == 0 {
            return None;
        }
        self.buckets.iter().copied().filter(|&b| b >= n).min()
    }

    /// The shape a step of `seqs` over `rows` rows is replayed in, if it is a decode step (every
    /// sequence one row) that a bucket holds.
    pub fn decode_shape(&self, seqs: &[SeqRows<'_>], rows: usize) -> Option<StepShape> {
        if seqs.len() != rows || seqs.iter().any(|s| s.len != 1) {
            return None;
        }
        let bucket = self.bucket(rows)?;
        let blocks = seqs.iter().map(|s| s.blocks.len()).max().unwrap_or(1);
        Some(StepShape {
            bucket,
            table_width: table_width(blocks),
        })
    }
}

/// What a captured graph is specialized to besides its pointers: the padded batch and the width
/// of the block tables (which sets the attention's split plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepShape {
    pub bucket: usize,
    pub table_width: usize,
}

/// Block-table entries per sequence in a step whose longest table has `max_blocks`: rounded up
/// to a power of two, so a growing sequence changes it (and is captured again) only when its
/// length doubles. Eager steps use it too, so both run the same split plan (the same rounding).
pub fn table_width(max_blocks: usize) -> usize {
    max_blocks.max(1).next_power_of_two()
}

/// `seqs` padded to `bucket` sequences: the extra ones are one row each at position 0 with no
/// block table (the backend gives them its scratch block).
pub fn padded<'a>(seqs: &[SeqRows<'a>], bucket: usize) -> Vec<SeqRows<'a>> {
    assert!(seqs.len() <= bucket, "a bucket holds its batch");
    let rows: usize = seqs.iter().map(|s| s.len).sum();
    let mut out = seqs.to_vec();
    out.extend((0..bucket - seqs.len()).map(|j| SeqRows {
        start: rows + j,
        len: 1,
        pos: 0,
        blocks: &[],
    }));
    out
}

/// Whether a sequence of a padded batch is padding.
pub fn is_padding(s: &SeqRows<'_>) -> bool {
    s.blocks.is_empty()
}

/// The i32 inputs a recorded step stages, laid out in one buffer: each call appends its array,
/// unless it repeats the array its tag staged last (positions, slots and tables are the same in
/// every layer, so a step stages each once).
#[derive(Debug, Default)]
pub struct Staging {
    pub data: Vec<i32>,
    last: HashMap<u8, (usize, usize)>,
}

impl Staging {
    pub fn clear(&mut self) {
        self.data.clear();
        self.last.clear();
    }

    /// The offset (in i32s) at which `values` are staged under `tag`.
    pub fn stage(&mut self, tag: u8, values: &[i32]) -> usize {
        if let Some(&(off, len)) = self.last.get(&tag) {
            if self.data[off..off + len] == *values {
                return off;
            }
        }
        let off = self.data.len();
        self.data.extend_from_slice(values);
        self.last.insert(tag, (off, values.len()));
        off
    }
}

/// i32s a decode step of `bucket` sequences with tables `table_width` wide can stage: per row
/// its position, zero slot, KV slot, query row and length, and the tables twice (the store's and
/// the decode attention's), with room for arrays that change between layers.
pub fn staging_capacity(bucket: usize, table_width: usize) -> usize {
    (8 * bucket + 2 * bucket * table_width + 64).next_power_of_two()
}

/// A hash of a step's launches: kernel names, shapes, every argument (pointers included).
#[derive(Debug, Default)]
pub struct Fingerprint(std::collections::hash_map::DefaultHasher);

impl Fingerprint {
    pub fn launch(&mut self, name: &str, shape: impl Hash, args: impl Hash) {
        name.hash(&mut self.0);
        shape.hash(&mut self.0);
        args.hash(&mut self.0);
    }

    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// What a step does with the graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No graph for this step: run it eagerly.
    Eager,
    /// A graph of this shape exists: record the step and replay it if the fingerprint matches.
    Replay,
    /// Run eagerly, then capture the step for the next time.
    Capture,
}

/// Counters of what the steps did (logged, and written by the GPU check).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    pub replays: u64,
    pub captures: u64,
    /// Replays refused because the step's launches differed from the capture's.
    pub mismatches: u64,
    pub failures: u64,
    pub eager: u64,
}

struct Captured<G> {
    fingerprint: u64,
    graph: G,
    used: u64,
}

/// The captured graphs of one backend, by shape, and the shapes whose capture failed (they run
/// eagerly from then on).
pub struct GraphSet<G> {
    graphs: HashMap<StepShape, Captured<G>>,
    failed: HashMap<StepShape, String>,
    clock: u64,
    pub stats: GraphStats,
}

impl<G> Default for GraphSet<G> {
    fn default() -> Self {
        Self {
            graphs: HashMap::new(),
            failed: HashMap::new(),
            clock: 0,
            stats: GraphStats::default(),
        }
    }
}

impl<G> std::fmt::Debug for GraphSet<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphSet")
            .field("graphs", &self.graphs.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<G> GraphSet<G> {
    /// What a step of `shape` does.
    pub fn plan(&self, shape: StepShape) -> Plan {
        if self.failed.contains_key(&shape) {
            Plan::Eager
        } else if self.graphs.contains_key(&shape) {
            Plan::Replay
        } else {
            Plan::Capture
        }
    }

    /// The graph to launch for a recorded step, if its fingerprint is the capture's; a mismatch
    /// drops the graph (the step then runs eagerly and is captured again).
    pub fn replay(&mut self, shape: StepShape, fingerprint: u64) -> Option<&G> {
        self.clock += 1;
        let matches = self
            .graphs
            .get(&shape)
            .is_some_and(|c| c.fingerprint == fingerprint);
        if !matches {
            self.stats.mismatches += 1;
            self.graphs.remove(&shape);
            return None;
        }
        self.stats.replays += 1;
        let c = self.graphs.get_mut(&shape).expect("matched");
        c.used = self.clock;
        Some(&c.graph)
    }

    /// Keeps a new capture (dropping the least recently used beyond [`MAX_GRAPHS`]).
    pub fn insert(&mut self, shape: StepShape, fingerprint: u64, graph: G) {
        self.clock += 1;
        self.stats.captures += 1;
        if self.graphs.len() >= MAX_GRAPHS && !self.graphs.contains_key(&shape) {
            if let Some(&old) = self
                .graphs
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(s, _)| s)
            {
                self.graphs.remove(&old);
            }
        }
        self.graphs.insert(
            shape,
            Captured {
                fingerprint,
                graph,
                used: self.clock,
            },
        );
    }

    /// Records a failed capture: the shape runs eagerly from now on. Returns whether this is the
    /// shape's first failure (the one to log).
    pub fn fail(&mut self, shape: StepShape, why: String) -> bool {
        self.stats.failures += 1;
        self.graphs.remove(&shape);
        self.failed.insert(shape, why).is_none()
    }

    pub fn len(&self) -> usize {
        self.graphs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }
}

#[cfg(test)]
mod tests;
