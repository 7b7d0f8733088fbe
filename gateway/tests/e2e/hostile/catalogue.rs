//! The catalogue: hostile and malformed requests, each with the answer the gateway documents
//! (`docs/api.md`). Every generation request carries [`PROMPT`] and, unless the case is about
//! keys, the tenant's [`KEY`]: neither may show in the logs above debug (keys: at all).

use serde_json::json;

/// The one tenant's key.
pub const KEY: &str = "sk-hostile-tenant-4b1d90";
/// The admin key.
pub const ADMIN_KEY: &str = "sk-hostile-admin-77ce21";
/// Keys that are wrong; they must not be logged either.
pub const WRONG_KEY: &str = "sk-hostile-wrong-e5a0c3";
/// Text in every prompt, which may be logged only at debug.
pub const PROMPT: &str = "PRIVATE-PROMPT-a91f";
/// The body limit the catalogue's gateway runs with.
pub const BODY_LIMIT: usize = 256 << 10;

/// What the gateway must answer.
#[derive(Clone, Copy, Debug)]
pub enum Want {
    /// An OpenAI-shaped error with this status and `code`.
    Refused(u16, &'static str),
    /// Accepted and sent upstream with `max_tokens` clamped to the policy's maximum.
    Clamped,
}

#[derive(Debug)]
pub struct Case {
    pub name: &'static str,
    pub method: &'static str,
    pub path: &'static str,
    pub headers: Vec<(&'static str, Vec<u8>)>,
    pub body: Vec<u8>,
    pub want: Want,
}

const CHAT: &str = "/v1/chat/completions";
const BAD: Want = Want::Refused(400, "invalid_request");
const BAD_JSON: Want = Want::Refused(400, "invalid_json");
const UNSUPPORTED: Want = Want::Refused(400, "unsupported_parameter");
const NO_KEY: Want = Want::Refused(401, "invalid_api_key");

fn bearer(key: &str) -> (&'static str, Vec<u8>) {
    ("authorization", format!("Bearer {key}").into_bytes())
}

/// A chat request with the tenant's key and `body` as it is.
fn raw(name: &'static str, body: impl Into<Vec<u8>>, want: Want) -> Case {
    to(name, CHAT, body, want)
}

fn to(name: &'static str, path: &'static str, body: impl Into<Vec<u8>>, want: Want) -> Case {
    Case {
        name,
        method: "POST",
        path,
        headers: vec![bearer(KEY), ("content-type", b"application/json".to_vec())],
        body: body.into(),
        want,
    }
}

/// A chat request whose JSON body is `v`.
fn chat(name: &'static str, v: serde_json::Value, want: Want) -> Case {
    raw(name, v.to_string(), want)
}

/// A well-formed chat request whose top-level `field` is `value`.
fn field(name: &'static str, field: &str, value: serde_json::Value, want: Want) -> Case {
    let mut v = json!({"messages": [{"role": "user", "content": PROMPT}], "stream": true});
    v[field] = value;
    chat(name, v, want)
}

/// A well-formed chat request sent with `headers` instead of the tenant's bearer key.
fn keyed(name: &'static str, headers: Vec<(&'static str, Vec<u8>)>) -> Case {
    let mut c = field(name, "max_tokens", json!(4), NO_KEY);
    c.headers = headers;
    c
}

fn nested(depth: usize, leaf: &str) -> String {
    format!("{}{leaf}{}", "[".repeat(depth), "]".repeat(depth))
}

/// The whole catalogue.
pub fn cases() -> Vec<Case> {
    let user = |content: serde_json::Value| json!([{"role": "user", "content": content}]);
    let mut invalid_utf8 =
        br#"{"messages":[{"role":"user","content":"PRIVATE-PROMPT-a91f "#.to_vec();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
    invalid_utf8.extend_from_slice(br#""}]}"#);
    let huge = format!(
        r#"{{"messages":[{{"role":"user","content":"{PROMPT} {}"}}]}}"#,
        "x".repeat(BODY_LIMIT + BODY_LIMIT / 2)
    );
    vec![
        // Keys: missing, wrong, in the wrong place or shape.
        keyed("no key at all", vec![]),
        keyed("a wrong key", vec![bearer(WRONG_KEY)]),
        keyed("the key in the wrong header", vec![("api-key", KEY.into())]),
        keyed(
            "the key as a bare authorization",
            vec![("authorization", KEY.into())],
        ),
        keyed(
            "a basic scheme",
            vec![("authorization", format!("Basic {KEY}").into_bytes())],
        ),
        keyed(
            "an empty bearer",
            vec![("authorization", b"Bearer ".to_vec())],
        ),
        keyed("a key with a suffix", vec![bearer(&format!("{KEY}x"))]),
        keyed(
            "a key one character short",
            vec![bearer(&KEY[..KEY.len() - 1])],
        ),
        keyed("a wrong x-api-key", vec![("x-api-key", WRONG_KEY.into())]),
        keyed("an 8 KiB key", vec![bearer(&"k".repeat(8 << 10))]),
        keyed(
            "a non-UTF-8 key",
            vec![("authorization", b"Bearer \xff\xfe\x80".to_vec())],
        ),
        keyed("the admin key as a tenant key", vec![bearer(ADMIN_KEY)]),
        Case {
            name: "the key in the query string",
            path: "/v1/chat/completions?api_key=sk-hostile-tenant-4b1d90",
            ..keyed("", vec![])
        },
        // Bodies that are not JSON.
        raw("an empty body", "", BAD_JSON),
        raw(
            "truncated JSON",
            r#"{"messages": [{"role": "user""#,
            BAD_JSON,
        ),
        raw("trailing garbage", r#"{"messages": []} xyz"#, BAD_JSON),
        raw("invalid UTF-8 in a string", invalid_utf8, BAD_JSON),
        raw("a byte-order mark", "\u{feff}{}", BAD_JSON),
        raw("NaN", r#"{"messages": [], "temperature": NaN}"#, BAD_JSON),
        raw("single quotes", "{'messages': []}", BAD_JSON),
        raw("a number past f64", r#"{"max_tokens": 1e400}"#, BAD_JSON),
        raw("100,000 nested arrays", nested(100_000, ""), BAD_JSON),
        raw(
            "nesting past the parser's depth inside a message",
            format!(
                r#"{{"messages":[{{"role":"user","content":{}}}]}}"#,
                nested(200, "1")
            ),
            BAD_JSON,
        ),
        raw(
            "a body over the limit",
            huge,
            Want::Refused(413, "request_too_large"),
        ),
        // JSON of the wrong shape.
        chat("null", json!(null), BAD),
        chat("an array", json!([1, 2, 3]), BAD),
        chat("a string", json!("hello"), BAD),
        chat("no messages", json!({"max_tokens": 4}), BAD),
        field("messages as a string", "messages", json!(PROMPT), BAD),
        field("empty messages", "messages", json!([]), BAD),
        field(
            "a message without a role",
            "messages",
            json!([{"content": PROMPT}]),
            BAD,
        ),
        field(
            "an unknown role",
            "messages",
            json!([{"role": "wizard", "content": PROMPT}]),
            BAD,
        ),
        field(
            "a numeric role",
            "messages",
            json!([{"role": 7, "content": PROMPT}]),
            BAD,
        ),
        field("numeric content", "messages", user(json!(42)), BAD),
        field(
            "an object as content",
            "messages",
            user(json!({"text": PROMPT})),
            BAD,
        ),
        field(
            "an image part",
            "messages",
            user(json!([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}])),
            UNSUPPORTED,
        ),
        field(
            "nested arrays as content",
            "messages",
            user(serde_json::from_str(&nested(100, "1")).unwrap_or_default()),
            BAD,
        ),
        field("a message that is a number", "messages", json!([1]), BAD),
        // max_tokens: negative, zero, fractional, a string, absurd.
        field("negative max_tokens", "max_tokens", json!(-1), BAD),
        field("zero max_tokens", "max_tokens", json!(0), BAD),
        field("fractional max_tokens", "max_tokens", json!(1.5), BAD),
        field("max_tokens as a string", "max_tokens", json!("10"), BAD),
        field(
            "negative max_completion_tokens",
            "max_completion_tokens",
            json!(-5),
            BAD,
        ),
        field("i64::MIN max_tokens", "max_tokens", json!(i64::MIN), BAD),
        field(
            "u64::MAX max_tokens",
            "max_tokens",
            json!(u64::MAX),
            Want::Clamped,
        ),
        field(
            "a trillion max_tokens",
            "max_tokens",
            json!(1_000_000_000_000u64),
            Want::Clamped,
        ),
        // Completions: prompts of the wrong kind.
        to(
            "a prompt that is an object",
            "/v1/completions",
            json!({"prompt": {"text": PROMPT}}).to_string(),
            BAD,
        ),
        to(
            "token ids past the vocabulary",
            "/v1/completions",
            json!({"prompt": [1, 2, 999_999_999]}).to_string(),
            BAD,
        ),
        to(
            "negative token ids",
            "/v1/completions",
            json!({"prompt": [1, -2]}).to_string(),
            BAD,
        ),
        to(
            "a prompt list of two",
            "/v1/completions",
            json!({"prompt": [PROMPT, PROMPT]}).to_string(),
            UNSUPPORTED,
        ),
        // Paths and methods.
        Case {
            method: "GET",
            ..raw(
                "GET on a generation endpoint",
                "",
                Want::Refused(405, "method_not_allowed"),
            )
        },
        Case {
            method: "DELETE",
            ..raw(
                "DELETE on a generation endpoint",
                "",
                Want::Refused(405, "method_not_allowed"),
            )
        },
        to(
            "an unknown path",
            "/v1/chat/completion",
            "{}",
            Want::Refused(404, "not_found"),
        ),
        to(
            "a traversal path",
            "/v1/../admin/policy",
            "{}",
            Want::Refused(404, "not_found"),
        ),
        Case {
            method: "GET",
            ..to(
                "the admin endpoint with a tenant key",
                "/admin/policy",
                "",
                NO_KEY,
            )
        },
        Case {
            method: "GET",
            headers: vec![],
            ..to(
                "the admin endpoint without a key",
                "/admin/policy",
                "",
                NO_KEY,
            )
        },
        Case {
            method: "GET",
            headers: vec![bearer(WRONG_KEY)],
            ..to("the models list with a wrong key", "/v1/models", "", NO_KEY)
        },
    ]
}
