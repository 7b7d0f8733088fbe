//! Tool calling for chat templates that do not know tools (SmolLM2's), the Hermes/Qwen way:
//! the function schemas go into the system prompt inside `<tools></tools>`, the model answers
//! with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and history renders as
//! `<tool_call>` / `<tool_response>` text.

use serde_json::Value;

use super::generation::new_id;
use super::types::{ChatRequest, FunctionCall, Message, Role, ToolCall, ToolChoice};
use crate::model::chat::ChatMessage;

pub(crate) const CALL_OPEN: &str = "<tool_call>";
pub(crate) const CALL_CLOSE: &str = "</tool_call>";

/// Whether the model is offered the request's tools (`tool_choice: "none"` disables them).
pub(crate) fn enabled(req: &ChatRequest) -> bool {
    !req.tools.is_empty() && req.tool_choice != ToolChoice::None
}

/// The system prompt that lists the tools, after the request's own system text (if any).
fn system_prompt(system: Option<&str>, req: &ChatRequest) -> String {
    let mut s = String::new();
    if let Some(sys) = system.filter(|t| !t.is_empty()) {
        s.push_str(sys);
        s.push_str("\n\n");
    }
    s.push_str(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in &req.tools {
        s.push('\n');
        s.push_str(&tool.schema);
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n\
         {\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    match &req.tool_choice {
        ToolChoice::Required => s.push_str("\n\nYou must call at least one function."),
        ToolChoice::Function(name) => {
            s.push_str(&format!("\n\nYou must call the function {name:?}."));
        }
        ToolChoice::None | ToolChoice::Auto => {}
    }
    s
}

/// A call of the history as the model would have written it.
fn call_text(name: &str, arguments: &str) -> String {
    // Arguments are a JSON string in the API but an object in the model's own output.
    let args = serde_json::from_str::<Value>(arguments)
        .unwrap_or_else(|_| Value::String(arguments.to_owned()));
    // By hand: `name` first, as the model writes it (serde_json's maps are sorted).
    let name = Value::from(name);
    format!("{CALL_OPEN}\n{{\"name\":{name},\"arguments\":{args}}}\n{CALL_CLOSE}")
}

/// The messages the chat template renders: the tools merged into the system prompt (when
/// enabled), assistant tool calls as `<tool_call>` text, and tool results as `<tool_response>`
/// blocks in a user turn (consecutive results share one turn, as Qwen's template does).
pub(crate) fn render_messages(req: &ChatRequest) -> Vec<ChatMessage> {
    let mut out = Vec::with_capacity(req.messages.len() + 1);
    let mut rest: &[Message] = &req.messages;
    if enabled(req) {
        let (system, name) = match rest.first() {
            Some(m) if m.role == Role::System => {
                rest = &rest[1..];
                (m.content.as_deref(), m.name.as_deref())
            }
            _ => (None, None),
        };
        out.push(ChatMessage::new("system", system_prompt(system, req)).named(name));
    }
    let mut last_was_tool = false;
    for m in rest {
        let content = m.content.as_deref().unwrap_or("");
        match m.role {
            Role::Tool => {
                let block = format!("<tool_response>\n{content}\n</tool_response>");
                match out.last_mut() {
                    Some(prev) if last_was_tool => {
                        prev.content.push('\n');
                        prev.content.push_str(&block);
                    }
                    _ => out.push(ChatMessage::new("user", block)),
                }
            }
            Role::Assistant if !m.tool_calls.is_empty() => {
                let mut parts: Vec<String> = Vec::new();
                if !content.is_empty() {
                    parts.push(content.to_owned());
                }
                parts.extend(
                    m.tool_calls
                        .iter()
                        .map(|c| call_text(&c.name, &c.arguments)),
                );
                out.push(ChatMessage::new("assistant", parts.join("\n")).named(m.name.as_deref()));
            }
            role => out.push(ChatMessage::new(role.as_str(), content).named(m.name.as_deref())),
        }
        last_was_tool = m.role == Role::Tool;
    }
    out
}

/// Generated text split into content and tool calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// The text outside the tags, trimmed; `None` when empty.
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
    /// A call that `max_tokens` cut off was taken out of the text (as a call with the
    /// arguments written so far where its name was complete, else dropped).
    pub cut_call: bool,
}

/// `{"name": "...", "arguments": {...}}` as an OpenAI tool call.
fn parse_call(inner: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(inner.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_owned();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(call(name, arguments))
}

fn call(name: String, arguments: String) -> ToolCall {
    ToolCall {
        id: new_id("call_"),
        kind: "function",
        function: FunctionCall { name, arguments },
    }
}

/// The start of a call cut off before its end, as the grammar writes it
/// (`{"name": "...", "arguments": ...`): its name, once complete, and the arguments' text so
/// far (possibly empty), as OpenAI reports a call that `max_tokens` cut off.
fn partial_call(inner: &str) -> Option<ToolCall> {
    let field = |s: &str, key: &str| {
        let s = s.trim_start().strip_prefix(key)?.trim_start();
        Some(s.strip_prefix(':')?.trim_start().to_owned())
    };
    let s = inner.trim_start().strip_prefix('{')?;
    let s = field(s, "\"name\"")?;
    let mut names = serde_json::Deserializer::from_str(&s).into_iter::<String>();
    let name = names.next()?.ok()?;
    let rest = s[names.byte_offset()..].trim_start();
    let arguments = rest
        .strip_prefix(',')
        .and_then(|r| field(r, "\"arguments\""))
        .unwrap_or_default();
    Some(call(name, arguments))
}

/// Finds each `<tool_call>{json}</tool_call>` (the last one may be unterminated). A call whose
/// JSON does not parse stays in the content, tags and all, except an unterminated last call
/// when `max_tokens` cut the output off (`cut_off`): that one never stays in the content, and
/// becomes a call with the arguments written so far once its name is complete (OpenAI's
/// shape for a cut-off call, with `finish_reason: "length"`).
pub(crate) fn parse_output(text: &str, cut_off: bool) -> Parsed {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut cut_call = false;
    let mut rest = text;
    while let Some(start) = rest.find(CALL_OPEN) {
        content.push_str(&rest[..start]);
        let after = &rest[start + CALL_OPEN.len()..];
        let (inner, consumed, closed) = match after.find(CALL_CLOSE) {
            Some(end) => (
                &after[..end],
                start + CALL_OPEN.len() + end + CALL_CLOSE.len(),
                true,
            ),
            None => (after, rest.len(), false),
        };
        match parse_call(inner) {
            Some(call) => calls.push(call),
            None if cut_off && !closed => {
                cut_call = true;
                calls.extend(partial_call(inner));
            }
            None => content.push_str(&rest[start..consumed]),
        }
        rest = &rest[consumed..];
    }
    content.push_str(rest);
    let content = content.trim();
    Parsed {
        content: (!content.is_empty()).then(|| content.to_owned()),
        calls,
        cut_call,
    }
}

/// Streaming with tools: passes text through until `<tool_call>` may be starting, then holds
/// everything back until the end.
#[derive(Clone, Debug, Default)]
pub(crate) struct StreamSplitter {
    held: String,
    in_call: bool,
}

impl StreamSplitter {
    /// Adds generated text; returns the text that can be sent as content now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.in_call {
            return String::new();
        }
        if let Some(pos) = self.held.find(CALL_OPEN) {
            self.in_call = true;
            let tail = self.held.split_off(pos);
            return std::mem::replace(&mut self.held, tail);
        }
        // Keep the longest suffix that could be the start of `<tool_call>` (ASCII, so the
        // split is on a character boundary).
        let keep = (1..CALL_OPEN.len())
            .rev()
            .find(|&k| self.held.ends_with(&CALL_OPEN[..k]))
            .unwrap_or(0);
        let tail = self.held.split_off(self.held.len() - keep);
        std::mem::replace(&mut self.held, tail)
    }

    /// The end: the content still to send and the tool calls; `cut_off`: `max_tokens` ended
    /// the output (see [`parse_output`]).
    pub fn finish(mut self, last: &str, cut_off: bool) -> (String, Vec<ToolCall>) {
        let mut content = self.push(last);
        if !self.in_call {
            content.push_str(&self.held);
            return (content, Vec::new());
        }
        let parsed = parse_output(&self.held, cut_off);
        if parsed.calls.is_empty() && !parsed.cut_call {
            content.push_str(&self.held);
        } else if let Some(rest) = parsed.content {
            content.push_str(&rest);
        }
        (content, parsed.calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_the_rest_as_content() {
        let p = parse_output(
            "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
             <tool_call>{\"name\":\"now\"}</tool_call>",
            false,
        );
        assert_eq!(p.content.as_deref(), Some("Sure."));
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].function.name, "get_weather");
        assert_eq!(p.calls[0].function.arguments, r#"{"city":"Paris"}"#);
        assert!(p.calls[0].id.starts_with("call_"));
        assert_ne!(p.calls[0].id, p.calls[1].id);
        assert_eq!(p.calls[1].function.arguments, "{}");

        let p = parse_output("<tool_call>{not json}</tool_call> ok", true);
        assert!(p.calls.is_empty());
        assert_eq!(
            p.content.as_deref(),
            Some("<tool_call>{not json}</tool_call> ok")
        );

        // Unterminated at the end (generation stopped before the closing tag).
        let p = parse_output("<tool_call>{\"name\":\"f\",\"arguments\":{\"a\":1}}", false);
        assert_eq!(p.content, None);
        assert_eq!(p.calls[0].function.arguments, r#"{"a":1}"#);
    }

    #[test]
    fn a_call_cut_off_by_max_tokens_is_a_call_with_its_arguments_so_far_not_content() {
        let cut =
            "Looking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os";
        let p = parse_output(cut, true);
        assert_eq!(p.content.as_deref(), Some("Looking."));
        assert!(p.cut_call);
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].function.name, "get_weather");
        assert_eq!(p.calls[0].function.arguments, r#"{"city": "Os"#);
        // Cut right after the name: a call with no arguments yet.
        let p = parse_output("<tool_call>{\"name\":\"now\"", true);
        assert_eq!(
            (
                p.calls[0].function.name.as_str(),
                p.calls[0].function.arguments.as_str()
            ),
            ("now", "")
        );
        // Cut inside the name: no call, and no tags in the content either.
        let p = parse_output("Hm <tool_call>\n{\"name\": \"get_wea", true);
        assert_eq!(
            (p.content.as_deref(), p.calls.len(), p.cut_call),
            (Some("Hm"), 0, true)
        );
        // A complete call before it is kept as it is.
        let p = parse_output("<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call><tool_call>{\"name\":\"g\",\"arguments\":{\"x\":[1", true);
        let got: Vec<_> = p
            .calls
            .iter()
            .map(|c| (c.function.name.as_str(), c.function.arguments.as_str()))
            .collect();
        assert_eq!(got, [("f", "{}"), ("g", r#"{"x":[1"#)]);
        // Not cut off (the model ended its turn inside a call): the text stays the content.
        let p = parse_output(cut, false);
        assert_eq!((p.content.as_deref(), p.calls.len()), (Some(cut), 0));
        // Streamed the same way.
        let mut s = StreamSplitter::default();
        assert_eq!(s.push("Looking.\n"), "Looking.\n");
        assert_eq!(s.push(&cut["Looking.\n".len()..]), "");
        let (rest, calls) = s.finish("", true);
        assert_eq!((rest.as_str(), calls.len()), ("", 1));
        assert_eq!(calls[0].function.arguments, r#"{"city": "Os"#);
    }

    #[test]
    fn splitter_holds_back_a_possible_tag() {
        let mut s = StreamSplitter::default();
        assert_eq!(s.push("Hi <to"), "Hi ");
        assert_eq!(s.push("ol"), "");
        assert_eq!(s.push("_call>{\"name\":\"f\"}</tool"), "");
        assert_eq!(s.push("_call> more"), "");
        let (rest, calls) = s.finish("", false);
        assert_eq!(rest, "more");
        assert_eq!(calls.len(), 1);

        let mut s = StreamSplitter::default();
        assert_eq!(s.push("a <b"), "a <b");
        assert_eq!(s.push(" <"), " ");
        let (rest, calls) = s.finish("x", false);
        assert_eq!((rest.as_str(), calls.len()), ("<x", 0));
    }
}
