//! The structured-output and tool-call workloads, against any OpenAI-compatible server: this
//! engine in the tests, llama-server beside it in `side_by_side` (docs/capacity.md).

use std::time::Instant;

use serde_json::{json, Value};

use crate::harness::post_json;
use crate::{concurrently, content, schemas};

/// One workload's results on one server.
#[derive(Debug, Default)]
pub struct Run {
    pub valid: usize,
    pub total: usize,
    /// What each invalid answer was.
    pub failures: Vec<String>,
    /// Each request's latency, seconds.
    pub secs: Vec<f64>,
    pub completion_tokens: u64,
}

impl Run {
    /// p50 and p95 of the latencies.
    pub fn p50_p95(&self) -> (f64, f64) {
        let mut s = self.secs.clone();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| s[((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1];
        (at(0.5), at(0.95))
    }
}

/// Posts `body` to `addr`'s chat endpoint: the answer (whatever its status) and its seconds.
fn timed_chat(addr: &str, body: &Value) -> (Value, f64) {
    let t = Instant::now();
    let (status, v) = post_json(addr, "/v1/chat/completions", body);
    let v = if status == 200 {
        v
    } else {
        json!({"status": status, "error": v})
    };
    (v, t.elapsed().as_secs_f64())
}

fn finish(results: Vec<(Value, f64)>, verdicts: Vec<Result<(), String>>) -> Run {
    let mut run = Run {
        total: results.len(),
        ..Run::default()
    };
    for ((v, secs), verdict) in results.iter().zip(verdicts) {
        run.secs.push(*secs);
        run.completion_tokens += v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        match verdict {
            Ok(()) => run.valid += 1,
            Err(why) => run.failures.push(why),
        }
    }
    run
}

/// The 20 `json_schema` prompts, 4 at a time: each answer must parse and validate.
pub fn schemas(addr: &str) -> Run {
    let cases = schemas::cases();
    let results = concurrently(&cases, 4, |(prompt, schema)| {
        timed_chat(
            addr,
            &json!({
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 400,
                "seed": 1,
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": true}},
            }),
        )
    });
    let verdicts = cases
        .iter()
        .zip(&results)
        .map(|((prompt, schema), (v, _))| {
            let validator = jsonschema::validator_for(schema).expect("a valid schema");
            let (text, reason) = (content(v), &v["choices"][0]["finish_reason"]);
            match serde_json::from_str::<Value>(text) {
                Ok(doc) if validator.is_valid(&doc) => Ok(()),
                Ok(doc) => Err(format!(
                    "{prompt}: {:?} ({reason})",
                    validator
                        .iter_errors(&doc)
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                )),
                Err(e) => Err(format!("{prompt}: {e} in {text:?} ({reason}) {v}")),
            }
        })
        .collect();
    finish(results, verdicts)
}

/// The choice is `tool_calls` and each call names one of `tools` with arguments that validate
/// against its `parameters`.
pub fn calls_validate(tools: &Value, choice: &Value) -> bool {
    let calls = choice["message"]["tool_calls"].as_array();
    calls.is_some_and(|calls| {
        !calls.is_empty()
            && calls.iter().all(|c| {
                let name = c["function"]["name"].as_str().unwrap_or_default();
                let tool = tools
                    .as_array()
                    .expect("tools are an array")
                    .iter()
                    .find(|t| t["function"]["name"] == name);
                let args = c["function"]["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str::<Value>(a).ok());
                match (tool, args) {
                    (Some(t), Some(a)) => jsonschema::validator_for(&t["function"]["parameters"])
                        .expect("schema")
                        .is_valid(&a),
                    _ => false,
                }
            })
    }) && choice["finish_reason"] == "tool_calls"
}

/// The 20 tool-call prompts with `tool_choice: "required"`, 4 at a time: each answer must be
/// `tool_calls` whose arguments validate.
pub fn required_tool_calls(addr: &str) -> Run {
    let cases = schemas::tool_cases();
    let results = concurrently(&cases, 4, |(prompt, tools)| {
        timed_chat(
            addr,
            &json!({
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 300,
                "seed": 1,
                "tools": tools,
                "tool_choice": "required",
                // One call asked for (as sluice-load's tools workload): with parallel calls
                // allowed the model repeats its call until max_tokens ("length").
                "parallel_tool_calls": false,
            }),
        )
    });
    let verdicts = cases
        .iter()
        .zip(&results)
        .map(|((prompt, tools), (v, _))| {
            if calls_validate(tools, &v["choices"][0]) {
                Ok(())
            } else {
                Err(format!("{prompt}: {v}"))
            }
        })
        .collect();
    finish(results, verdicts)
}
