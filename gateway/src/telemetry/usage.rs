//! Reading `"completion_tokens": N` out of a response as it streams past (the JSON body of a
//! whole answer, or the usage chunk of a stream), without buffering it.

/// The key looked for.
const KEY: &[u8] = b"\"completion_tokens\":";
/// Bytes kept between frames: a key and its number may straddle two.
const TAIL: usize = KEY.len() + 24;

/// Scans a body's bytes for the last completion-token count.
#[derive(Clone, Debug, Default)]
pub struct UsageScanner {
    tail: Vec<u8>,
    completion_tokens: Option<u64>,
}

impl UsageScanner {
    /// Scans the next piece of the body.
    pub fn push(&mut self, data: &[u8]) {
        self.tail.extend_from_slice(data);
        let mut i = 0;
        while let Some(pos) = find(&self.tail[i..], KEY) {
            let start = i + pos + KEY.len();
            if let Some(n) = number(&self.tail[start..]) {
                self.completion_tokens = Some(n);
            }
            i = start;
        }
        let keep = self.tail.len().saturating_sub(TAIL);
        self.tail.drain(..keep);
    }

    /// The last count seen.
    pub fn completion_tokens(&self) -> Option<u64> {
        self.completion_tokens
    }
}

/// The whole number at the start of `b` (after blanks), if it has one that fits.
fn number(b: &[u8]) -> Option<u64> {
    let digits = b
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit());
    let mut n = None;
    for d in digits {
        n = Some(
            n.unwrap_or(0u64)
                .checked_mul(10)?
                .checked_add(u64::from(d - b'0'))?,
        );
    }
    n
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_count_whole_split_and_spaced() {
        let mut s = UsageScanner::default();
        s.push(br#"{"usage":{"prompt_tokens":5,"completion_tokens":12}}"#);
        assert_eq!(s.completion_tokens(), Some(12));
        let mut s = UsageScanner::default();
        s.push(b"data: {\"usage\":{\"completion_tok");
        s.push(b"ens\": 42}}\n\ndata: [DONE]");
        assert_eq!(s.completion_tokens(), Some(42));
        let mut s = UsageScanner::default();
        s.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}");
        assert_eq!(s.completion_tokens(), None);
    }
}
