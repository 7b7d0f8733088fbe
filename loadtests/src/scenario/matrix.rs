//! The deployment's capacity matrix as data: each row's requests, pacing and size, scaled.

use std::sync::Arc;
use std::time::Duration;

use super::{JobSource, JsonJobs, MixJobs, NeedleJobs, ShapeJobs, ToolJobs};
use crate::prompts::{PromptSource, Shape};
use crate::workload::{Arrivals, Bound, Workload};

/// What a row's requests are.
#[derive(Debug, Clone, PartialEq)]
pub enum RowKind {
    /// Fresh prompts of one shape.
    Shape(Shape),
    /// One prompt of this shape, sent again and again.
    Repeat(Shape),
    /// A `haystack`-token document with a code at each of `depths`.
    Needle { haystack: usize, depths: Vec<f64> },
    /// A `context`-token document, then a required function call (`constrained`; else the
    /// same text without tools).
    Tools { context: usize, constrained: bool },
    /// Short requests for JSON that matches a schema (`constrained`; else the same prompts
    /// without `response_format`).
    Json { constrained: bool },
    /// Poisson arrivals of mixed requests: 60% 256:128, 30% 1k:256, 10% 4k.
    Soak,
    /// The seed's mix for predictive admission (issue 23): 90% 256:128, 5% 4K and 5% 8K
    /// prompts with 128 output tokens.
    SeedMix,
}

/// One row of the matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Short and stable: `short-c4`, `rate-0.20`, `needle-8k`; `--rows`/`--skip` name them.
    pub id: String,
    pub title: String,
    /// What the chart joins points of (`256:128`).
    pub series: String,
    pub kind: RowKind,
    pub workload: Workload,
    pub bound: Bound,
}

/// What every row's requests share.
#[derive(Clone)]
pub struct JobContext {
    pub prompts: Arc<dyn PromptSource>,
    pub model: String,
    pub seed: u64,
}

impl std::fmt::Debug for JobContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobContext({}, seed {})", self.model, self.seed)
    }
}

fn shape(s: &str) -> Shape {
    // The matrix's own shapes, all valid.
    s.parse().unwrap_or(Shape {
        label: s.into(),
        input: 256,
        output: 128,
    })
}

impl Row {
    /// The row's requests; `base` keeps its request numbers (and so prompts) apart from
    /// every other row's.
    pub fn jobs(&self, ctx: &JobContext, base: u64) -> Arc<dyn JobSource> {
        let shaped = |shape: Shape, repeat: bool, base: u64| ShapeJobs {
            prompts: ctx.prompts.clone(),
            model: ctx.model.clone(),
            shape,
            repeat,
            base,
        };
        match &self.kind {
            RowKind::Shape(s) => Arc::new(shaped(s.clone(), false, base)),
            RowKind::Repeat(s) => Arc::new(shaped(s.clone(), true, base)),
            RowKind::Needle { haystack, depths } => Arc::new(NeedleJobs {
                prompts: ctx.prompts.clone(),
                model: ctx.model.clone(),
                haystack: *haystack,
                depths: depths.clone(),
                base,
                seed: ctx.seed,
            }),
            RowKind::Tools {
                context,
                constrained,
            } => Arc::new(ToolJobs {
                prompts: ctx.prompts.clone(),
                model: ctx.model.clone(),
                context: *context,
                base,
                seed: ctx.seed,
                constrained: *constrained,
            }),
            RowKind::Json { constrained } => Arc::new(JsonJobs {
                model: ctx.model.clone(),
                constrained: *constrained,
            }),
            RowKind::SeedMix => Arc::new(MixJobs {
                parts: vec![
                    (18, Arc::new(shaped(shape("256:128"), false, base)) as _),
                    (
                        1,
                        Arc::new(shaped(shape("4k:128"), false, base + 1_000_000)) as _,
                    ),
                    (
                        1,
                        Arc::new(shaped(shape("8k:128"), false, base + 2_000_000)) as _,
                    ),
                ],
                seed: ctx.seed,
            }),
            RowKind::Soak => Arc::new(MixJobs {
                parts: vec![
                    (6, Arc::new(shaped(shape("256:128"), false, base)) as _),
                    (
                        3,
                        Arc::new(shaped(shape("1k:256"), false, base + 1_000_000)) as _,
                    ),
                    (
                        1,
                        Arc::new(shaped(shape("4k"), false, base + 2_000_000)) as _,
                    ),
                ],
                seed: ctx.seed,
            }),
        }
    }
}

impl Row {
    fn new(
        id: &str,
        title: &str,
        series: &str,
        kind: RowKind,
        workload: Workload,
        bound: Bound,
    ) -> Self {
        Self {
            id: id.into(),
            title: title.into(),
            series: series.into(),
            kind,
            workload,
            bound,
        }
    }
}

/// `base × scale` requests, at least `min`.
fn scaled(base: usize, scale: f64, min: usize) -> Option<usize> {
    Some(((base as f64 * scale).round() as usize).max(min))
}

/// The matrix at `scale` (1 = the deployment's request counts): short and medium tasks at
/// concurrency 4 and 8 (at least one request per worker); arrivals at 0.10, 0.20 and 0.30 req/s (client concurrency 8); long
/// inputs of 4K and 8K; a repeated 12K input; the 16K boundary; needles at `depths` in 4K and
/// 8K haystacks; function calls after 1K of context; and a Poisson soak of `soak` (the
/// deployment watched 83 minutes).
pub fn matrix(scale: f64, soak: Duration, depths: &[f64]) -> Vec<Row> {
    let closed = |c| Workload::Closed { concurrency: c };
    let count = |base, min| Bound {
        requests: scaled(base, scale, min),
        duration: None,
    };
    let mut rows = Vec::new();
    for (id, s, c, title) in [
        ("short-c4", "256:128", 4, "short agent calls 256→128, C=4"),
        ("short-c8", "256:128", 8, "short agent calls 256→128, C=8"),
        ("medium-c4", "1k:256", 4, "medium tasks 1K→256, C=4"),
        ("medium-c8", "1k:256", 8, "medium tasks 1K→256, C=8"),
    ] {
        rows.push(Row::new(
            id,
            title,
            s,
            RowKind::Shape(shape(s)),
            closed(c),
            // At least one request per worker, or the level is not at its concurrency.
            count(40, c),
        ));
    }
    for rate in [0.10, 0.20, 0.30] {
        let open = Workload::Open {
            arrivals: Arrivals::Fixed(rate),
            concurrency: 8,
        };
        rows.push(Row::new(
            &format!("rate-{rate:.2}"),
            &format!("arrivals {rate:.2} req/s, 1K→256"),
            "1k:256",
            RowKind::Shape(shape("1k:256")),
            open,
            count(40, 1),
        ));
    }
    for (id, s, base, title) in [
        ("long-4k", "4k", 8, "long input 4K→64"),
        ("long-8k", "8k", 4, "long input 8K→64"),
    ] {
        rows.push(Row::new(
            id,
            title,
            s,
            RowKind::Shape(shape(s)),
            closed(1),
            count(base, 1),
        ));
    }
    rows.push(Row::new(
        "repeat-12k",
        "repeated 12K input (same prompt)",
        "12k",
        RowKind::Repeat(shape("12k")),
        closed(1),
        count(4, 1),
    ));
    rows.push(Row::new(
        "boundary-16k",
        "16K boundary",
        "16k",
        RowKind::Shape(shape("16k")),
        closed(1),
        count(2, 1),
    ));
    for (id, haystack) in [("needle-4k", 4000), ("needle-8k", 8000)] {
        let kind = RowKind::Needle {
            haystack,
            depths: depths.to_vec(),
        };
        let title = format!("needle in a {}K haystack", haystack / 1000);
        let bound = count(2 * depths.len(), depths.len());
        rows.push(Row::new(id, &title, id, kind, closed(1), bound));
    }
    rows.push(Row::new(
        "tools",
        "function calls after 1K of context",
        "tools",
        RowKind::Tools {
            context: 1000,
            constrained: true,
        },
        closed(2),
        count(16, 1),
    ));
    let poisson = Workload::Open {
        arrivals: Arrivals::Poisson(0.2),
        concurrency: 8,
    };
    let title = format!("mixed soak, Poisson 0.20 req/s for {}s", soak.as_secs());
    let bound = Bound {
        requests: None,
        duration: Some(soak),
    };
    rows.push(Row::new(
        "soak",
        &title,
        "soak",
        RowKind::Soak,
        poisson,
        bound,
    ));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matrix_has_every_row_scaled() {
        let rows = matrix(1.0, Duration::from_secs(83 * 60), &[0.1, 0.5, 0.9]);
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "short-c4",
                "short-c8",
                "medium-c4",
                "medium-c8",
                "rate-0.10",
                "rate-0.20",
                "rate-0.30",
                "long-4k",
                "long-8k",
                "repeat-12k",
                "boundary-16k",
                "needle-4k",
                "needle-8k",
                "tools",
                "soak"
            ]
        );
        assert_eq!(rows[4].bound.requests, Some(40));
        assert_eq!(rows[4].workload.rate(), Some(0.1));
        assert_eq!(rows[11].bound.requests, Some(6));
        let quarter = matrix(0.25, Duration::from_secs(60), &[0.1, 0.5, 0.9]);
        let counts: Vec<Option<usize>> = quarter.iter().map(|r| r.bound.requests).collect();
        assert_eq!(
            counts,
            [
                Some(10),
                Some(10),
                Some(10),
                Some(10),
                Some(10),
                Some(10),
                Some(10),
                Some(2),
                Some(1),
                Some(1),
                Some(1),
                Some(3),
                Some(3),
                Some(4),
                None
            ]
        );
        assert_eq!(quarter[14].bound.duration, Some(Duration::from_secs(60)));
        let tenth = matrix(0.1, Duration::from_secs(60), &[0.5]);
        let counts: Vec<Option<usize>> = tenth.iter().take(5).map(|r| r.bound.requests).collect();
        assert_eq!(counts, [Some(4), Some(8), Some(4), Some(8), Some(4)]);
        assert_eq!(
            tenth[11].bound.requests,
            Some(1),
            "one needle per depth at least"
        );
    }
}
