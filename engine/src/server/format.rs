//! Reading what the output must be: OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema`), vLLM's older `guided_json` and its `structured_outputs` (`json`, `regex`,
//! `choice`, `grammar`, `json_object`). At most one of the three may constrain a request.

use serde_json::Value;

use super::error::ApiError;
use super::fields::{self, JSON_SCHEMA, PLAIN_FORMAT, SCHEMA_FORMAT};
use super::parse::Obj;
use super::types::Format;

pub(super) fn parse(o: &Obj) -> Result<Option<Format>, ApiError> {
    let found = [
        response_format(o)?.map(|f| ("response_format", f)),
        guided_json(o)?.map(|f| ("guided_json", f)),
        structured_outputs(o)?.map(|f| ("structured_outputs", f)),
    ];
    let mut given = found.into_iter().flatten();
    let first = given.next();
    if let (Some((a, _)), Some((b, _))) = (&first, given.next()) {
        return Err(ApiError::invalid(
            b.to_string(),
            format!("{b}: only one of {a} and {b} may constrain the output"),
        ));
    }
    Ok(first.map(|(_, f)| f))
}

fn schema_value(v: &Value, path: &str) -> Result<Value, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        // vLLM takes the schema as JSON text too.
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid(path, format!("{path}: not a JSON schema: {e}"))),
        _ => Err(ApiError::expected(path, "a JSON schema object")),
    }
}

fn response_format(o: &Obj) -> Result<Option<Format>, ApiError> {
    let Some(rf) = o.object("response_format", "an object")? else {
        return Ok(None);
    };
    let kind = rf.str("type")?;
    match rf.required("type", kind)? {
        "text" => fields::check_object(&rf, PLAIN_FORMAT).map(|()| None),
        "json_object" => fields::check_object(&rf, PLAIN_FORMAT).map(|()| Some(Format::JsonObject)),
        "json_schema" => {
            fields::check_object(&rf, SCHEMA_FORMAT)?;
            let js = rf.object("json_schema", "an object")?;
            let js = rf.required("json_schema", js)?;
            fields::check_object(&js, JSON_SCHEMA)?;
            let name = js.str("name")?;
            js.required("name", name)?;
            js.bool("strict")?;
            js.str("description")?;
            match js.get("schema") {
                // OpenAI: no schema is any JSON object.
                None => Ok(Some(Format::JsonObject)),
                Some(v) => Ok(Some(Format::JsonSchema(schema_value(
                    v,
                    &js.path("schema"),
                )?))),
            }
        }
        other => {
            let path = rf.path("type");
            Err(ApiError::invalid(
                &path,
                format!(
                    "{path}: expected \"text\", \"json_object\" or \"json_schema\", got {other:?}"
                ),
            ))
        }
    }
}

fn guided_json(o: &Obj) -> Result<Option<Format>, ApiError> {
    o.get("guided_json")
        .map(|v| schema_value(v, "guided_json").map(Format::JsonSchema))
        .transpose()
}

fn structured_outputs(o: &Obj) -> Result<Option<Format>, ApiError> {
    let Some(so) = o.object("structured_outputs", "an object")? else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for (key, v) in so.map.iter().filter(|(_, v)| !v.is_null()) {
        let path = so.path(key);
        let f = match key.as_str() {
            "json" => Format::JsonSchema(schema_value(v, &path)?),
            "json_object" => match so.bool(key)? {
                Some(true) => Format::JsonObject,
                // false asks for nothing.
                _ => continue,
            },
            "regex" => Format::Regex(so.str(key)?.unwrap_or_default().to_owned()),
            "grammar" => Format::Lark(so.str(key)?.unwrap_or_default().to_owned()),
            "choice" => {
                let items = so.array(key, "an array of strings")?.into_iter().flatten();
                let choices = items
                    .enumerate()
                    .map(|(i, c)| {
                        c.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| ApiError::expected(&format!("{path}[{i}]"), "a string"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if choices.is_empty() {
                    return Err(ApiError::invalid(
                        &path,
                        format!("{path}: must not be empty"),
                    ));
                }
                Format::Choice(choices)
            }
            _ => {
                return Err(ApiError::unsupported(
                    &path,
                    format!(
                        "{path}: not supported (only json, json_object, regex, choice, grammar)"
                    ),
                ))
            }
        };
        found.push(f);
    }
    if found.len() > 1 {
        return Err(ApiError::invalid(
            "structured_outputs",
            "structured_outputs: give exactly one of json, json_object, regex, choice, grammar",
        ));
    }
    Ok(found.pop())
}
