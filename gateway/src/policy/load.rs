//! Reading a policy file: parse, validate, hash.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::guard::{Admitted, Guard};
use super::redact;
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
    /// Keys the file changed that need a restart (held at their running values; see
    /// [`super::guard`]).
    pub restart_pending: Vec<String>,
    /// What the reload that put this policy in force changed in who may call and how much
    /// (tenants, keys, classes, limits, the admin key, `server.open`; see [`super::guard`]).
    pub access_changes: Vec<String>,
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
            restart_pending: Vec::new(),
            access_changes: Vec::new(),
        }
    }

    /// Reads, parses and validates `path`. Every error starts with the path; syntax, type and
    /// range errors go on with the line and column.
    pub fn from_file(path: &Path) -> Result<Self, PolicyError> {
        let bytes = std::fs::read(path)
            .map_err(|e| PolicyError::new(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&bytes, Some(path))
    }

    /// Parses and validates file contents already read (the reloader hashes them first).
    pub fn from_bytes(bytes: &[u8], path: Option<&Path>) -> Result<Self, PolicyError> {
        let prefix = |m: &str| match path {
            Some(p) => PolicyError::new(format!("{}: {m}", p.display())),
            None => PolicyError::new(m),
        };
        let text = std::str::from_utf8(bytes).map_err(|e| prefix(&format!("not UTF-8: {e}")))?;
        let policy = parse(text).map_err(|e| prefix(&e.message))?;
        Ok(Self {
            policy,
            sha256: hex_sha256(bytes),
            loaded_at: SystemTime::now(),
            path: path.map(Path::to_owned),
            restart_pending: Vec::new(),
            access_changes: Vec::new(),
        })
    }
}

/// What `sluice policy check FILE` runs: the same load, with the same errors, as a reload.
/// On success the CLI prints `ok <sha256>`.
pub fn check_file(path: &Path) -> Result<LoadedPolicy, PolicyError> {
    LoadedPolicy::from_file(path)
}

/// What `sluice policy check NEW --against RUNNING` runs: NEW loaded as a reload over RUNNING
/// would load it, under the same rules (see [`super::guard`]) for a gateway listening on
/// RUNNING's `server.listen`: what goes in force, the keys that wait for a restart, and the
/// changes in who may call and how much; or why the reload would be refused.
pub fn check_reload(new: &Path, running: &Path) -> Result<(LoadedPolicy, Admitted), PolicyError> {
    let running = LoadedPolicy::from_file(running)?;
    let loaded = LoadedPolicy::from_file(new)?;
    let admitted = Guard::new(running.policy.server.listen)
        .admit(&running.policy, loaded.policy.clone())
        .map_err(|e| PolicyError::new(format!("{}: {e}", new.display())))?;
    Ok((loaded, admitted))
}

/// Parses and validates policy text; errors name the line and column.
pub fn parse(text: &str) -> Result<Policy, PolicyError> {
    let policy: Policy = toml::from_str(text).map_err(|e| {
        // Where, and under which key: a value of the wrong type or form names its key as
        // validation's problems do (`line 3, column 16: server.probe_listen: invalid socket
        // address syntax`), not just its place.
        let at = e
            .span()
            .map(|s| {
                let (l, c) = line_col(text, s.start);
                match key_at(text, s.start) {
                    Some(key) => format!("line {l}, column {c}: {key}: "),
                    None => format!("line {l}, column {c}: "),
                }
            })
            .unwrap_or_default();
        // The parser quotes a value it refused (`invalid type: string "https://…", expected a
        // sequence`): a URL in it is shown by its host alone, as validation shows webhooks.
        PolicyError::new(format!("{at}{}", redact::urls_in(e.message())))
    })?;
    let problems = validate::problems(&policy);
    if problems.is_empty() {
        return Ok(policy);
    }
    let text: Vec<String> = problems
        .iter()
        .map(|p| match locate(text, &p.key) {
            Some((l, c)) => format!("line {l}, column {c}: {p}"),
            None => p.to_string(),
        })
        .collect();
    Err(PolicyError::new(text.join("; ")))
}

/// Line and column of the value at `key` (`admission.active_max`, `tenants[1].name`) in
/// `text`, or of its nearest enclosing table or array written in the file; none when not even
/// the top-level table of `key` is.
fn locate(text: &str, key: &str) -> Option<(usize, usize)> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut found: Option<usize> = None;
    let mut value: Option<&toml::Spanned<toml::de::DeValue<'_>>> = None;
    for segment in key.split('.') {
        let (name, index) = match segment.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let table = match value.map(toml::Spanned::get_ref) {
            None => doc.get_ref(),
            Some(toml::de::DeValue::Table(t)) => t,
            Some(_) => break,
        };
        let Some((_, v)) = table.iter().find(|(k, _)| k.get_ref().as_ref() == name) else {
            break;
        };
        found = Some(v.span().start);
        value = Some(v);
        if let Some(i) = index {
            let Some(item) = (match v.get_ref() {
                toml::de::DeValue::Array(items) => items.get(i),
                _ => None,
            }) else {
                break;
            };
            found = Some(item.span().start);
            value = Some(item);
        }
    }
    found.map(|offset| line_col(text, offset))
}

/// The key (`server.probe_listen`, `tenants[1].class`) whose value holds byte `offset` of
/// `text`: the inverse of [`locate`]. None when the offset is in no value (a syntax error, or
/// an unknown key, whose span is the key itself), or when the text does not parse as TOML.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut path = Vec::new();
    value_at(doc.get_ref(), offset, &mut path).then(|| path.concat())
}

/// Whether a value under `table` holds `offset`; if so `path` ends with the segments down to
/// it. A table's own span may be its `[header]` alone, so every table is searched whatever its
/// span; a plain value (or an array item that is not a table) must hold the offset itself.
fn value_at(table: &toml::de::DeTable<'_>, offset: usize, path: &mut Vec<String>) -> bool {
    use toml::de::DeValue;
    table.iter().any(|(name, v)| {
        let dot = if path.is_empty() { "" } else { "." };
        below(path, format!("{dot}{}", name.get_ref()), |path| {
            match v.get_ref() {
                DeValue::Table(t) => value_at(t, offset, path),
                DeValue::Array(items) => items.iter().enumerate().any(|(i, item)| {
                    below(path, format!("[{i}]"), |path| match item.get_ref() {
                        DeValue::Table(t) => value_at(t, offset, path),
                        _ => item.span().contains(&offset),
                    })
                }),
                _ => v.span().contains(&offset),
            }
        })
    })
}

/// `segment` pushed onto `path` while `found` looks below it, and kept only if it finds.
fn below(
    path: &mut Vec<String>,
    segment: String,
    found: impl FnOnce(&mut Vec<String>) -> bool,
) -> bool {
    path.push(segment);
    let hit = found(path);
    if !hit {
        path.pop();
    }
    hit
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
