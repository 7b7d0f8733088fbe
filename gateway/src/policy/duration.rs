//! Durations written as strings (`"30s"`, `"1m 30s"`, `"250ms"`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?}: {e} (write it like \"30s\", \"2m\" or \"500ms\")"
        ))
    })
}

pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}
