//! Reading a policy file: parse, validate, hash.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::schema::Policy;
use super::validate;

/// A policy that parsed and validated, with where it came from.
#[derive(Clone, Debug)]
pub struct LoadedPolicy {
    pub policy: Policy,
    /// Lowercase hex SHA-256 of the file's bytes.
    pub sha256: String,
    pub loaded_at: SystemTime,
    /// The file; none for the built-in defaults.
    pub path: Option<PathBuf>,
}

/// Why a policy was refused; the message names the file, line and column where it can.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct PolicyError {
    pub message: String,
}

impl PolicyError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl LoadedPolicy {
    /// The built-in defaults (no file).
    pub fn defaults() -> Self {
        Self {
            policy: Policy::default(),
            sha256: hex_sha256(b""),
            loaded_at: SystemTime::now(),
            path: None,
        }
    }

    /// Reads, parses and validates `path`.
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let bytes = std::fs::read(path)
            .map_err(|e| PolicyError::new(format!("{}: {e}", path.display())))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| PolicyError::new(format!("{}: not UTF-8: {e}", path.display())))?;
        let policy = parse(text)
            .map_err(|e| PolicyError::new(format!("{}: {}", path.display(), e.message)))?;
        Ok(Self {
            policy,
            sha256: hex_sha256(&bytes),
            loaded_at: SystemTime::now(),
            path: Some(path.to_owned()),
        })
    }
}

/// Parses and validates policy text; errors name the line and column.
pub fn parse(text: &str) -> Result<Policy, PolicyError> {
    let policy: Policy = toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| line_col(text, s.start))
            .map(|(l, c)| format!("line {l}, column {c}: "))
            .unwrap_or_default();
        PolicyError::new(format!("{at}{}", e.message()))
    })?;
    validate::check(&policy)?;
    Ok(policy)
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rfind('\n').map_or(before.len(), |i| before.len() - i - 1) + 1;
    (line, col)
}

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
