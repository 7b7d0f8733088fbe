use serde_json::json;

use super::*;

const CHAT: Endpoint = Endpoint::ChatCompletions;
const COMPLETIONS: Endpoint = Endpoint::Completions;

fn limits() -> Limits {
    Limits::default()
}

#[test]
fn exactly_the_cap_is_accepted_one_more_is_refused_with_both_numbers() {
    let mut body = json!({"prompt": "x"});
    assert_eq!(apply(&limits(), CHAT, 8192, &mut body), Ok(512));
    let e = apply(&limits(), CHAT, 8193, &mut json!({})).expect_err("over the cap");
    assert_eq!(
        e,
        GatewayError::InputTooLong {
            tokens: 8193,
            limit: 8192,
            param: "messages",
        }
    );
    let msg = e.to_string();
    assert!(msg.contains("8193") && msg.contains("8192"), "{msg}");
    let j = e.to_json();
    assert_eq!(j["error"]["code"], "context_length_exceeded");
    assert_eq!(j["error"]["param"], "messages");
    assert_eq!(e.into_response().status(), http::StatusCode::BAD_REQUEST);
    // A completions prompt is named as such.
    let e = apply(&limits(), COMPLETIONS, 8193, &mut json!({})).expect_err("over the cap");
    assert_eq!(e.to_json()["error"]["param"], "prompt");
}

#[test]
fn max_tokens_is_defaulted_and_clamped_into_the_body() {
    let mut body = json!({"prompt": "x"});
    assert_eq!(apply(&limits(), CHAT, 100, &mut body), Ok(512));
    assert_eq!(body["max_tokens"], 512);
    let mut body = json!({"prompt": "x", "max_tokens": 100000});
    assert_eq!(apply(&limits(), CHAT, 100, &mut body), Ok(4096));
    assert_eq!(body["max_tokens"], 4096);
    let mut body = json!({"prompt": "x", "max_completion_tokens": 64, "ignore_eos": true});
    assert_eq!(apply(&limits(), CHAT, 100, &mut body), Ok(64));
    assert_eq!(body["max_completion_tokens"], 64);
    assert_eq!(body["ignore_eos"], true, "unused fields pass through");
    assert!(body.get("max_tokens").is_none());
}

#[test]
fn the_default_shrinks_to_fit_the_window_an_explicit_value_does_not() {
    let l = Limits {
        input_tokens_max: 12000,
        ..limits()
    };
    let mut body = json!({});
    assert_eq!(apply(&l, CHAT, 12000, &mut body), Ok(288));
    let e = apply(&l, CHAT, 12000, &mut json!({"max_tokens": 300})).expect_err("window");
    assert_eq!(
        e,
        GatewayError::ContextWindow {
            prompt: 12000,
            max_tokens: 300,
            window: 12288,
            param: "max_tokens"
        }
    );
    assert_eq!(e.to_json()["error"]["code"], "context_length_exceeded");
    assert_eq!(e.to_json()["error"]["param"], "max_tokens");
}

#[test]
fn bad_max_tokens_values_are_400() {
    for bad in [json!(0), json!(-1), json!("many"), json!(1.5)] {
        let e = apply(&limits(), CHAT, 10, &mut json!({"max_tokens": bad})).expect_err("bad");
        assert_eq!(e.class().status, http::StatusCode::BAD_REQUEST, "{bad}");
    }
    let mut body = json!({"max_tokens": null});
    assert_eq!(apply(&limits(), CHAT, 10, &mut body), Ok(512));
}

#[test]
fn every_budget_field_named_gets_the_effective_value() {
    // Chat: max_completion_tokens rules, and max_tokens beside it is lowered to the same value,
    // so an upstream that reads either cannot run past what was capped and charged.
    let mut body = json!({"max_completion_tokens": 1, "max_tokens": 100000});
    assert_eq!(apply(&limits(), CHAT, 100, &mut body), Ok(1));
    assert_eq!(body["max_completion_tokens"], 1);
    assert_eq!(body["max_tokens"], 1);
    let mut body = json!({"max_completion_tokens": 100000, "max_tokens": 3});
    assert_eq!(apply(&limits(), CHAT, 100, &mut body), Ok(4096));
    assert_eq!(body["max_tokens"], 4096);
    // The field that does not rule is still checked.
    let e = apply(
        &limits(),
        CHAT,
        10,
        &mut json!({"max_completion_tokens": 5, "max_tokens": -5}),
    )
    .expect_err("bad max_tokens");
    assert_eq!(e.to_json()["error"]["param"], "max_tokens");
    // A null one stays null.
    let mut body = json!({"max_completion_tokens": 7, "max_tokens": null});
    assert_eq!(apply(&limits(), CHAT, 10, &mut body), Ok(7));
    assert!(body["max_tokens"].is_null());
}

#[test]
fn completions_take_max_tokens_only() {
    let e = apply(
        &limits(),
        COMPLETIONS,
        10,
        &mut json!({"max_completion_tokens": 1, "max_tokens": 100000}),
    )
    .expect_err("not a completions field");
    let j = e.to_json();
    assert_eq!(j["error"]["param"], "max_completion_tokens");
    assert_eq!(j["error"]["code"], "unsupported_parameter");
    assert_eq!(e.class().status, http::StatusCode::BAD_REQUEST);
    let mut body = json!({"max_tokens": 100000, "max_completion_tokens": null});
    assert_eq!(apply(&limits(), COMPLETIONS, 10, &mut body), Ok(4096));
    assert_eq!(body["max_tokens"], 4096);
}
