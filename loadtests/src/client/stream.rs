//! The state of one response as its events arrive: content, tool calls, usage, failure.

use std::time::Instant;

use serde_json::Value;

use super::sample::{Outcome, Sample, ToolCall};

/// `(code, message)` of an OpenAI error object (`{"error": {...}}`'s inside, or a bare string).
pub(crate) fn error_fields(error: &Value) -> (Option<String>, String) {
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    match error {
        Value::Object(o) => (
            text(o.get("code")).or_else(|| text(o.get("type"))),
            text(o.get("message")).unwrap_or_else(|| error.to_string()),
        ),
        Value::String(s) => (None, s.clone()),
        other => (None, other.to_string()),
    }
}

pub(crate) fn clip(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Tool calls one response may carry. The `index` comes from the server and sizes the list:
/// unbounded, `u64::MAX` would overflow and `1e9` would allocate 48 GB.
const TOOL_CALLS_MAX: usize = 128;

/// A response's events so far: completions (`choices[].text`), chat deltas
/// (`choices[].delta.content`, `delta.tool_calls`) or a whole chat message (`choices[].message`).
#[derive(Debug)]
pub struct StreamState {
    start: Instant,
    first_content: Option<Instant>,
    content_chunks: u64,
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    done: bool,
    finished: bool,
    failure: Option<Outcome>,
    text: String,
    /// Tool calls by their `index`, pieces joined.
    tool_calls: Vec<ToolCall>,
}

impl StreamState {
    pub fn new(start: Instant) -> Self {
        Self {
            start,
            first_content: None,
            content_chunks: 0,
            completion_tokens: None,
            prompt_tokens: None,
            done: false,
            finished: false,
            failure: None,
            text: String::new(),
            tool_calls: Vec::new(),
        }
    }

    /// One event's data, received at `now`. Returns `false` once the stream has failed (an
    /// error event, or data that is not JSON).
    pub fn on_event(&mut self, data: &str, now: Instant) -> bool {
        if self.failure.is_some() {
            return false;
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return true;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.failure = Some(Outcome::Protocol(format!(
                    "bad SSE data ({e}): {}",
                    clip(data)
                )));
                return false;
            }
        };
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            let (code, message) = error_fields(err);
            self.failure = Some(Outcome::StreamError {
                code: code.unwrap_or_else(|| "unknown".into()),
                message,
            });
            return false;
        }
        let mut content = false;
        for choice in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let text = choice
                .get("text")
                .or_else(|| choice.pointer("/delta/content"))
                .or_else(|| choice.pointer("/message/content"))
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty());
            if let Some(t) = text {
                self.text.push_str(t);
                content = true;
            }
            let calls = choice
                .pointer("/delta/tool_calls")
                .or_else(|| choice.pointer("/message/tool_calls"))
                .and_then(Value::as_array);
            for (i, call) in calls.into_iter().flatten().enumerate() {
                if let Err(index) = self.tool_call_piece(call, i) {
                    self.failure = Some(Outcome::Protocol(format!(
                        "tool call index {index} is not below {TOOL_CALLS_MAX}"
                    )));
                    return false;
                }
                content = true;
            }
            self.finished |= choice.get("finish_reason").is_some_and(|r| !r.is_null());
        }
        if content {
            self.content_chunks += 1;
            self.first_content.get_or_insert(now);
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            if let Some(n) = usage.get("completion_tokens").and_then(Value::as_u64) {
                self.completion_tokens = Some(n);
            }
            if let Some(n) = usage.get("prompt_tokens").and_then(Value::as_u64) {
                self.prompt_tokens = Some(n);
            }
        }
        true
    }

    /// A streamed tool call arrives in pieces under one `index` (the name first, then the
    /// arguments in fragments); a whole message lists them in order. An index of
    /// [`TOOL_CALLS_MAX`] or more is the server's error, not a slot to allocate: `Err` with
    /// the index.
    fn tool_call_piece(&mut self, call: &Value, position: usize) -> Result<(), u64> {
        let index = call
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(position as u64);
        let index = usize::try_from(index)
            .ok()
            .filter(|&i| i < TOOL_CALLS_MAX)
            .ok_or(index)?;
        if self.tool_calls.len() <= index {
            self.tool_calls.resize(index + 1, ToolCall::default());
        }
        let slot = &mut self.tool_calls[index];
        if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
            slot.name.push_str(name);
        }
        match call.pointer("/function/arguments") {
            Some(Value::String(piece)) => slot.arguments.push_str(piece),
            // Some servers send the arguments as an object.
            Some(args @ Value::Object(_)) => slot.arguments.push_str(&args.to_string()),
            _ => {}
        }
        Ok(())
    }

    /// Whether the stream said all it had to (`[DONE]` or a finish reason, no failure).
    pub fn complete(&self) -> bool {
        self.failure.is_none() && (self.done || self.finished)
    }

    /// The sample, with the stream over at `end`.
    pub fn into_sample(self, end: Instant, queue_ms: Option<f64>) -> Sample {
        let outcome = match self.failure {
            Some(f) => f,
            None if self.done || self.finished => Outcome::Ok,
            None => Outcome::Incomplete,
        };
        Sample {
            outcome,
            ttft: self.first_content.map(|t| t - self.start),
            e2e: end - self.start,
            completion_tokens: self.completion_tokens,
            prompt_tokens: self.prompt_tokens,
            content_chunks: self.content_chunks,
            queue_ms,
            retry_after: None,
            retries: 0,
            text: self.text,
            tool_calls: self.tool_calls,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stream_state_counts_content_usage_and_errors() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"text":"","finish_reason":null}]}"#, at(5)));
        assert!(s.on_event(
            r#"{"choices":[{"text":"Hi","finish_reason":null}]}"#,
            at(10)
        ));
        assert!(s.on_event(
            r#"{"choices":[{"text":" there","finish_reason":null}]}"#,
            at(20)
        ));
        assert!(s.on_event(
            r#"{"choices":[{"text":"","finish_reason":"length"}]}"#,
            at(21)
        ));
        assert!(s.complete());
        assert!(s.on_event(
            r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#,
            at(22)
        ));
        assert!(s.on_event("[DONE]", at(23)));
        let sample = s.into_sample(at(30), Some(4.0));
        assert_eq!(sample.outcome, Outcome::Ok);
        assert_eq!(sample.ttft, Some(Duration::from_millis(10)));
        assert_eq!(sample.e2e, Duration::from_millis(30));
        assert_eq!((sample.content_chunks, sample.tokens()), (2, 3));
        assert_eq!(sample.prompt_tokens, Some(7));
        assert_eq!(sample.text, "Hi there");

        // Chat-style deltas count too; without usage the chunks are the tokens.
        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"delta":{"content":"a"}}]}"#, at(1)));
        assert!(s.on_event("[DONE]", at(2)));
        let sample = s.into_sample(at(2), None);
        assert_eq!((&sample.outcome, sample.tokens()), (&Outcome::Ok, 1));

        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"text":"a"}]}"#, at(1)));
        assert!(!s.on_event(
            r#"{"error":{"message":"kv full","type":"server_error","code":"internal_error"}}"#,
            at(2)
        ));
        let sample = s.into_sample(at(2), None);
        assert_eq!(sample.outcome.label(), "stream_error:internal_error");
        assert_eq!(sample.outcome.message(), "kv full");

        // llama.cpp's numeric codes.
        let mut s = StreamState::new(t0);
        assert!(!s.on_event(
            r#"{"error":{"code":500,"message":"x","type":"server_error"}}"#,
            at(1)
        ));
        assert_eq!(
            s.into_sample(at(1), None).outcome.label(),
            "stream_error:500"
        );

        let mut s = StreamState::new(t0);
        assert!(!s.on_event("not json", at(1)));
        assert_eq!(s.into_sample(at(1), None).outcome.label(), "protocol_error");

        let mut s = StreamState::new(t0);
        assert!(s.on_event(r#"{"choices":[{"text":"a","finish_reason":null}]}"#, at(1)));
        assert_eq!(s.into_sample(at(1), None).outcome, Outcome::Incomplete);
    }

    #[test]
    fn tool_calls_are_joined_from_deltas_or_read_from_a_message() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = StreamState::new(t0);
        let deltas = [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Oslo\"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ];
        for (i, d) in deltas.iter().enumerate() {
            assert!(s.on_event(d, at(10 + i as u64)));
        }
        let sample = s.into_sample(at(20), None);
        assert_eq!(sample.ttft, Some(Duration::from_millis(10)));
        assert_eq!(
            sample.tool_calls,
            [ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into()
            }]
        );

        let mut s = StreamState::new(t0);
        let whole = r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":{"x":1}}}]},"finish_reason":"tool_calls"}]}"#;
        assert!(s.on_event(whole, at(1)));
        let sample = s.into_sample(at(1), None);
        assert_eq!(sample.outcome, Outcome::Ok);
        assert_eq!(sample.tool_calls[0].arguments, r#"{"x":1}"#);
    }

    #[test]
    fn an_absurd_tool_call_index_is_a_protocol_error_not_a_panic() {
        let t0 = Instant::now();
        for index in ["18446744073709551615", "1000000000"] {
            let mut s = StreamState::new(t0);
            let delta = format!(
                r#"{{"choices":[{{"delta":{{"tool_calls":[{{"index":{index},"function":{{"name":"f"}}}}]}}}}]}}"#
            );
            assert!(!s.on_event(&delta, t0), "{index}");
            let sample = s.into_sample(t0, None);
            assert_eq!(sample.outcome.label(), "protocol_error", "{index}");
            assert!(sample.outcome.message().contains(index), "{index}");
            assert!(sample.tool_calls.is_empty(), "{index}");
        }
    }
}
