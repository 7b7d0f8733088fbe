//! Stop strings over streamed text: text that might be the start of a stop string is held back
//! until it is known not to be one, so a client never sees part of a stop string.

/// Watches streamed text for any of a set of stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Feeds new text. Returns the text safe to emit and whether a stop string was reached
    /// (the stop string and all after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        let keep = self.longest_partial_suffix();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (out, false)
    }

    /// What is still held back, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn longest_partial_suffix(&self) -> usize {
        let h = self.held.as_str();
        let mut best = 0;
        for s in &self.stops {
            for len in (1..s.len().min(h.len() + 1)).rev() {
                if len <= best {
                    break;
                }
                if h.is_char_boundary(h.len() - len)
                    && s.is_char_boundary(len)
                    && h.ends_with(&s[..len])
                {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_a_possible_stop_and_releases_it_when_it_is_not() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abc E"), ("abc ".into(), false));
        assert_eq!(m.push("N"), ("".into(), false));
        assert_eq!(m.push("x"), ("ENx".into(), false));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn stops_inside_a_chunk_and_drops_the_rest() {
        let mut m = StopMatcher::new(vec!["\n\n".into(), "STOP".into()]);
        assert_eq!(m.push("one\ntwo"), ("one\ntwo".into(), false));
        assert_eq!(m.push("\n"), ("".into(), false));
        assert_eq!(m.push("\nthree"), ("".into(), true));
    }

    #[test]
    fn multibyte_text_is_never_split() {
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("café"), ("caf".into(), false));
        assert_eq!(m.push("?"), ("é?".into(), false));
        assert_eq!(m.finish(), "");
    }
}
