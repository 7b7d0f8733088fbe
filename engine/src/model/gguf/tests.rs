//! The reader against files the writer makes, intact and damaged.

use super::writer::GgufWriter;
use super::{GgufFile, MetaValue};
use crate::dtype::GgmlType;
use crate::error::Error;

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.block_count", MetaValue::U32(2))
        .meta("llama.rope.freq_base", MetaValue::F32(100_000.0))
        .meta("flag", MetaValue::Bool(true))
        .meta(
            "tokens",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        )
        .meta(
            "types",
            MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(3)]),
        )
        .tensor(
            "norm",
            &[4],
            GgmlType::F32,
            [1.0f32, 2.0, 3.0, 4.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        )
        .tensor("w", &[32, 2], GgmlType::Q8_0, vec![7; 68]);
    w
}

#[test]
fn reads_metadata_and_tensors_v3_and_v2() {
    for version in [2, 3] {
        let f = GgufFile::from_bytes(sample().version(version).to_bytes()).unwrap();
        assert_eq!(f.version(), version);
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get_u64("llama.block_count").unwrap(), 2);
        assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100_000.0);
        assert_eq!(f.get("flag").unwrap(), &MetaValue::Bool(true));
        assert_eq!(f.get_str_array("tokens").unwrap(), vec!["a", "b"]);
        assert_eq!(f.get_i64_array("types").unwrap(), vec![1, 3]);
        let (info, bytes) = f.tensor("norm").unwrap();
        assert_eq!(
            (info.dtype, info.shape.as_slice()),
            (GgmlType::F32, &[4u64][..])
        );
        assert_eq!(&bytes[4..8], &2.0f32.to_le_bytes());
        let (info, bytes) = f.tensor("w").unwrap();
        assert_eq!((info.n_elements(), bytes.len()), (64, 68));
        assert_eq!(info.offset % 32, 0, "tensor data is aligned");
    }
}

#[test]
fn wrong_types_and_missing_keys_are_named() {
    let f = GgufFile::from_bytes(sample().to_bytes()).unwrap();
    assert!(matches!(
        f.get_u64("general.architecture"),
        Err(Error::MetadataType { .. })
    ));
    assert!(matches!(f.get_str("nope"), Err(Error::MissingMetadata(k)) if k == "nope"));
    assert!(matches!(f.tensor("nope"), Err(Error::MissingTensor(_))));
}

#[test]
fn bad_magic_and_version() {
    let mut b = sample().to_bytes();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(GgufFile::from_bytes(b), Err(Error::BadMagic(_))));
    let b = sample().version(1).to_bytes();
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(Error::UnsupportedVersion(1))
    ));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let full = sample().to_bytes();
    for len in 0..full.len() {
        let r = GgufFile::from_bytes(full[..len].to_vec());
        assert!(
            r.is_err(),
            "a file cut at {len} of {} bytes was accepted",
            full.len()
        );
    }
}

#[test]
fn unknown_tensor_type_is_named() {
    let mut b = sample().to_bytes();
    // The first tensor's type id follows its name and its one dimension.
    let at = find(&b, b"norm") + 4 + 4 + 8;
    assert_eq!(u32::from_le_bytes(b[at..at + 4].try_into().unwrap()), 0);
    b[at..at + 4].copy_from_slice(&2u32.to_le_bytes()); // Q4_0: not supported
    let err = GgufFile::from_bytes(b).unwrap_err();
    assert!(matches!(err, Error::UnsupportedTensorType(2)), "{err}");
    assert!(
        err.to_string().contains("Q4_1"),
        "the message lists what is supported: {err}"
    );
}

#[test]
fn corrupt_fields_are_errors() {
    // A huge string length.
    let mut b = sample().to_bytes();
    let at = find(&b, b"general.architecture") - 8;
    b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(GgufFile::from_bytes(b), Err(Error::Truncated(_))));
    // An unknown metadata value type.
    let mut b = sample().to_bytes();
    let at = find(&b, b"general.architecture") + "general.architecture".len();
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(GgufFile::from_bytes(b), Err(Error::Corrupt(_))));
    // A tensor count no file could hold.
    let mut b = sample().to_bytes();
    b[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(GgufFile::from_bytes(b).is_err());
    // A tensor whose data runs past the end.
    let mut b = sample().to_bytes();
    let at = find(&b, b"\x01\x00\x00\x00\x00\x00\x00\x00w") + 9 + 4 + 16 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(GgufFile::from_bytes(b), Err(Error::Truncated(_))));
}

#[test]
fn fuzzed_bytes_never_panic() {
    let full = sample().to_bytes();
    let mut state = 0x1234_5678u64;
    for _ in 0..2000 {
        let mut b = full.clone();
        for _ in 0..4 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let i = (state >> 33) as usize % b.len();
            b[i] = (state >> 20) as u8;
        }
        let _ = GgufFile::from_bytes(b);
    }
}

#[test]
fn open_missing_file_names_the_fetch_command() {
    let err = GgufFile::open(std::path::Path::new("/nonexistent/model.gguf")).unwrap_err();
    assert!(err.to_string().contains("fetch-model"), "{err}");
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle present")
}
