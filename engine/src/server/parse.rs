//! Reading OpenAI requests from JSON, naming the offending field in every error
//! (`messages[1].content: expected a string or an array of text parts`). Unknown fields are
//! refused ([`super::fields`]); `null` is the same as absent. The fields both endpoints share and the completions
//! request are here; the chat request is in [`super::chat_request`].

use serde_json::{Map, Value};

use super::error::ApiError;
use super::fields;
use super::types::{CompletionRequest, Prompt, Sampling};

/// OpenAI's limit on stop sequences.
const MAX_STOP: usize = 4;

/// Parses the body as JSON; a syntax error names the line and column.
pub(crate) fn json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_json(&e))
}

/// A JSON object at a path of the request.
pub(crate) struct Obj<'a> {
    pub(super) map: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Obj<'a> {
    pub(super) fn at(value: &'a Value, prefix: String, what: &str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { map, prefix }),
            _ if prefix.is_empty() => Err(ApiError::invalid(
                "",
                format!("the request body must be {what}"),
            )),
            _ => Err(ApiError::expected(&prefix, what)),
        }
    }

    pub(super) fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    /// The field, `None` when absent or null.
    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn typed<T>(
        &self,
        key: &str,
        what: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| ApiError::expected(&self.path(key), what)),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        self.typed(key, "a string", Value::as_str)
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        self.typed(key, "a boolean", Value::as_bool)
    }

    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>, ApiError> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>, ApiError> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    pub(super) fn array(&self, key: &str, what: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        self.typed(key, what, Value::as_array)
    }

    pub(super) fn object(&self, key: &str, what: &str) -> Result<Option<Obj<'a>>, ApiError> {
        self.get(key)
            .map(|v| Obj::at(v, self.path(key), what))
            .transpose()
    }

    pub(super) fn required<T>(&self, key: &str, v: Option<T>) -> Result<T, ApiError> {
        let path = self.path(key);
        v.ok_or_else(|| ApiError::invalid(&path, format!("{path}: required")))
    }
}

fn in_range(
    o: &Obj,
    key: &str,
    v: Option<f64>,
    lo: f64,
    hi: f64,
    incl_lo: bool,
) -> Result<(), ApiError> {
    match v {
        Some(x) if !(x <= hi && (x > lo || (incl_lo && x == lo))) => {
            let path = o.path(key);
            let open = if incl_lo { "[" } else { "(" };
            Err(ApiError::invalid(
                &path,
                format!("{path}: must be in {open}{lo}, {hi}], got {x}"),
            ))
        }
        _ => Ok(()),
    }
}

/// The fields both endpoints share.
pub(super) fn sampling(o: &Obj) -> Result<Sampling, ApiError> {
    if let Some(n) = o.usize("n")? {
        if n != 1 {
            return Err(ApiError::unsupported(
                "n",
                format!("n: only n = 1 is supported, got {n}"),
            ));
        }
    }
    // Both are checked; max_completion_tokens wins when both are given.
    let mut max_tokens = None;
    for key in ["max_tokens", "max_completion_tokens"] {
        match o.usize(key)? {
            Some(0) => return Err(ApiError::invalid(key, format!("{key}: must be at least 1"))),
            Some(m) => max_tokens = Some(m),
            None => {}
        }
    }
    let min_tokens = o.usize("min_tokens")?.unwrap_or(0);
    if max_tokens.is_some_and(|m| min_tokens > m) {
        return Err(ApiError::invalid(
            "min_tokens",
            format!("min_tokens: {min_tokens} is more than max_tokens"),
        ));
    }
    let ranged = |key: &str, lo: f64, hi: f64, incl_lo: bool| -> Result<Option<f32>, ApiError> {
        let v = o.f64(key)?;
        in_range(o, key, v, lo, hi, incl_lo)?;
        Ok(v.map(|x| x as f32))
    };
    // vLLM's convention: -1 (or 0) disables top-k.
    let top_k = match o.get("top_k") {
        None => None,
        Some(v) => match v.as_i64() {
            Some(-1) => Some(0),
            Some(k) if k >= 0 => Some(usize::try_from(k).unwrap_or(usize::MAX)),
            _ => return Err(ApiError::expected("top_k", "a non-negative integer or -1")),
        },
    };
    let seed = o.typed("seed", "an integer", |v| {
        v.as_u64().or_else(|| v.as_i64().map(|i| i as u64))
    })?;
    let stream = o.bool("stream")?.unwrap_or(false);
    let include_usage = match o.object("stream_options", "an object")? {
        Some(so) => so.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    // A usage chunk exists only in a stream; asked for without one it would be dropped unseen
    // (OpenAI and vLLM refuse it too).
    if include_usage && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options: include_usage needs stream: true (a whole answer always has usage)",
        ));
    }
    Ok(Sampling {
        max_tokens,
        min_tokens,
        ignore_eos: o.bool("ignore_eos")?.unwrap_or(false),
        temperature: ranged("temperature", 0.0, 2.0, true)?,
        top_k,
        top_p: ranged("top_p", 0.0, 1.0, false)?,
        min_p: ranged("min_p", 0.0, 1.0, true)?,
        repetition_penalty: ranged("repetition_penalty", 0.0, 2.0, false)?,
        frequency_penalty: ranged("frequency_penalty", -2.0, 2.0, true)?.unwrap_or(0.0),
        presence_penalty: ranged("presence_penalty", -2.0, 2.0, true)?.unwrap_or(0.0),
        logit_bias: logit_bias(o)?,
        logprobs: None,
        seed,
        format: super::format::parse(o)?,
        stop: stop(o)?,
        stream,
        include_usage,
    })
}

/// The most `logit_bias` entries a request may give (OpenAI's limit). The biases travel with
/// every step of the sequence between ranks: a whole vocabulary of them (49,152 entries, 1.1 MB)
/// went over the ranks' 1 MiB message header.
pub(super) const MAX_LOGIT_BIAS: usize = 300;

/// OpenAI's `logit_bias`: token ids (as strings) to a bias in [-100, 100], at most
/// [`MAX_LOGIT_BIAS`] of them.
fn logit_bias(o: &Obj) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = o.object("logit_bias", "an object of token ids to biases")? else {
        return Ok(Vec::new());
    };
    if map.map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            "logit_bias",
            format!(
                "logit_bias: at most {MAX_LOGIT_BIAS} entries, got {}",
                map.map.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(map.map.len());
    for (k, v) in map.map {
        let path = map.path(k);
        let id = k.parse::<u32>().map_err(|_| {
            ApiError::invalid(
                &path,
                format!("{path}: the key must be a token id, got {k:?}"),
            )
        })?;
        let bias = v
            .as_f64()
            .ok_or_else(|| ApiError::expected(&path, "a number"))?;
        in_range(&map, k, Some(bias), -100.0, 100.0, true)?;
        out.push((id, bias as f32));
    }
    Ok(out)
}

/// The `top_logprobs` limit (OpenAI's for chat; vLLM's for completions' `logprobs`).
pub(super) const MAX_LOGPROBS: usize = 20;

/// A count of alternatives, at most [`MAX_LOGPROBS`].
pub(super) fn logprob_count(o: &Obj, key: &str) -> Result<Option<usize>, ApiError> {
    let n = o.usize(key)?;
    if let Some(n) = n.filter(|&n| n > MAX_LOGPROBS) {
        let path = o.path(key);
        return Err(ApiError::invalid(
            &path,
            format!("{path}: at most {MAX_LOGPROBS}, got {n}"),
        ));
    }
    Ok(n)
}

fn stop(o: &Obj) -> Result<Vec<String>, ApiError> {
    let list = match o.get("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP {
                return Err(ApiError::invalid(
                    "stop",
                    format!(
                        "stop: at most {MAX_STOP} stop sequences are allowed, got {}",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| ApiError::expected(&format!("stop[{i}]"), "a string"))
                })
                .collect::<Result<_, _>>()?
        }
        Some(_) => {
            return Err(ApiError::expected(
                "stop",
                "a string or an array of strings",
            ))
        }
    };
    // An empty stop string would end every generation at once.
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

/// `body` must be an object; `model`, when given, a string (any name is served).
pub(super) fn root(body: &Value) -> Result<Obj<'_>, ApiError> {
    let o = Obj::at(body, String::new(), "a JSON object")?;
    o.str("model")?;
    Ok(o)
}

pub(crate) fn completion_request(body: &Value) -> Result<CompletionRequest, ApiError> {
    let o = root(body)?;
    fields::check(&o, fields::COMPLETIONS)?;
    // An integer here (the number of alternatives), not chat's boolean.
    let logprobs = logprob_count(&o, "logprobs")?;
    let prompt = o.required("prompt", o.get("prompt"))?;
    let mut sampling = sampling(&o)?;
    sampling.logprobs = logprobs;
    Ok(CompletionRequest {
        prompt: prompt_value(prompt)?,
        sampling,
    })
}

pub(crate) fn prompt_value(v: &Value) -> Result<Prompt, ApiError> {
    const WHAT: &str = "a string, an array of one string, or an array of token ids";
    let token = |v: &Value| v.as_u64().and_then(|t| u32::try_from(t).ok());
    match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) => match items.as_slice() {
            [] => Err(ApiError::invalid("prompt", "prompt: must not be empty")),
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(ids)] => ids
                .iter()
                .map(token)
                .collect::<Option<_>>()
                .map(Prompt::Tokens)
                .ok_or_else(|| ApiError::expected("prompt[0]", "an array of token ids")),
            [Value::String(_) | Value::Array(_), ..] => Err(ApiError::unsupported(
                "prompt",
                "prompt: only one prompt per request is supported",
            )),
            _ => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    token(v)
                        .ok_or_else(|| ApiError::expected(&format!("prompt[{i}]"), "a token id"))
                })
                .collect::<Result<_, _>>()
                .map(Prompt::Tokens),
        },
        _ => Err(ApiError::expected("prompt", WHAT)),
    }
}
