//! Entry points for the fuzz targets (`fuzz/`), each of which must return for any input and
//! never panic, and the replay of the inputs that once crashed one (`fuzz/regressions/`), so an
//! ordinary `cargo test` re-checks them in seconds.

use std::path::{Path, PathBuf};

use crate::model::gguf::GgufFile;
use crate::transport::frame::read_frame;

/// The GGUF reader on arbitrary bytes: a header, metadata and tensor table it rejects or
/// reads, and every tensor's bytes, which must lie inside the file.
pub fn gguf(data: &[u8]) {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        for info in file.tensors() {
            let _ = file.tensor_bytes(info).len();
        }
        let _ = file.get_str_array("tokenizer.ggml.tokens");
    }
}

/// The transport's frame decoder on arbitrary bytes, frame after frame until it refuses.
pub fn frame(data: &[u8]) {
    let mut rest = data;
    while !rest.is_empty() && read_frame(&mut rest).is_ok() {}
}

/// The saved inputs of fuzz target `target`, with their paths.
pub fn regressions(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, Vec<u8>)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_gguf_and_frame_inputs_still_pass() {
        let gguf_inputs = regressions("gguf");
        let frame_inputs = regressions("frame");
        assert!(
            !gguf_inputs.is_empty() && !frame_inputs.is_empty(),
            "no saved inputs"
        );
        for (path, bytes) in gguf_inputs {
            eprintln!("{}", path.display());
            gguf(&bytes);
        }
        for (path, bytes) in frame_inputs {
            eprintln!("{}", path.display());
            frame(&bytes);
        }
    }
}
