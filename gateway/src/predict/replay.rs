//! The prefill fit replayed offline from a gateway's log: what each prediction would have been
//! against what was observed, one prefill at a time, and the terms it ends at
//! (`sluice policy replay-cost`).
//!
//! Admission logs every prefill it learns from at debug (`RUST_LOG=info,sluice::predict=debug`,
//! "prefill observed"): the prompt, the running context, the share beside decodes, the seconds
//! observed and the others' time ahead of it. Replayed through a [`CostModel`] seeded from a
//! policy, the same observations tell how a seed or a change to the fit would have predicted
//! them, without rerunning the traffic: each prediction is made before its observation is
//! learned, as the gateway made it.

use super::history::median;
use super::model::{Beside, CostModel, Parameters};

/// The message admission logs each prefill observation under.
pub const MESSAGE: &str = "prefill observed";

/// Prompts of this many tokens and more count as long in the report.
pub const LONG_PROMPT: usize = 1000;

/// Observations under this many seconds are learned but left out of the errors: a relative
/// error of a prefill cut to nothing by the others' time ahead of it is no figure.
pub const ERROR_MIN_SECONDS: f64 = 0.01;

/// One prefill the gateway learned from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    pub prompt: usize,
    pub beside: Beside,
    pub seconds: f64,
    /// What the upstream spent on the other requests ahead of it, as predicted.
    pub others: f64,
}

impl Observation {
    /// The observation in one log line, if it holds one: the fields after [`MESSAGE`], as
    /// `key=value`. A line without `others` (logged before 2026-12-07 evening) counts none.
    pub fn parse(line: &str) -> Option<Self> {
        let (_, fields) = line.split_once(MESSAGE)?;
        let field = |key: &str| {
            fields
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v)
        };
        let number = |key: &str| field(key)?.parse::<f64>().ok().filter(|v| v.is_finite());
        Some(Self {
            prompt: field("prompt")?.parse().ok()?,
            beside: Beside {
                context: field("context")?.parse().ok()?,
                decoding: number("decoding")?,
            },
            seconds: number("seconds")?,
            others: number("others").unwrap_or(0.0),
        })
    }
}

/// Relative errors of the predictions, (predicted − observed) / observed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Errors {
    pub count: usize,
    pub median: f64,
    pub median_abs: f64,
}

impl Errors {
    fn of(errs: Vec<f64>) -> Option<Self> {
        let abs = errs.iter().map(|e| e.abs()).collect();
        Some(Self {
            count: errs.len(),
            median: median(errs)?,
            median_abs: median(abs)?,
        })
    }
}

/// What a replay found.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    pub observations: usize,
    /// Prompts under [`LONG_PROMPT`] tokens.
    pub short: Option<Errors>,
    pub long: Option<Errors>,
    /// The model after the last observation.
    pub parameters: Parameters,
}

/// Feeds `observations` to `model` in order, each predicted before it is learned.
pub fn replay(
    model: &mut CostModel,
    observations: impl IntoIterator<Item = Observation>,
) -> Replay {
    let (mut short, mut long) = (Vec::new(), Vec::new());
    let mut count = 0;
    for o in observations {
        let predicted = model.prefill(o.prompt, o.beside);
        if o.seconds >= ERROR_MIN_SECONDS {
            let err = (predicted - o.seconds) / o.seconds;
            if o.prompt < LONG_PROMPT {
                short.push(err);
            } else {
                long.push(err);
            }
        }
        model.observe_prefill(o.prompt, o.beside, o.seconds, o.others);
        count += 1;
    }
    Replay {
        observations: count,
        short: Errors::of(short),
        long: Errors::of(long),
        parameters: model.parameters(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Cost;

    const LINE: &str = "2026-12-07T20:40:01.123456Z DEBUG sluice::predict: prefill observed \
        prompt=4000 context=8256 decoding=0.76 seconds=10.55 predicted=8.1 others=2.5";

    #[test]
    fn reads_the_line_admission_logs() {
        let o = Observation::parse(LINE).expect("an observation");
        assert_eq!(o.prompt, 4000);
        assert_eq!(o.beside.context, 8256);
        assert_eq!((o.beside.decoding, o.seconds, o.others), (0.76, 10.55, 2.5));
        // Logged before the others' time was: none.
        let old = LINE.replace(" others=2.5", "");
        assert_eq!(Observation::parse(&old).map(|o| o.others), Some(0.0));
        // Any other line, or one cut short or garbled: nothing, never a panic.
        for line in [
            "INFO sluice::access: request status=200",
            "prefill observed prompt=4000",
            "prefill observed prompt=x context=0 decoding=0 seconds=1",
            "prefill observed prompt=1 context=0 decoding=NaN seconds=1",
            "prefill observed",
            "",
        ] {
            assert_eq!(Observation::parse(line), None, "{line}");
        }
    }

    #[test]
    fn predicts_each_before_learning_it() {
        // An upstream at 0.3 s per 1K tokens alone, against the shipped seed's 0.5.
        let truth = |p: usize| 0.3 * p as f64 / 1000.0;
        let obs = (0..60).map(|i| {
            let prompt = [256, 256, 4096][i % 3];
            Observation {
                prompt,
                beside: Beside::IDLE,
                seconds: truth(prompt),
                others: 0.0,
            }
        });
        let mut model = CostModel::new(&Cost::default());
        let r = replay(&mut model, obs);
        assert_eq!(r.observations, 60);
        let (short, long) = (r.short.expect("short"), r.long.expect("long"));
        assert_eq!((short.count, long.count), (40, 20));
        // The first predictions were the seed's, too high; most after were close.
        assert!(long.median_abs < 0.1, "{long:?}");
        assert!(long.median > -0.1, "{long:?}");
        let at_4k = model.prefill(4096, Beside::IDLE);
        assert!((at_4k - truth(4096)).abs() < 0.1 * truth(4096), "{at_4k}");
        assert_eq!(r.parameters, model.parameters());
        // Nothing to replay: no errors, the seed's terms.
        let mut seed = CostModel::new(&Cost::default());
        let none = replay(&mut seed, []);
        assert_eq!((none.observations, none.short, none.long), (0, None, None));
    }
}
