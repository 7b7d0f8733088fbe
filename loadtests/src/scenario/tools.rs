//! Function calls at long context: a document, then a request only a tool can answer, with
//! `tool_choice: "required"`. The answer passes when it is a parseable `tool_calls` entry whose
//! arguments validate against the tool's `parameters` schema. Unconstrained, the same text goes
//! without `tools` (the decode rate without a grammar; not scored).

use std::sync::Arc;

use serde_json::json;

use super::{Check, Job, JobSource};
use crate::client::Api;
use crate::error::Result;
use crate::prompts::PromptSource;
use crate::request;
use crate::rng::Rng;

const CITIES: &[&str] = &["Oslo", "Lima", "Accra", "Perth", "Quito", "Riga", "Hanoi"];
const FUNCTION: &str = "get_weather";

/// Tool-call requests after a `context`-token document.
#[derive(Clone)]
pub struct ToolJobs {
    pub prompts: Arc<dyn PromptSource>,
    pub model: String,
    pub context: usize,
    pub base: u64,
    pub seed: u64,
    /// Without it, the same user message goes without `tools` and `tool_choice`.
    pub constrained: bool,
}

impl std::fmt::Debug for ToolJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ToolJobs({} tokens)", self.context)
    }
}

impl JobSource for ToolJobs {
    fn job(&self, n: u64) -> Result<Job> {
        let city = Rng::new(self.seed, n).pick(CITIES);
        let doc = self.prompts.prompt(self.context, self.base + n)?;
        let user = format!(
            "{doc}\n\nUsing the {FUNCTION} function, look up the current weather in {city}."
        );
        let parameters = json!({"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]});
        let tools = json!({
            "tools": [{"type": "function", "function": {
                "name": FUNCTION,
                "description": "Get the current weather for a city",
                "parameters": parameters}}],
            "tool_choice": "required",
            // One lookup is asked for; llama-server's default too.
            "parallel_tool_calls": false,
        });
        if !self.constrained {
            return Ok(Job {
                api: Api::Chat,
                body: request::chat(&self.model, &user, 128, json!({})),
                check: Check::None,
                kind: "tools-free".into(),
            });
        }
        Ok(Job {
            api: Api::Chat,
            body: request::chat(&self.model, &user, 128, tools),
            check: Check::ToolCall {
                name: FUNCTION.into(),
                parameters,
            },
            kind: "tools".into(),
        })
    }
}
