//! Which blocks each pipeline rank holds.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::model::ModelPart;

/// The layer split of an `n_layers` model over ranks: rank `k` holds `ranges[k]`; rank 0 also
/// holds the embeddings, the last rank the final norm, the output head and sampling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSplit {
    ranges: Vec<Range<usize>>,
}

impl LayerSplit {
    /// An even split (earlier ranks take one more block when it does not divide).
    pub fn even(n_layers: usize, n_ranks: usize) -> Result<Self> {
        if n_ranks == 0 || n_ranks > n_layers {
            return Err(Error::InvalidRequest(format!(
                "cannot split {n_layers} blocks over {n_ranks} ranks"
            )));
        }
        let (base, extra) = (n_layers / n_ranks, n_layers % n_ranks);
        let mut start = 0;
        let ranges = (0..n_ranks)
            .map(|k| {
                let len = base + usize::from(k < extra);
                let r = start..start + len;
                start += len;
                r
            })
            .collect();
        Ok(Self { ranges })
    }

    /// Parses `--layers 0-9,10-19,20-29` (inclusive ranges that must cover `0..n_layers` in order).
    pub fn parse(spec: &str, n_layers: usize) -> Result<Self> {
        let bad = |why: String| Error::InvalidRequest(format!("--layers {spec:?}: {why}"));
        let mut ranges = Vec::new();
        let mut next = 0;
        for part in spec.split(',') {
            let (a, b) = part
                .trim()
                .split_once('-')
                .ok_or_else(|| bad(format!("{part:?} is not FIRST-LAST")))?;
            let a: usize = a
                .trim()
                .parse()
                .map_err(|_| bad(format!("{a:?} is not a block number")))?;
            let b: usize = b
                .trim()
                .parse()
                .map_err(|_| bad(format!("{b:?} is not a block number")))?;
            if a != next {
                return Err(bad(format!("range {a}-{b} should start at block {next}")));
            }
            if b < a {
                return Err(bad(format!("range {a}-{b} is empty")));
            }
            ranges.push(a..b + 1);
            next = b + 1;
        }
        if next != n_layers {
            return Err(bad(format!(
                "the ranges end at block {}, the model has {n_layers}",
                next.saturating_sub(1)
            )));
        }
        Ok(Self { ranges })
    }

    pub fn n_ranks(&self) -> usize {
        self.ranges.len()
    }

    pub fn range(&self, rank: usize) -> Range<usize> {
        self.ranges[rank].clone()
    }

    /// `[first, last]` block of `rank`, inclusive, as the protocol and `/health` show it.
    pub fn bounds(&self, rank: usize) -> [usize; 2] {
        let r = &self.ranges[rank];
        [r.start, r.end - 1]
    }

    pub fn part(&self, rank: usize) -> ModelPart {
        ModelPart {
            layers: self.range(rank),
            embed: rank == 0,
            head: rank + 1 == self.n_ranks(),
        }
    }

    /// The `--layers` text of this split.
    pub fn spec(&self) -> String {
        self.ranges
            .iter()
            .map(|r| format!("{}-{}", r.start, r.end - 1))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_of_thirty_blocks() {
        let s = LayerSplit::even(30, 3).unwrap();
        assert_eq!(s.spec(), "0-9,10-19,20-29");
        assert_eq!(
            s.part(0),
            ModelPart {
                layers: 0..10,
                embed: true,
                head: false
            }
        );
        assert_eq!(
            s.part(2),
            ModelPart {
                layers: 20..30,
                embed: false,
                head: true
            }
        );
        assert_eq!(
            LayerSplit::even(30, 4).unwrap().spec(),
            "0-7,8-15,16-22,23-29"
        );
        assert_eq!(
            LayerSplit::even(30, 1).unwrap().part(0),
            ModelPart::full(30)
        );
        assert!(LayerSplit::even(2, 3).is_err());
    }

    #[test]
    fn parses_and_rejects_layer_specs() {
        assert_eq!(
            LayerSplit::parse("0-4, 5-29", 30).unwrap().bounds(1),
            [5, 29]
        );
        for bad in [
            "0-9,11-29",
            "0-9,10-19",
            "1-29",
            "0-9,10-x",
            "0-9;10-29",
            "5-4,5-29",
        ] {
            let e = LayerSplit::parse(bad, 30).unwrap_err().to_string();
            assert!(e.contains("--layers"), "{bad}: {e}");
        }
    }
}
