//! JSON numbers in constrained output carry at most [`MAX_DIGITS`] digits a part (integer,
//! fraction, exponent), as llama.cpp's JSON-schema grammars allow (`[1-9][0-9]{0,15}`,
//! `[0-9]{1,16}`): an f64 holds 17 significant digits, and a small model that starts repeating
//! digits would otherwise write them until `max_tokens` cuts the JSON off. llguidance's number
//! lexeme has no such bound, so [`NumberBound`] follows the JSON text (outside strings, a run
//! of digits is a number's part) and takes out of each mask the tokens that would lengthen a
//! run past the bound; what the grammar allows besides (`.`, `,`, `}`, `e`) ends the part.
//! Where only digits are allowed (a schema whose bounds need more), the mask is left whole.

use std::sync::Arc;

use toktrie::SimpleVob;

/// The most digits in a row a JSON number's part may have.
pub const MAX_DIGITS: usize = 16;

/// Where the JSON text stands, and each token's leading digits.
#[derive(Clone, Debug)]
pub struct NumberBound {
    /// The count of ASCII digits each token starts with (by token id).
    leading: Arc<[u8]>,
    in_string: bool,
    escaped: bool,
    /// Digits in a row at the end of the text, outside strings.
    run: usize,
}

impl NumberBound {
    /// A bound at the start of a JSON text; `leading` from [`leading_digits`].
    pub fn new(leading: Arc<[u8]>) -> Self {
        Self {
            leading,
            in_string: false,
            escaped: false,
            run: 0,
        }
    }

    /// Follows the text by `bytes`.
    pub fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                match (self.escaped, b) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_string = false,
                    _ => {}
                }
            } else if b.is_ascii_digit() {
                self.run += 1;
                continue;
            } else if b == b'"' {
                self.in_string = true;
            }
            self.run = 0;
        }
    }

    /// Takes out of `mask` the tokens that would carry the run of digits past [`MAX_DIGITS`],
    /// unless nothing else would be left.
    pub fn apply(&self, mask: &mut SimpleVob) {
        if self.in_string || self.run == 0 {
            return;
        }
        let mut long = Vec::new();
        mask.iter_set_entries(|t| {
            let lead = self.leading.get(t).copied().unwrap_or(0) as usize;
            if lead > 0 && self.run + lead > MAX_DIGITS {
                long.push(t as u32);
            }
        });
        if long.len() < mask.num_set() {
            long.into_iter().for_each(|t| mask.disallow_token(t));
        }
    }
}

/// The count of ASCII digits each token's bytes start with (at most 255).
pub fn leading_digits<'a>(tokens: impl Iterator<Item = &'a [u8]>) -> Arc<[u8]> {
    tokens
        .map(|bytes| {
            bytes
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count()
                .min(255) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens: 0 "1", 1 "23", 2 ",", 3 "\"", 4 "\\", 5 "x".
    fn bound() -> NumberBound {
        let vocab = ["1", "23", ",", "\"", "\\", "x"];
        NumberBound::new(leading_digits(vocab.iter().map(|s| s.as_bytes())))
    }

    /// What `b` leaves of a mask that allows every token.
    fn left(b: &NumberBound) -> SimpleVob {
        let mut m = SimpleVob::alloc_ones(6);
        b.apply(&mut m);
        m
    }

    #[test]
    fn a_number_part_stops_at_sixteen_digits_and_the_next_part_starts_afresh() {
        let mut b = bound();
        b.push(b"{\"v\":");
        b.push(&[b'7'; 15]);
        let m = left(&b);
        // 15 + "1" fits, 15 + "23" does not.
        assert!(m.is_allowed(0) && !m.is_allowed(1) && m.is_allowed(2));
        b.push(b"1");
        let m = left(&b);
        assert!(!m.is_allowed(0) && !m.is_allowed(1) && m.is_allowed(2) && m.is_allowed(5));
        b.push(b".");
        let m = left(&b);
        assert_eq!(m.num_set(), 6);
    }

    #[test]
    fn digits_in_strings_are_free_and_escaped_quotes_do_not_end_them() {
        let mut b = bound();
        b.push(b"{\"id\":\"a\\\"");
        b.push(&[b'9'; 40]);
        let m = left(&b);
        assert_eq!(m.num_set(), 6);
        // The string ends; a number after it is bounded again.
        b.push(b"\",\"n\":");
        b.push(&[b'9'; 16]);
        let m = left(&b);
        assert!(!m.is_allowed(0) && m.is_allowed(2));
    }

    #[test]
    fn a_mask_of_digits_only_is_left_whole() {
        let mut b = bound();
        b.push(&[b'5'; 16]);
        let mut m = SimpleVob::alloc(6);
        m.allow_token(0);
        m.allow_token(1);
        b.apply(&mut m);
        assert_eq!(m.num_set(), 2);
    }
}
