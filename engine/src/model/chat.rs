//! Chat templates: the GGUF's `tokenizer.chat_template` (Jinja, as written for Hugging Face
//! `transformers`) rendered with MiniJinja.
//!
//! The environment mirrors what `transformers` gives a template: `trim_blocks` and
//! `lstrip_blocks`, loop controls (`break`, `continue`), `raise_exception(msg)`, a Python-style
//! `tojson` (`json.dumps` spacing, non-ASCII kept, optional `indent` and `sort_keys`), Python
//! string and dict methods (`.strip()`, `.startswith()`, `.items()`, ...), and the variables
//! `messages`, `add_generation_prompt`, `bos_token` and `eos_token`.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation, as the OpenAI API and chat templates know it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// The participant's name (OpenAI's `name`), given to the template as `message.name`
    /// only when set; what the template makes of it is its own (see
    /// [`ChatTemplate::renders_name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            name: None,
        }
    }

    /// This message with the participant name `name` (none when `None`).
    pub fn named(mut self, name: Option<&str>) -> Self {
        self.name = name.map(str::to_owned);
        self
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

fn template_err(e: minijinja::Error) -> Error {
    Error::ChatTemplate(crate::error::chain(&e))
}

impl ChatTemplate {
    /// The template in `tokenizer.chat_template`, with the BOS and EOS tokens' text (from
    /// `tokenizer.ggml.{bos,eos}_token_id`; empty when absent) as `bos_token` and `eos_token`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let source = gguf.get_str("tokenizer.chat_template")?;
        let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
        let token_text = |key: &str| -> String {
            gguf.metadata()
                .get(key)
                .and_then(|v| v.as_u64())
                .and_then(|id| usize::try_from(id).ok())
                .and_then(|id| tokens.get(id))
                .map_or_else(String::new, |t| (*t).to_owned())
        };
        Self::new(
            source,
            &token_text("tokenizer.ggml.bos_token_id"),
            &token_text("tokenizer.ggml.eos_token_id"),
        )
    }

    /// Compiles `source`; a syntax error is an [`Error::ChatTemplate`].
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(template_err)?;
        Ok(Self {
            env,
            source: source.to_owned(),
            bos: bos.to_owned(),
            eos: eos.to_owned(),
        })
    }

    /// Renders the conversation; with `add_generation_prompt`, ends with the opening of the
    /// assistant's turn. Errors of the template (including `raise_exception`) are
    /// [`Error::ChatTemplate`] with the message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_err)?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos,
                eos_token => &self.eos,
            })
            .map_err(template_err)
    }

    /// Whether the template writes a message's `name` into the prompt for `role`: one message
    /// rendered with and without a name, compared. A name it does not render would be silently
    /// dropped, so the server refuses it instead.
    pub fn renders_name(&self, role: &str) -> bool {
        // A turn after a user's, for templates that insist on the user speaking first.
        let probe = |name| {
            let mut turns = vec![ChatMessage::new(role, "x").named(name)];
            if role != "user" && role != "system" {
                turns.insert(0, ChatMessage::new("user", "x"));
            }
            self.render(&turns, false)
        };
        match (probe(None), probe(Some("sluice_probe_name"))) {
            (Ok(a), Ok(b)) => a != b,
            _ => false,
        }
    }

    /// Renders OpenAI-shaped messages as given (`tool_calls`, `tool` turns and all) with
    /// `tools` in the template's context, as a server that hands the request to the template
    /// (vLLM, SGLang) does: what the template makes of them is the prompt.
    pub fn render_openai(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_err)?;
        template
            .render(context! {
                messages => Value::from_serialize(messages),
                tools => tools.map(Value::from_serialize),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos,
                eos_token => &self.eos,
            })
            .map_err(template_err)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text given to the template as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos
    }

    /// The text given to the template as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos
    }
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// Options of Python's `json.dumps` that `tojson` honours.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `transformers`' `tojson`: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)` with those keyword arguments accepted.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = i64::try_from(v.clone())?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
        },
    };
    let (default_item, default_key) = if indent.is_some() {
        (",", ": ")
    } else {
        (", ", ": ")
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(seps) if seps.len() == 2 => (seps[0].clone(), seps[1].clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
        None => (default_item.to_owned(), default_key.to_owned()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    let quoted = serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""));
    if !ensure_ascii {
        out.push_str(&quoted);
        return;
    }
    for c in quoted.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
}

fn newline_indent(style: &JsonStyle, depth: usize, out: &mut String) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    value: &Value,
    style: &JsonStyle,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let n = serde_json::to_string(value)
                .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
            out.push_str(&n);
        }
        ValueKind::String => {
            write_json_str(value.as_str().unwrap_or_default(), style.ensure_ascii, out)
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline_indent(style, depth + 1, out);
                match key.as_str() {
                    Some(k) => write_json_str(k, style.ensure_ascii, out),
                    None => write_json_str(&key.to_string(), style.ensure_ascii, out),
                }
                out.push_str(&style.key_sep);
                write_json(&value.get_item(key)?, style, depth + 1, out)?;
            }
            newline_indent(style, depth, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline_indent(style, depth + 1, out);
                write_json(item, style, depth + 1, out)?;
            }
            newline_indent(style, depth, out);
            out.push(']');
        }
        _ => write_json_str(&value.to_string(), style.ensure_ascii, out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tokenizer::test_support::{toy_gguf, SMOLLM_TEMPLATE};

    const DEFAULT_SYSTEM: &str =
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

    fn smollm() -> ChatTemplate {
        ChatTemplate::new(SMOLLM_TEMPLATE, "<|im_start|>", "<|im_end|>").expect("template compiles")
    }

    #[test]
    fn inserts_the_default_system_prompt() {
        let t = smollm();
        let out = t
            .render(&[ChatMessage::new("user", "hi")], true)
            .expect("render");
        assert_eq!(
            out,
            format!("{DEFAULT_SYSTEM}<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        );
        let out = t
            .render(&[ChatMessage::new("user", "hi")], false)
            .expect("render");
        assert_eq!(
            out,
            format!("{DEFAULT_SYSTEM}<|im_start|>user\nhi<|im_end|>\n")
        );
    }

    #[test]
    fn a_name_reaches_the_template_which_renders_it_or_not() {
        assert!(
            !smollm().renders_name("user"),
            "SmolLM2's template drops names"
        );
        let named = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}: {{ m.content }}\n{% endfor %}",
            "",
            "",
        )
        .expect("template compiles");
        for role in ["system", "user", "assistant"] {
            assert!(named.renders_name(role), "{role}");
        }
        let msgs = [
            ChatMessage::new("user", "hi").named(Some("alice")),
            ChatMessage::new("assistant", "hello").named(None),
        ];
        assert_eq!(
            named.render(&msgs, false).expect("render"),
            "user (alice): hi\nassistant: hello\n"
        );
    }

    #[test]
    fn keeps_a_given_system_prompt() {
        let t = smollm();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "hi"),
        ];
        let out = t.render(&msgs, true).expect("render");
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn multi_turn_conversation() {
        let t = smollm();
        let msgs = [
            ChatMessage::new("user", "What is 2+2?"),
            ChatMessage::new("assistant", "4"),
            ChatMessage::new("user", "And 3+3?\n"),
        ];
        let out = t.render(&msgs, true).expect("render");
        assert_eq!(
            out,
            format!(
                "{DEFAULT_SYSTEM}<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
                 <|im_start|>user\nAnd 3+3?\n<|im_end|>\n<|im_start|>assistant\n"
            )
        );
        assert_eq!(
            t.render(&[], true).expect("render"),
            "<|im_start|>assistant\n"
        );
    }

    #[test]
    fn from_gguf_reads_template_and_special_tokens() {
        let t = ChatTemplate::from_gguf(&toy_gguf()).expect("from gguf");
        assert_eq!(t.source(), SMOLLM_TEMPLATE);
        assert_eq!(t.bos_token(), "<|im_start|>");
        assert_eq!(t.eos_token(), "<|im_end|>");
        let out = t
            .render(&[ChatMessage::new("user", "hi")], true)
            .expect("render");
        assert!(out.starts_with(DEFAULT_SYSTEM));
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with the user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], false)
                .expect("render"),
            "ok"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false)
            .expect_err("raises");
        assert!(
            matches!(&err, Error::ChatTemplate(m) if m.contains("Conversation must start with the user")),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").expect_err("unclosed for");
        assert!(matches!(err, Error::ChatTemplate(_)), "{err}");
    }

    #[test]
    fn hf_environment_features() {
        // trim_blocks / lstrip_blocks, bos/eos, Python string methods (and Python's `True`),
        // loop controls.
        let src = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'stop' %}{% break %}{% endif %}\n{{ m['content'].strip().upper() }}|{{ m.role.startswith('us') }}\n{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        let msgs = [
            ChatMessage::new("user", "  hi  "),
            ChatMessage::new("stop", ""),
            ChatMessage::new("user", "no"),
        ];
        assert_eq!(
            t.render(&msgs, false).expect("render"),
            "<s>\nHI|True\n</s>"
        );
    }

    #[test]
    fn tojson_is_python_style() {
        // Keys in insertion (field) order, as Python dicts; `json.dumps` separators.
        let src = "{{ messages[0] | tojson }}|{{ messages | tojson(indent=2) }}|{{ 'é<' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        let out = t
            .render(&[ChatMessage::new("user", "a\"b")], false)
            .expect("render");
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"a\\\"b\"}|[\n  {\n    \"role\": \"user\",\n    \"content\": \"a\\\"b\"\n  }\n]|\"é<\"|\"\\u00e9\""
        );
    }

    #[test]
    fn chat_message_is_serde_friendly() {
        let m: ChatMessage =
            serde_json::from_str(r#"{"role":"user","content":"hi"}"#).expect("deserialize");
        assert_eq!(m, ChatMessage::new("user", "hi"));
        assert_eq!(
            serde_json::to_string(&m).expect("serialize"),
            r#"{"role":"user","content":"hi"}"#
        );
    }
}
