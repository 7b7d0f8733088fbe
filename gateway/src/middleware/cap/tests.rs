use serde_json::json;

use super::*;

fn limits() -> Limits {
    Limits::default()
}

#[test]
fn exactly_the_cap_is_accepted_one_more_is_refused_with_both_numbers() {
    let mut body = json!({"prompt": "x"});
    assert_eq!(apply(&limits(), "messages", 8192, &mut body), Ok(512));
    let e = apply(&limits(), "messages", 8193, &mut json!({})).expect_err("over the cap");
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
    let e = apply(&limits(), "prompt", 8193, &mut json!({})).expect_err("over the cap");
    assert_eq!(e.to_json()["error"]["param"], "prompt");
}

#[test]
fn max_tokens_is_defaulted_and_clamped_into_the_body() {
    let mut body = json!({"prompt": "x"});
    assert_eq!(apply(&limits(), "messages", 100, &mut body), Ok(512));
    assert_eq!(body["max_tokens"], 512);
    let mut body = json!({"prompt": "x", "max_tokens": 100000});
    assert_eq!(apply(&limits(), "messages", 100, &mut body), Ok(4096));
    assert_eq!(body["max_tokens"], 4096);
    let mut body = json!({"prompt": "x", "max_completion_tokens": 64, "ignore_eos": true});
    assert_eq!(apply(&limits(), "messages", 100, &mut body), Ok(64));
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
    assert_eq!(apply(&l, "messages", 12000, &mut body), Ok(288));
    let e = apply(&l, "messages", 12000, &mut json!({"max_tokens": 300})).expect_err("window");
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
        let e = apply(&limits(), "messages", 10, &mut json!({"max_tokens": bad})).expect_err("bad");
        assert_eq!(e.class().status, http::StatusCode::BAD_REQUEST, "{bad}");
    }
    let mut body = json!({"max_tokens": null});
    assert_eq!(apply(&limits(), "messages", 10, &mut body), Ok(512));
}
