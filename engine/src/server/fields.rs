//! Every top-level field of OpenAI's chat and completions requests (and the vLLM / llama.cpp
//! extensions this server takes), and what the server does with each: nothing is silently
//! ignored. A field is implemented (read by [`super::parse`] and [`super::chat_request`]),
//! accepted and ignored where ignoring it changes nothing the client gets back, or refused
//! with 400 `unsupported_parameter` unless its value is the one that asks for nothing. A field
//! not listed is refused the same way, at the top level and in the objects inside (messages,
//! content parts, tools, `tool_choice`, `response_format`, `stream_options`). docs/api.md lists
//! the same table.

use serde_json::Value;

use super::error::ApiError;
use super::parse::Obj;

/// What the server does with one field.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Handling {
    /// Read and acted on (values are checked where the field is read).
    Implemented,
    /// Accepted and ignored; the text says why ignoring it changes nothing for the client.
    Ignored(&'static str),
    /// Refused with 400 `unsupported_parameter` unless `harmless` holds for its value (null is
    /// always harmless: it is the same as absent).
    Refused {
        harmless: fn(&Value) -> bool,
        why: &'static str,
    },
}

use Handling::{Ignored, Implemented, Refused};

const IDENTIFIER: Handling =
    Ignored("an identifier for the provider's abuse monitoring or caching; it changes no output");

fn never(_: &Value) -> bool {
    false
}

fn is_false(v: &Value) -> bool {
    v == &Value::Bool(false)
}

fn is_true(v: &Value) -> bool {
    v == &Value::Bool(true)
}

fn is_empty_text(v: &Value) -> bool {
    v.as_str() == Some("")
}

const NOT_REASONING: &str = "this model is not a reasoning model";

const fn refused(why: &'static str) -> Handling {
    Refused {
        harmless: never,
        why,
    }
}

/// The fields both endpoints share.
const COMMON: &[(&str, Handling)] = &[
    ("model", Implemented),
    ("frequency_penalty", Implemented),
    ("presence_penalty", Implemented),
    ("logit_bias", Implemented),
    ("logprobs", Implemented),
    ("max_tokens", Implemented),
    ("n", Implemented),
    ("seed", Implemented),
    ("stop", Implemented),
    ("stream", Implemented),
    ("stream_options", Implemented),
    ("temperature", Implemented),
    ("top_p", Implemented),
    ("user", IDENTIFIER),
    ("response_format", Implemented),
    // Extensions (vLLM, llama.cpp).
    ("top_k", Implemented),
    ("min_p", Implemented),
    ("repetition_penalty", Implemented),
    ("ignore_eos", Implemented),
    ("min_tokens", Implemented),
    ("guided_json", Implemented),
    ("structured_outputs", Implemented),
    // SGLang's extensions, which its model gateway (SMG) adds to every request it forwards, at
    // their defaults: accepted where the value asks for what this server does anyway.
    (
        "no_stop_trim",
        Refused {
            harmless: is_false,
            why: "stop strings are always trimmed from the output (only false)",
        },
    ),
    (
        "skip_special_tokens",
        Refused {
            harmless: is_true,
            why: "special tokens are never written into the text (only true)",
        },
    ),
    (
        "return_hidden_states",
        Refused {
            harmless: is_false,
            why: "hidden states are not returned (only false)",
        },
    ),
];

/// `POST /v1/chat/completions`, besides [`COMMON`].
pub(crate) const CHAT: &[(&str, Handling)] = &[
    ("messages", Implemented),
    ("max_completion_tokens", Implemented),
    ("top_logprobs", Implemented),
    ("tools", Implemented),
    ("tool_choice", Implemented),
    ("parallel_tool_calls", Implemented),
    (
        "metadata",
        Ignored("stored only with `store`, which this server does not offer"),
    ),
    ("safety_identifier", IDENTIFIER),
    ("prompt_cache_key", IDENTIFIER),
    (
        "prediction",
        Ignored("predicted outputs only speed up a response; the output is the same without"),
    ),
    (
        "store",
        Refused {
            harmless: is_false,
            why: "completions are not stored by this server (only false)",
        },
    ),
    (
        "service_tier",
        Refused {
            harmless: |v| matches!(v.as_str(), Some("auto" | "default")),
            why: "this server has one tier (only \"auto\" or \"default\")",
        },
    ),
    (
        "modalities",
        Refused {
            harmless: |v| v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")),
            why: "this model outputs text only (only [\"text\"])",
        },
    ),
    ("audio", refused("this model has no audio output")),
    ("reasoning_effort", refused(NOT_REASONING)),
    ("verbosity", refused("this server has no verbosity control")),
    (
        "web_search_options",
        refused("this server has no web search"),
    ),
    (
        "continue_final_message",
        Refused {
            harmless: is_false,
            why: "a final assistant message is not continued (only false)",
        },
    ),
    (
        "separate_reasoning",
        Ignored("this model is not a reasoning model: there is no reasoning to separate"),
    ),
    (
        "stream_reasoning",
        Ignored("this model is not a reasoning model: there is no reasoning to stream"),
    ),
    ("functions", refused("deprecated by OpenAI; use `tools`")),
    (
        "function_call",
        refused("deprecated by OpenAI; use `tool_choice`"),
    ),
];

/// `POST /v1/completions`, besides [`COMMON`].
pub(crate) const COMPLETIONS: &[(&str, Handling)] = &[
    ("prompt", Implemented),
    (
        "echo",
        Refused {
            harmless: is_false,
            why: "the prompt is not echoed (only false)",
        },
    ),
    (
        "best_of",
        Refused {
            harmless: |v| v.as_u64() == Some(1),
            why: "only 1 is supported",
        },
    ),
    (
        "suffix",
        Refused {
            harmless: |v| v.as_str() == Some(""),
            why: "this model does not fill in the middle",
        },
    ),
];

/// The fields of one message of `messages`. The refused ones are what clients echo back from an
/// assistant message they received (OpenAI's, vLLM's), which are harmless when empty.
pub(crate) const MESSAGE: &[(&str, Handling)] = &[
    ("role", Implemented),
    ("content", Implemented),
    ("name", Implemented),
    ("tool_calls", Implemented),
    ("tool_call_id", Implemented),
    (
        "refusal",
        Refused {
            harmless: is_empty_text,
            why: "a refusal in the history is not rendered; give it as content",
        },
    ),
    (
        "annotations",
        Refused {
            harmless: |v| v.as_array().is_some_and(|a| a.is_empty()),
            why: "annotations are not rendered",
        },
    ),
    ("audio", refused("this model has no audio")),
    (
        "function_call",
        refused("deprecated by OpenAI; use `tool_calls`"),
    ),
    (
        "reasoning_content",
        Refused {
            harmless: is_empty_text,
            why: NOT_REASONING,
        },
    ),
    (
        "reasoning",
        Refused {
            harmless: is_empty_text,
            why: NOT_REASONING,
        },
    ),
];

/// The fields of `stream_options`.
const STREAM_OPTIONS: &[(&str, Handling)] = &[
    ("include_usage", Implemented),
    (
        "include_obfuscation",
        Ignored("obfuscation only pads chunks against side channels; the content is the same"),
    ),
];

/// The fields of a `response_format` of type `text` or `json_object`.
pub(crate) const PLAIN_FORMAT: &[(&str, Handling)] = &[
    ("type", Implemented),
    (
        "schema",
        refused("a schema goes in `json_schema.schema`, with type \"json_schema\""),
    ),
];

/// The fields of a `response_format` of type `json_schema`.
pub(crate) const SCHEMA_FORMAT: &[(&str, Handling)] =
    &[("type", Implemented), ("json_schema", Implemented)];

/// The fields of `response_format.json_schema`.
pub(crate) const JSON_SCHEMA: &[(&str, Handling)] = &[
    ("name", Implemented),
    ("description", Implemented),
    ("schema", Implemented),
    ("strict", Implemented),
];

/// The fields of one tool of `tools`.
pub(crate) const TOOL: &[(&str, Handling)] = &[("type", Implemented), ("function", Implemented)];

/// The fields of a tool's `function`. `strict` (a boolean) holds whatever its value: the
/// calls are always grammar-constrained to the `parameters` schema.
pub(crate) const FUNCTION: &[(&str, Handling)] = &[
    ("name", Implemented),
    ("description", Implemented),
    ("parameters", Implemented),
    ("strict", Implemented),
];

/// The fields of a `tool_choice` object.
pub(crate) const TOOL_CHOICE: &[(&str, Handling)] =
    &[("type", Implemented), ("function", Implemented)];

/// The fields of `tool_choice.function`.
pub(crate) const TOOL_CHOICE_FUNCTION: &[(&str, Handling)] = &[("name", Implemented)];

/// The fields of one content part.
pub(crate) const CONTENT_PART: &[(&str, Handling)] =
    &[("type", Implemented), ("text", Implemented)];

/// How `endpoint_fields` (and [`COMMON`]) handle `key`, `None` when unknown.
pub(crate) fn handling(endpoint_fields: &[(&str, Handling)], key: &str) -> Option<Handling> {
    COMMON
        .iter()
        .chain(endpoint_fields)
        .find(|(k, _)| *k == key)
        .map(|&(_, h)| h)
}

/// Every field name of an endpoint, [`COMMON`] included.
#[cfg(test)]
pub(crate) fn names(endpoint_fields: &[(&'static str, Handling)]) -> Vec<&'static str> {
    COMMON
        .iter()
        .chain(endpoint_fields)
        .map(|&(k, _)| k)
        .collect()
}

fn check_map(o: &Obj, fields: &[(&str, Handling)], common: bool) -> Result<(), ApiError> {
    for (key, value) in o.map {
        let found = if common {
            handling(fields, key)
        } else {
            fields.iter().find(|(k, _)| k == key).map(|&(_, h)| h)
        };
        let path = o.path(key);
        match found {
            None => {
                return Err(ApiError::unsupported(
                    &path,
                    format!("{path}: unrecognized request argument"),
                ))
            }
            Some(Refused { harmless, why }) if !value.is_null() && !harmless(value) => {
                return Err(ApiError::unsupported(
                    &path,
                    format!("{path}: not supported: {why}"),
                ))
            }
            Some(Ignored(why)) => tracing::debug!(field = %path, "accepted and ignored: {why}"),
            Some(_) => {}
        }
    }
    Ok(())
}

/// Refuses a request that has a field this server does not take, or a refused field with a
/// value that asks for something (see [`Handling`]).
pub(crate) fn check(o: &Obj, endpoint_fields: &[(&str, Handling)]) -> Result<(), ApiError> {
    check_map(o, endpoint_fields, true)?;
    if let Some(so) = o.object("stream_options", "an object")? {
        check_map(&so, STREAM_OPTIONS, false)?;
    }
    Ok(())
}

/// The same for one message object (its path in `o`).
pub(crate) fn check_message(o: &Obj) -> Result<(), ApiError> {
    check_map(o, MESSAGE, false)
}

/// The same for an object inside the request (`fields` is its table, e.g. [`TOOL`]).
pub(crate) fn check_object(o: &Obj, fields: &[(&str, Handling)]) -> Result<(), ApiError> {
    check_map(o, fields, false)
}
