//! The grammar a request's output must follow: its `response_format` (or vLLM's fields), or, for
//! `tool_choice: "required"` or a named function, a `<tool_call>` block whose JSON names one of
//! the offered tools and whose `arguments` match that tool's `parameters`. With
//! `tool_choice: "auto"` the answer may be prose, but once it writes `<tool_call>` the rest must
//! be such calls (a grammar that waits for its trigger, as llama.cpp's lazy grammars do).

use serde_json::{json, Value};

use super::error::ApiError;
use super::tools::{CALL_CLOSE, CALL_OPEN};
use super::types::{ChatRequest, Format, ToolChoice, ToolDef};
use crate::generate::GrammarSpec;

/// Objects with `properties` and no word on others get no others: what the model writes then
/// still validates against the schema as given, and a small model does not wander off into keys
/// of its own until `max_tokens` cuts it (OpenAI's strict mode requires the same).
fn closed(schema: &mut Value) {
    let Value::Object(m) = schema else { return };
    if m.contains_key("properties") && !m.contains_key("additionalProperties") {
        m.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, v) in m.iter_mut() {
        match (k.as_str(), v) {
            ("properties" | "$defs" | "definitions", Value::Object(props)) => {
                props.values_mut().for_each(closed);
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems", Value::Array(items)) => {
                items.iter_mut().for_each(closed);
            }
            ("items" | "additionalProperties" | "not", v) => closed(v),
            _ => {}
        }
    }
}

/// llguidance's JSON options: no free whitespace (a small model would pad forever); objects
/// closed (see [`closed`]).
fn compact(mut schema: Value) -> Value {
    closed(&mut schema);
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false}));
    }
    schema
}

/// A request's grammar and the field a compile error names.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Grammar {
    pub spec: GrammarSpec,
    pub param: &'static str,
}

/// The grammar of a `response_format` (or `guided_json`, `structured_outputs`).
pub(crate) fn format(f: &Format) -> Grammar {
    let param = match f {
        Format::JsonObject | Format::JsonSchema(_) => "response_format",
        Format::Regex(_) | Format::Choice(_) | Format::Lark(_) => "structured_outputs",
    };
    Grammar {
        spec: format_spec(f),
        param,
    }
}

fn format_spec(f: &Format) -> GrammarSpec {
    match f {
        Format::JsonObject => GrammarSpec::JsonSchema(compact(json!({"type": "object"}))),
        Format::JsonSchema(Value::Bool(true)) => {
            GrammarSpec::JsonSchema(compact(json!({"type": "object"})))
        }
        Format::JsonSchema(s) => GrammarSpec::JsonSchema(compact(s.clone())),
        Format::Regex(r) => GrammarSpec::Regex(r.clone()),
        Format::Choice(c) => {
            let alts: Vec<String> = c
                .iter()
                .map(|s| Value::from(s.as_str()).to_string())
                .collect();
            GrammarSpec::Lark(format!("start: {}", alts.join(" | ")))
        }
        Format::Lark(g) => GrammarSpec::Lark(g.clone()),
    }
}

/// The JSON schema of one call of `tool`: `{"name": <its name>, "arguments": <parameters>}`.
fn call_schema(tool: &ToolDef) -> Value {
    let args = tool
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    json!({
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": args},
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

/// The Lark grammar of `tool_calls`: one `<tool_call>` block per call, each with one of `tools`
/// (several blocks when `parallel`).
fn tool_grammar(tools: &[&ToolDef], parallel: bool) -> GrammarSpec {
    let schemas: Vec<Value> = tools.iter().map(|t| call_schema(t)).collect();
    let schema = match schemas.as_slice() {
        [one] => one.clone(),
        _ => json!({"anyOf": schemas}),
    };
    let schema = compact(schema);
    let open = Value::from(format!("{CALL_OPEN}\n")).to_string();
    let close = Value::from(format!("\n{CALL_CLOSE}")).to_string();
    let start = if parallel {
        "start: call (\"\\n\" call)*"
    } else {
        "start: call"
    };
    GrammarSpec::ToolCalls(format!("{start}\ncall: {open} %json {schema} {close}\n"))
}

/// The grammar of a chat request, if its output is constrained.
pub(crate) fn chat(req: &ChatRequest) -> Result<Option<Grammar>, ApiError> {
    let tools = |spec| Grammar {
        spec,
        param: "tools",
    };
    let forced: Vec<&ToolDef> = match &req.tool_choice {
        _ if req.tools.is_empty() => Vec::new(),
        ToolChoice::Required => req.tools.iter().collect(),
        ToolChoice::Function(name) => req.tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::None | ToolChoice::Auto => Vec::new(),
    };
    if !forced.is_empty() {
        if req.sampling.format.is_some() {
            return Err(ApiError::invalid(
                "response_format",
                "response_format: cannot be combined with a tool_choice that forces a call",
            ));
        }
        return Ok(Some(tools(tool_grammar(&forced, req.parallel_tool_calls))));
    }
    if let Some(f) = &req.sampling.format {
        // The answer must be the format; the tools stay listed in the prompt.
        return Ok(Some(format(f)));
    }
    if req.tool_choice == ToolChoice::Auto && !req.tools.is_empty() {
        let all: Vec<&ToolDef> = req.tools.iter().collect();
        return Ok(Some(tools(GrammarSpec::After {
            trigger: CALL_OPEN.to_owned(),
            then: Box::new(tool_grammar(&all, req.parallel_tool_calls)),
        })));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_closed_only_where_the_schema_is_silent() {
        let mut s = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "c": {"type": "object", "properties": {}, "additionalProperties": true},
            "d": {"type": "array", "items": {"properties": {"e": {}}}}}});
        closed(&mut s);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["properties"]["c"]["additionalProperties"], true);
        assert_eq!(s["properties"]["d"]["items"]["additionalProperties"], false);
        assert!(s["properties"]["a"]["properties"]["b"]
            .get("additionalProperties")
            .is_none());
    }
}
