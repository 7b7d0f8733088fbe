use super::test_support::{byte_id, merged_id, toy_gguf_with, toy_tokenizer};
use super::Tokenizer;
use crate::error::Error;

fn bytes_ids(s: &str) -> Vec<u32> {
    s.bytes().map(byte_id).collect()
}

#[test]
fn encodes_with_merges_and_decodes() {
    let tk = toy_tokenizer();
    let ids = tk.encode("hello world", true).expect("encode");
    assert_eq!(ids, vec![merged_id("hello"), merged_id("Ġworld")]);
    assert_eq!(tk.decode(&ids, false).expect("decode"), "hello world");
    assert_eq!(tk.encode("", true).expect("encode"), Vec::<u32>::new());
    assert_eq!(tk.encode("", false).expect("encode"), Vec::<u32>::new());
    assert_eq!(tk.decode(&[], true).expect("decode"), "");
}

#[test]
fn smollm_splits_digits_one_by_one_but_gpt2_does_not() {
    let tk = toy_tokenizer();
    assert_eq!(tk.encode("12", true).expect("encode"), bytes_ids("12"));
    let gpt2 = Tokenizer::from_gguf(&toy_gguf_with("gpt2", "gpt-2")).expect("gpt2 pre");
    assert_eq!(
        gpt2.encode("12", true).expect("encode"),
        vec![merged_id("12")]
    );
}

#[test]
fn multibyte_characters() {
    let tk = toy_tokenizer();
    // "é" is C3 A9, merged into one token; "🎉" (F0 9F 8E 89) stays four byte tokens.
    let ids = tk.encode("é🎉", true).expect("encode");
    let mut expected = vec![merged_id("Ã©")];
    expected.extend(bytes_ids("🎉"));
    assert_eq!(ids, expected);
    assert_eq!(
        tk.token_bytes(merged_id("Ã©")),
        Some("é".as_bytes().to_vec())
    );
    assert_eq!(tk.token_bytes(byte_id(0xF0)), Some(vec![0xF0]));
    assert_eq!(tk.decode(&ids, true).expect("decode"), "é🎉");
    // A lone continuation byte decodes lossily.
    assert_eq!(
        tk.decode(&[byte_id(0xA9), byte_id(b'a')], true)
            .expect("decode"),
        "\u{FFFD}a"
    );
}

#[test]
fn special_tokens_parsed_only_when_asked() {
    let tk = toy_tokenizer();
    let text = "<|im_start|>hello<|im_end|>";
    assert_eq!(
        tk.encode(text, true).expect("encode"),
        vec![1, merged_id("hello"), 2]
    );
    let plain = tk.encode(text, false).expect("encode");
    assert!(plain.iter().all(|&id| id >= 4), "{plain:?}");
    assert!(plain.contains(&merged_id("hello")));
    assert_eq!(tk.decode(&plain, true).expect("decode"), text);
    // User-defined tokens are always matched, and always decoded.
    assert_eq!(tk.encode("<tool>", false).expect("encode"), vec![3]);
    assert_eq!(tk.encode("<tool>", true).expect("encode"), vec![3]);
    assert_eq!(tk.decode(&[3], true).expect("decode"), "<tool>");
}

#[test]
fn decode_skips_special_tokens_on_request() {
    let tk = toy_tokenizer();
    let ids = [1, merged_id("hello"), 2, 0];
    assert_eq!(
        tk.decode(&ids, false).expect("decode"),
        "<|im_start|>hello<|im_end|><|endoftext|>"
    );
    assert_eq!(tk.decode(&ids, true).expect("decode"), "hello");
    assert!(matches!(
        tk.decode(&[100_000], true),
        Err(Error::Tokenizer(_))
    ));
}

#[test]
fn token_metadata() {
    let tk = toy_tokenizer();
    assert_eq!(tk.vocab_size(), 4 + 256 + super::test_support::MERGES.len());
    assert_eq!(tk.bos_id(), Some(1));
    assert_eq!(tk.eos_id(), 2);
    assert_eq!(tk.pad_id(), Some(2));
    assert!(!tk.add_bos());
    assert!(tk.is_special(0) && tk.is_special(1) && tk.is_special(2));
    assert!(!tk.is_special(3) && !tk.is_special(byte_id(b'a')) && !tk.is_special(1_000_000));
    assert_eq!(tk.token_id("<|im_end|>"), Some(2));
    assert_eq!(tk.token_id("Ġworld"), Some(merged_id("Ġworld")));
    assert_eq!(tk.token_id("nope"), None);
    assert_eq!(tk.stop_ids(), vec![2, 0]);
    assert!(tk.is_stop(0) && tk.is_stop(2) && !tk.is_stop(1));
    assert_eq!(tk.token_bytes(2), Some(b"<|im_end|>".to_vec()));
    assert_eq!(tk.token_bytes(byte_id(b' ')), Some(b" ".to_vec()));
    assert_eq!(
        tk.token_bytes(merged_id("Ġworld")),
        Some(b" world".to_vec())
    );
    assert_eq!(tk.token_bytes(1_000_000), None);
    assert_eq!(tk.inner().get_vocab_size(true), tk.vocab_size());
}

#[test]
fn whitespace_and_control_characters_round_trip() {
    let tk = toy_tokenizer();
    for text in ["  a  b ", "tab\tx\r\ny\n\n", " \u{a0}x", "x   "] {
        let ids = tk.encode(text, true).expect("encode");
        assert_eq!(tk.decode(&ids, false).expect("decode"), text);
    }
}

#[test]
fn rejects_unsupported_models() {
    let err = Tokenizer::from_gguf(&toy_gguf_with("llama", "smollm")).expect_err("llama model");
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.contains("\"llama\"")),
        "{err}"
    );
    let err = Tokenizer::from_gguf(&toy_gguf_with("gpt2", "qwen2")).expect_err("qwen2 pre");
    assert!(
        matches!(&err, Error::Tokenizer(m) if m.contains("\"qwen2\"")),
        "{err}"
    );
}

/// The remembered pieces give the library's own ids, first seen and seen again, for texts with
/// special and user-defined tokens, digits, blanks and multibyte characters, either way of
/// treating special tokens, with both pre-tokenizers.
#[test]
fn remembered_pieces_give_the_librarys_ids() {
    let texts = [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
        "hello world  hello\tworld\n\n  12 345 é🎉",
        "<tool>{\"a\": 12}</tool><|im_end|><|im_end|>  <|endoftext|>x",
        "  leading and trailing  ",
        "",
        "<|im_start|>",
        "a<|im_start|>b<tool>c<|im_end|>d",
    ];
    let gpt2 = Tokenizer::from_gguf(&toy_gguf_with("gpt2", "gpt-2")).expect("gpt2 pre");
    for tk in [toy_tokenizer(), gpt2] {
        for special in [true, false] {
            let lib = if special { &tk.inner } else { &tk.plain };
            for text in texts {
                let want = lib
                    .encode_fast(text, false)
                    .expect("encode")
                    .get_ids()
                    .to_vec();
                for round in ["first", "again"] {
                    assert_eq!(
                        tk.encode(text, special).expect("encode"),
                        want,
                        "{round}: {text:?}"
                    );
                }
            }
        }
    }
}
