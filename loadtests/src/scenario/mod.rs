//! What each request of a scenario is: its endpoint, its body and how its answer is scored.
//! Workloads decide *when* requests go; a [`JobSource`] decides *what* they are.

mod json;
mod matrix;
mod mix;
mod needle;
mod shape;
mod tools;

use bytes::Bytes;

pub use json::JsonJobs;
pub use matrix::{matrix, JobContext, Row, RowKind};
pub use mix::MixJobs;
pub use needle::NeedleJobs;
pub use shape::ShapeJobs;
pub use tools::ToolJobs;

use crate::client::{Api, Sample};
use crate::error::Result;

/// One request to send.
#[derive(Debug, Clone)]
pub struct Job {
    pub api: Api,
    pub body: Bytes,
    pub check: Check,
    /// What kind of request this is within a mixed run (`256:128`, `needle-4k@50%`).
    pub kind: String,
}

/// How an answer is scored, beyond its outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// Not scored.
    None,
    /// The answer must contain this text (the needle's code).
    Contains(String),
    /// The answer's first `tool_calls` entry must call `name` with arguments that parse as
    /// JSON and validate against `parameters` (the tool's schema).
    ToolCall {
        name: String,
        parameters: serde_json::Value,
    },
    /// The answer's content must parse as JSON and validate against `schema`.
    Json { schema: serde_json::Value },
}

impl Check {
    /// `None` for an unscored request; else whether a successful answer passed (a failed
    /// request fails its check too).
    pub fn score(&self, sample: &Sample) -> Option<bool> {
        let ok = sample.outcome.is_ok();
        let valid = |schema: &serde_json::Value, doc: &str| {
            serde_json::from_str::<serde_json::Value>(doc)
                .is_ok_and(|doc| jsonschema::validator_for(schema).is_ok_and(|v| v.is_valid(&doc)))
        };
        match self {
            Self::None => None,
            Self::Contains(answer) => Some(ok && sample.text.contains(answer.as_str())),
            Self::ToolCall { name, parameters } => Some(
                ok && sample
                    .tool_calls
                    .first()
                    .is_some_and(|call| call.name == *name && valid(parameters, &call.arguments)),
            ),
            Self::Json { schema } => Some(ok && valid(schema, &sample.text)),
        }
    }
}

/// The requests of one scenario: `job(n)` is request number `n` (unique within the run, so
/// prompts differ unless the scenario repeats one on purpose). Called off the async runtime:
/// building a long prompt is tokenizer work.
pub trait JobSource: Send + Sync {
    fn job(&self, n: u64) -> Result<Job>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Outcome, ToolCall};
    use std::time::Duration;

    fn answer(text: &str, calls: Vec<ToolCall>) -> Sample {
        let mut s = Sample::failed(Outcome::Ok, Duration::ZERO);
        s.text = text.into();
        s.tool_calls = calls;
        s
    }

    #[test]
    fn checks() {
        let needle = Check::Contains("7-mango".into());
        assert_eq!(needle.score(&answer("It is 7-mango.", vec![])), Some(true));
        assert_eq!(needle.score(&answer("It is 8-mango.", vec![])), Some(false));
        let mut failed = answer("7-mango", vec![]);
        failed.outcome = Outcome::Incomplete;
        assert_eq!(needle.score(&failed), Some(false));
        assert_eq!(Check::None.score(&failed), None);

        let tool = Check::ToolCall {
            name: "get_weather".into(),
            parameters: serde_json::json!({"type": "object",
                "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        };
        let call = |name: &str, args: &str| ToolCall {
            name: name.into(),
            arguments: args.into(),
        };
        assert_eq!(
            tool.score(&answer("", vec![call("get_weather", r#"{"city":"Oslo"}"#)])),
            Some(true)
        );
        for bad in [
            vec![],
            vec![call("get_time", "{}")],
            vec![call("get_weather", "{\"city\":")],
            vec![call("get_weather", "\"Oslo\"")],
            vec![call("get_weather", r#"{"town":"Oslo"}"#)],
            vec![call("get_weather", r#"{"city":7}"#)],
        ] {
            assert_eq!(tool.score(&answer("", bad.clone())), Some(false), "{bad:?}");
        }

        let json = Check::Json {
            schema: serde_json::json!({"type": "object",
                "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"]}),
        };
        assert_eq!(json.score(&answer(r#"{"n": 3}"#, vec![])), Some(true));
        for bad in [r#"{"n": 9}"#, r#"{"m": 3}"#, r#"{"n": 3"#, "n is 3", ""] {
            assert_eq!(json.score(&answer(bad, vec![])), Some(false), "{bad:?}");
        }
    }
}
