//! Reading a chat request: messages (text or text parts; assistant tool calls; tool results),
//! tools and `tool_choice`, with the path of the offending field in every error.

use serde_json::Value;

use super::error::ApiError;
use super::fields;
use super::parse::{logprob_count, root, sampling, Obj};
use super::types::{ChatRequest, HistoryToolCall, Message, Role, ToolChoice, ToolDef};

pub(crate) fn parse(body: &Value) -> Result<ChatRequest, ApiError> {
    let o = root(body)?;
    fields::check(&o, fields::CHAT)?;
    let logprobs = o.bool("logprobs")?.unwrap_or(false);
    let top = logprob_count(&o, "top_logprobs")?;
    if top.is_some() && !logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs: requires logprobs: true",
        ));
    }
    let items = o.array("messages", "an array of messages")?;
    let items = o.required("messages", items)?;
    if items.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages: must contain at least one message",
        ));
    }
    let messages = items
        .iter()
        .enumerate()
        .map(|(i, v)| message(v, i))
        .collect::<Result<_, _>>()?;
    let tools = match o.array("tools", "an array of tools")? {
        Some(list) => list
            .iter()
            .enumerate()
            .map(|(i, v)| tool(v, i))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let mut sampling = sampling(&o)?;
    sampling.logprobs = logprobs.then_some(top.unwrap_or(0));
    Ok(ChatRequest {
        tool_choice: tool_choice(&o, &tools)?,
        parallel_tool_calls: o.bool("parallel_tool_calls")?.unwrap_or(true),
        messages,
        tools,
        sampling,
    })
}

fn message(v: &Value, i: usize) -> Result<Message, ApiError> {
    let o = Obj::at(v, format!("messages[{i}]"), "a message object")?;
    fields::check_message(&o)?;
    let role = o.str("role")?;
    let role = match o.required("role", role)? {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            let path = o.path("role");
            return Err(ApiError::invalid(
                &path,
                format!(
                    "{path}: unknown role {other:?} (expected system, user, assistant or tool)"
                ),
            ));
        }
    };
    let content = content(&o)?;
    let calls = o.array("tool_calls", "an array of tool calls")?;
    if role != Role::Assistant && calls.is_some_and(|c| !c.is_empty()) {
        let path = o.path("tool_calls");
        return Err(ApiError::invalid(
            &path,
            format!("{path}: only assistant messages make tool calls"),
        ));
    }
    let mut tool_calls = Vec::new();
    for (j, call) in calls.into_iter().flatten().enumerate() {
        let c = Obj::at(
            call,
            format!("{}[{j}]", o.path("tool_calls")),
            "a tool call object",
        )?;
        let f = c.object("function", "an object")?;
        let f = c.required("function", f)?;
        let name = f.str("name")?;
        let arguments = match f.get("arguments") {
            None => "{}".to_owned(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        tool_calls.push(HistoryToolCall {
            name: f.required("name", name)?.to_owned(),
            arguments,
        });
    }
    if content.is_none() && role != Role::Assistant {
        o.required("content", None::<()>)?;
    }
    // The model's tool format matches results to calls by order, so a tool message's id is
    // checked (a string) and not rendered; on any other message it answers nothing.
    if o.str("tool_call_id")?.is_some() && role != Role::Tool {
        let path = o.path("tool_call_id");
        return Err(ApiError::invalid(
            &path,
            format!("{path}: only tool messages answer a tool call"),
        ));
    }
    Ok(Message {
        role,
        content,
        tool_calls,
        name: o.str("name")?.map(str::to_owned),
    })
}

fn content(o: &Obj) -> Result<Option<String>, ApiError> {
    let parts = match o.get("content") {
        None => return Ok(None),
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(ApiError::expected(
                &o.path("content"),
                "a string or an array of text parts",
            ))
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let p = Obj::at(
            part,
            format!("{}[{j}]", o.path("content")),
            "a content part object",
        )?;
        match p.str("type")? {
            Some("text") => {}
            Some(other) => {
                let path = p.path("type");
                return Err(ApiError::unsupported(
                    &path,
                    format!("{path}: only \"text\" content parts are supported, got {other:?}"),
                ));
            }
            None => return Err(ApiError::expected(&p.path("type"), "\"text\"")),
        }
        fields::check_object(&p, fields::CONTENT_PART)?;
        let text = p.str("text")?;
        texts.push(p.required("text", text)?);
    }
    Ok(Some(texts.join("\n")))
}

fn tool(v: &Value, i: usize) -> Result<ToolDef, ApiError> {
    let o = Obj::at(v, format!("tools[{i}]"), "a tool object")?;
    match o.str("type")? {
        None | Some("function") => {}
        Some(other) => {
            let path = o.path("type");
            return Err(ApiError::unsupported(
                &path,
                format!("{path}: only \"function\" tools are supported, got {other:?}"),
            ));
        }
    }
    fields::check_object(&o, fields::TOOL)?;
    let f = o.object("function", "an object")?;
    let f = o.required("function", f)?;
    fields::check_object(&f, fields::FUNCTION)?;
    // Satisfied either way: calls are grammar-constrained to the `parameters` schema.
    f.bool("strict")?;
    let name = f.str("name")?;
    let name = f.required("name", name.filter(|n| !n.is_empty()))?;
    // Built by hand to keep the conventional key order (serde_json's maps are sorted).
    let mut function = format!("{{\"name\":{}", Value::from(name));
    if let Some(d) = f.str("description")? {
        function.push_str(&format!(",\"description\":{}", Value::from(d)));
    }
    let parameters = f
        .object("parameters", "a JSON schema object")?
        .map(|p| Value::Object(p.map.clone()));
    if let Some(p) = &parameters {
        function.push_str(&format!(",\"parameters\":{p}"));
    }
    function.push('}');
    Ok(ToolDef {
        name: name.to_owned(),
        schema: format!("{{\"type\":\"function\",\"function\":{function}}}"),
        parameters,
    })
}

fn tool_choice(o: &Obj, tools: &[ToolDef]) -> Result<ToolChoice, ApiError> {
    match o.get("tool_choice") {
        None => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            // OpenAI refuses it too: there is nothing to call.
            "required" if tools.is_empty() => Err(ApiError::invalid(
                "tool_choice",
                "tool_choice: \"required\" needs at least one tool in `tools`",
            )),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice: expected \"none\", \"auto\", \"required\" or a function, got {other:?}"),
            )),
        },
        Some(v) => {
            let c = Obj::at(v, "tool_choice".into(), "a string or a function object")?;
            fields::check_object(&c, fields::TOOL_CHOICE)?;
            if let Some(kind) = c.str("type")?.filter(|&k| k != "function") {
                let path = c.path("type");
                return Err(ApiError::invalid(
                    &path,
                    format!("{path}: expected \"function\", got {kind:?}"),
                ));
            }
            let f = c.object("function", "an object")?;
            let f = c.required("function", f)?;
            fields::check_object(&f, fields::TOOL_CHOICE_FUNCTION)?;
            let name = f.str("name")?;
            let name = c.required("function.name", name)?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice: function {name:?} is not among the request's tools"),
                ));
            }
            Ok(ToolChoice::Function(name.to_owned()))
        }
    }
}
