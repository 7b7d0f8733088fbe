//! One row on one target: build its requests, run its workload, aggregate. Every subcommand
//! (`run`, `bench`, `matrix`, `calibrate`) measures through this.

use crate::error::Result;
use crate::progress::Progress;
use crate::report::Entry;
use crate::scenario::{JobContext, Row};
use crate::stats::ScenarioStats;
use crate::workload::{self, Target};

/// Runs `row` against `target` (named `name` in reports); `base` numbers its requests, so that
/// rows of one run never share a prompt while targets of one row get the same ones.
pub async fn measure(
    row: &Row,
    name: &str,
    target: &Target,
    ctx: &JobContext,
    base: u64,
    progress: bool,
) -> Result<Entry> {
    let bar = if progress {
        Progress::new(&format!("{} @ {name}", row.id), row.bound.requests)
    } else {
        Progress::hidden()
    };
    let jobs = row.jobs(ctx, base);
    let run = workload::run(
        &row.workload,
        &row.bound,
        target,
        jobs,
        ctx.seed ^ base,
        &bar,
    )
    .await?;
    Ok(Entry {
        target: name.to_owned(),
        id: row.id.clone(),
        title: row.title.clone(),
        series: row.series.clone(),
        workload: row.workload,
        stats: ScenarioStats::of(&run),
        run,
    })
}
