//! Which pieces of a response carry generated output: the first of them ends the prefill, and
//! each is one step of the decode.
//!
//! A stream's first event is not its first token: the bundled engine sends the chat role
//! (`"delta":{"role":"assistant","content":""}`) as soon as it accepts the request, before
//! any prefill. Taking that event for the first token made every prefill look instant to the
//! cost model (and freed the prefill budget at once). So an event counts as output only when
//! its choice carries non-empty `content`, `text` or `reasoning_content`, or tool calls; a
//! choice with a `finish_reason` ends the prefill even when the text was all held back.

/// What one piece of the body carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Events (or whole answers) with generated output.
    pub tokens: usize,
    /// Some choice finished (its output, if any, is over).
    pub finished: bool,
}

impl Output {
    /// Whether the upstream is past the prefill once this piece went by.
    pub fn past_prefill(&self) -> bool {
        self.tokens > 0 || self.finished
    }
}

const CHOICES: &[u8] = b"\"choices\":";
/// Keys whose non-empty string value is generated text.
const TEXT_KEYS: [&[u8]; 3] = [b"\"content\":", b"\"text\":", b"\"reasoning_content\":"];
const TOOL_CALLS: &[u8] = b"\"tool_calls\":";
const FINISH: &[u8] = b"\"finish_reason\":";

/// Scans one piece of a response (one or more `data:` events of a stream, or a whole JSON
/// answer). Events are split at blank lines; one cut by a frame boundary is judged by the part
/// holding its choice.
pub fn scan(data: &[u8]) -> Output {
    let mut out = Output::default();
    for event in split_events(data) {
        let has_choice = values(event, CHOICES).any(|v| {
            v.strip_prefix(b"[")
                .is_some_and(|v| skip_ws(v).starts_with(b"{"))
        });
        if !has_choice {
            continue;
        }
        let text = TEXT_KEYS
            .iter()
            .any(|k| values(event, k).any(|v| v.starts_with(b"\"") && !v.starts_with(b"\"\"")));
        let tools = values(event, TOOL_CALLS).any(|v| v.starts_with(b"[{"));
        if text || tools {
            out.tokens += 1;
        }
        out.finished |= values(event, FINISH).any(|v| v.starts_with(b"\""));
    }
    out
}

fn split_events(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (event, next) = match find(rest, b"\n\n") {
            Some(i) => (&rest[..i], &rest[i + 2..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        Some(event)
    })
}

/// The bytes after each `key` (whitespace skipped).
fn values<'a>(hay: &'a [u8], key: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let mut from = 0;
    std::iter::from_fn(move || {
        let at = from + find(&hay[from..], key)?;
        from = at + key.len();
        Some(skip_ws(&hay[from..]))
    })
}

fn skip_ws(v: &[u8]) -> &[u8] {
    let n = v.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &v[n..]
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bundled engine's chat stream, as sent (ids and times shortened).
    const ROLE: &[u8] = br#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
    const TOKEN: &[u8] = br#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}"#;
    const FINISH_CHUNK: &[u8] = br#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#;
    const USAGE: &[u8] =
        br#"data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#;

    fn events(parts: &[&[u8]]) -> Vec<u8> {
        parts.iter().flat_map(|p| [*p, b"\n\n"].concat()).collect()
    }

    #[test]
    fn the_role_event_is_not_a_token() {
        assert_eq!(scan(&events(&[ROLE])), Output::default());
        assert!(!scan(&events(&[ROLE])).past_prefill());
        let t = scan(&events(&[TOKEN]));
        assert_eq!((t.tokens, t.finished), (1, false));
        assert!(t.past_prefill());
        // Several events in one frame, the usage chunk and [DONE] counting for nothing.
        let all = scan(&events(&[
            ROLE,
            TOKEN,
            TOKEN,
            FINISH_CHUNK,
            USAGE,
            b"data: [DONE]",
        ]));
        assert_eq!((all.tokens, all.finished), (2, true));
    }

    #[test]
    fn completions_tool_calls_spaced_json_and_whole_answers() {
        let text = br#"data: {"choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}]}"#;
        let empty = br#"data: {"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}"#;
        assert_eq!(scan(text).tokens, 1);
        assert_eq!(
            scan(empty),
            Output {
                tokens: 0,
                finished: true
            }
        );
        let tools = br#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0"}]}}]}"#;
        assert_eq!(scan(tools).tokens, 1);
        let spaced = br#"data: {"choices": [ {"delta": {"content": "x"}}]}"#;
        assert_eq!(scan(spaced).tokens, 1);
        // Log-probabilities' `content` is a list, not text.
        let lp = br#"data: {"choices":[{"delta":{"content":""},"logprobs":{"content":[]}}]}"#;
        assert_eq!(scan(lp).tokens, 0);
        let whole = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}]}"#;
        assert_eq!(
            scan(whole),
            Output {
                tokens: 1,
                finished: true
            }
        );
        let error = br#"{"error":{"message":"nope","type":"invalid_request_error"}}"#;
        assert!(!scan(error).past_prefill());
    }
}
