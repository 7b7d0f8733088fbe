//! `text/event-stream` framing: the `data` of each event, however the bytes are cut.

/// Splits a `text/event-stream` body into the `data` of its events, however the bytes are cut
/// into frames. Other fields (`event:`, `id:`) and comments are ignored.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut consumed = 0;
        while let Some(nl) = self.buf[consumed..].iter().position(|&b| b == b'\n') {
            let line = &self.buf[consumed..consumed + nl];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            sse_line(&String::from_utf8_lossy(line), &mut self.data, &mut events);
            consumed += nl + 1;
        }
        self.buf.drain(..consumed);
        events
    }

    /// The end of the body: an event left without its closing blank line.
    pub fn finish(&mut self) -> Option<String> {
        if !self.buf.is_empty() {
            let line = std::mem::take(&mut self.buf);
            let mut events = Vec::new();
            sse_line(&String::from_utf8_lossy(&line), &mut self.data, &mut events);
        }
        self.data.take()
    }
}

fn sse_line(line: &str, data: &mut Option<String>, events: &mut Vec<String>) {
    if line.is_empty() {
        events.extend(data.take());
    } else if let Some(rest) = line.strip_prefix("data:") {
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        match data {
            Some(d) => {
                d.push('\n');
                d.push_str(rest);
            }
            None => *data = Some(rest.to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_survive_any_split() {
        let body = "data: {\"a\":1}\n\ndata: {\"b\":\n: comment\nevent: x\ndata: 2}\r\n\r\ndata: [DONE]\n\n";
        let want = vec!["{\"a\":1}", "{\"b\":\n2}", "[DONE]"];
        for cut in 0..body.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&body.as_bytes()[..cut]);
            got.extend(p.push(&body.as_bytes()[cut..]));
            got.extend(p.finish());
            assert_eq!(got, want, "cut at {cut}");
        }
        // One byte at a time, and a last event without its blank line.
        let mut p = SseParser::default();
        let mut got = Vec::new();
        for b in "data: x\n\ndata: y".bytes() {
            got.extend(p.push(&[b]));
        }
        got.extend(p.finish());
        assert_eq!(got, vec!["x", "y"]);
    }
}
