//! GPT-2's byte-level alphabet: every byte has a printable stand-in character, and BPE
//! vocabularies are written in those characters (a space is `Ġ`, a newline `Ċ`).

use std::sync::OnceLock;

/// Byte `b`'s stand-in character (GPT-2's `bytes_to_unicode`).
#[cfg(test)]
pub(crate) fn byte_to_char(b: u8) -> char {
    table().0[usize::from(b)]
}

/// The byte a stand-in character stands for; `None` for characters outside the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    table().1.get(&c).copied()
}

/// Decodes a byte-level vocabulary string to the bytes it stands for. A character outside the
/// alphabet (never the case in a well-formed vocabulary) is kept as its own UTF-8 bytes.
pub(crate) fn decode_piece(piece: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(piece.len());
    for c in piece.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

/// Encodes raw bytes in the byte-level alphabet (the inverse of [`decode_piece`]).
#[cfg(test)]
pub(crate) fn encode_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

type Table = ([char; 256], std::collections::HashMap<char, u8>);

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut forward = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            forward[usize::from(b)] = if printable(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        let backward = forward
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        (forward, backward)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips_and_matches_gpt2() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(b'\r'), 'č');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode_piece(&encode_bytes(&all)), all);
        assert_eq!(decode_piece("ĠcafÃ©"), " café".as_bytes());
    }
}
