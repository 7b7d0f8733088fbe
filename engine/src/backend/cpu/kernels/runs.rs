//! How a product's rows are cut into tasks for the thread pool.

use std::ops::Range;

use super::QMatrix;

/// Rows per unit of a task's run (a lane kernel's tile).
pub(super) const ROW_UNIT: usize = 16;
/// Runs in each thread's share of a product.
pub(super) const RUNS_PER_THREAD: usize = 5;

/// The rows of several matrices laid end to end (each padded to whole units of [`ROW_UNIT`]) and
/// cut into [`RUNS_PER_THREAD`] runs for each thread's share (see the pool): the shares equal,
/// the runs in each halving in length (1/2, 1/4, 1/8, 1/16, 1/16 of it). A thread that finishes
/// its share early (the worker joins a dispatch later than the caller, and cores run unevenly)
/// takes the other's last, short runs: at batch 8 the threads' wait at the end of a product fell
/// from 1.4-1.5 to 0.7-0.8 µs against four equal runs.
pub(super) struct RowRuns {
    /// First unit of each matrix, and the total at the end.
    starts: Vec<usize>,
    /// Rows of each matrix.
    rows: Vec<usize>,
    runs: usize,
}

impl RowRuns {
    pub(super) fn new(ws: &[QMatrix], threads: usize) -> Self {
        let mut starts = vec![0];
        for w in ws {
            starts.push(starts[starts.len() - 1] + w.rows.div_ceil(ROW_UNIT));
        }
        RowRuns {
            rows: ws.iter().map(|w| w.rows).collect(),
            starts,
            runs: threads.max(1) * RUNS_PER_THREAD,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.runs
    }

    /// The first unit of run `k` (`k == len()` gives the end).
    pub(super) fn boundary(&self, k: usize) -> usize {
        let (units, threads) = (self.starts[self.rows.len()], self.runs / RUNS_PER_THREAD);
        let (share, i) = (k / RUNS_PER_THREAD, k % RUNS_PER_THREAD);
        let (s0, s1) = (share * units / threads, (share + 1) * units / threads);
        // Run `i` of the share starts after 1 - 2^-i of it.
        s1 - ((s1 - s0) >> i)
    }

    /// Run `k`'s pieces: (matrix, its rows), in order; none for an empty run.
    pub(super) fn pieces(&self, k: usize) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
        let (u0, u1) = (self.boundary(k), self.boundary(k + 1));
        (0..self.rows.len()).filter_map(move |j| {
            let (s, e) = (self.starts[j].max(u0), self.starts[j + 1].min(u1));
            let first = (s - self.starts[j]) * ROW_UNIT;
            let last = ((e.max(s) - self.starts[j]) * ROW_UNIT).min(self.rows[j]);
            (first < last).then_some((j, first..last))
        })
    }
}
