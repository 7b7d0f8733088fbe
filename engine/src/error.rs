//! The engine's one error type.

use std::path::PathBuf;

/// Everything that can go wrong inside the engine library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("model file {path} not found; run `scripts/fetch-model.sh` (or `make fetch-model`) to download it")]
    ModelNotFound { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: bad magic {0:02x?} (expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("GGUF file is truncated: {0}")]
    Truncated(String),
    #[error("GGUF file is corrupt: {0}")]
    Corrupt(String),
    #[error("unsupported tensor type id {0} (supported: F32, F16, BF16, Q4_1, Q8_0)")]
    UnsupportedTensorType(u32),
    #[error("unsupported model architecture {0:?} (supported: \"llama\")")]
    UnsupportedArchitecture(String),
    #[error("missing GGUF metadata key {0:?}")]
    MissingMetadata(String),
    #[error("GGUF metadata key {key:?} has the wrong type: expected {expected}")]
    MetadataType { key: String, expected: &'static str },
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        actual: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("KV cache is out of blocks: need {needed}, {free} free")]
    OutOfKvBlocks { needed: usize, free: usize },
    #[error("the {0} backend is not compiled into this binary (rebuild with `--features {0}`)")]
    BackendNotCompiled(&'static str),
    #[error("--device cuda: {0}")]
    CudaUnavailable(String),
    #[error("transport: {0}")]
    Transport(String),
    #[error("handshake refused: {0}")]
    HandshakeRefused(String),
    #[error("peer {peer} went away: {reason}")]
    PeerGone { peer: String, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes on one line, `outer: inner: innermost` (hyper's and minijinja's own
/// messages alone say little).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// `fut`'s output, or the message of a panic while it ran (a bug): servers answer such a
/// request with a 500 instead of dropping its connection. The future is not used again after
/// a panic, so whatever state it left broken goes with it.
pub async fn caught<F: std::future::Future>(fut: F) -> Result<F::Output, String> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::task::Poll;
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(panic.as_ref()))),
        },
    )
    .await
}

/// The text of a panic's payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

/// Whether `e`, or an error under it, is standard output's reader having gone (`… | head`): the
/// command lines (`sluice-engine`, `sluice`, `sluice-load`) then end quietly, as any Unix
/// filter does, instead of reporting it (and `println!` would have panicked).
pub fn is_closed_stdout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        next = e.source();
    }
    false
}
