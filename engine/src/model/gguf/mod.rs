//! GGUF files (versions 2 and 3): metadata, tensor infos and memory-mapped tensor data.
//!
//! The reader checks everything it is told against the file's real length, so a truncated or
//! corrupt file is an [`Error`](crate::Error), never a panic or an out-of-bounds read.

mod reader;
mod value;
pub mod writer;

pub use reader::{GgufFile, TensorInfo};
pub use value::MetaValue;

/// `"GGUF"` read as a little-endian u32.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

#[cfg(test)]
mod tests;
