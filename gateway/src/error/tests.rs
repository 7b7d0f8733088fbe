use std::time::Duration;

use http::StatusCode;

use super::*;

/// Every condition, its status and code: the table `docs/api.md` lists.
#[test]
fn every_condition_has_its_status_and_code() {
    let d = Duration::from_secs(3);
    let cases: Vec<(GatewayError, StatusCode, &str)> = vec![
        (
            GatewayError::MissingApiKey,
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
        ),
        (
            GatewayError::InvalidApiKey,
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
        ),
        (
            GatewayError::RateLimited {
                tenant: "a".into(),
                rate: 1.0,
                retry_after: d,
            },
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
        ),
        (
            GatewayError::TokenBudget {
                tenant: "a".into(),
                budget: 10,
                needed: 20,
                retry_after: d,
            },
            StatusCode::TOO_MANY_REQUESTS,
            "tokens_per_minute_exceeded",
        ),
        (
            GatewayError::BodyTooLarge { limit: 1 },
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
        (
            GatewayError::UnreadableBody("x".into()),
            StatusCode::BAD_REQUEST,
            "unreadable_body",
        ),
        (
            GatewayError::BodyTimeout(Duration::from_secs(10)),
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
        ),
        (
            GatewayError::InvalidJson("x".into()),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            GatewayError::InvalidRequest {
                param: None,
                code: None,
                message: "x".into(),
            },
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            GatewayError::InputTooLong {
                tokens: 2,
                limit: 1,
                param: "messages",
            },
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
        ),
        (
            GatewayError::ContextWindow {
                prompt: 2,
                max_tokens: 2,
                window: 3,
                param: "max_tokens",
            },
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
        ),
        (
            GatewayError::Overloaded {
                class: Class::Interactive,
                retry_after: d,
            },
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
        ),
        (
            GatewayError::DeadlineUnmeetable {
                class: Class::Interactive,
                predicted: d,
                deadline: d,
                retry_after: d,
                why: Unmeetable::WouldDisplace,
                line_full: false,
                stretched: None,
            },
            StatusCode::SERVICE_UNAVAILABLE,
            "deadline_unmeetable",
        ),
        (
            GatewayError::QueueTimeout { waited: d },
            StatusCode::SERVICE_UNAVAILABLE,
            "queue_timeout",
        ),
        (
            GatewayError::EngineUnavailable("x".into()),
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_unavailable",
        ),
        (
            GatewayError::SharedStateUnavailable("x".into()),
            StatusCode::SERVICE_UNAVAILABLE,
            "shared_state_unavailable",
        ),
        (
            GatewayError::Upstream("x".into()),
            StatusCode::BAD_GATEWAY,
            "upstream_error",
        ),
        (
            GatewayError::UpstreamTimeout(d),
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
        ),
        (
            GatewayError::NotFound {
                method: "GET".into(),
                path: "/x".into(),
            },
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            GatewayError::MethodNotAllowed {
                method: "GET".into(),
                path: "/x".into(),
                allow: "POST",
            },
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            GatewayError::Internal("x".into()),
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
        ),
    ];
    for (e, status, code) in cases {
        let j = e.to_json();
        assert_eq!(j["error"]["code"], code, "{e:?}");
        assert!(j["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(j["error"]["type"].as_str().is_some());
        let resp = e.into_response();
        assert_eq!(resp.status(), status, "{code}");
        assert_eq!(resp.headers()["content-type"], "application/json");
    }
}

#[test]
fn retry_after_is_whole_seconds_rounded_up() {
    let e = GatewayError::Overloaded {
        class: Class::Batch,
        retry_after: Duration::from_millis(2100),
    };
    assert_eq!(e.into_response().headers()["retry-after"], "3");
    let e = GatewayError::Overloaded {
        class: Class::Batch,
        retry_after: Duration::from_millis(10),
    };
    assert_eq!(e.into_response().headers()["retry-after"], "1");
}

#[test]
fn field_errors_keep_their_param_and_code() {
    let e = GatewayError::InvalidRequest {
        param: Some("n".into()),
        code: Some("unsupported_parameter".into()),
        message: "n: only n = 1 is supported".into(),
    };
    let j = e.to_json();
    assert_eq!(j["error"]["param"], "n");
    assert_eq!(j["error"]["code"], "unsupported_parameter");
    let e = GatewayError::MethodNotAllowed {
        method: "GET".into(),
        path: "/v1/completions".into(),
        allow: "POST",
    };
    assert_eq!(e.into_response().headers()["allow"], "POST");
}

/// A refusal by deadline quotes the prediction and the rule that refused it, so that a
/// prediction inside the deadline never reads as a contradiction.
#[test]
fn a_deadline_refusal_says_why() {
    let refusal = |predicted_ms, why| GatewayError::DeadlineUnmeetable {
        class: Class::Interactive,
        predicted: Duration::from_millis(predicted_ms),
        deadline: Duration::from_secs(5),
        retry_after: Duration::from_millis(1130),
        why,
        line_full: false,
        stretched: None,
    };
    let late = Unmeetable::Late {
        margin: Duration::ZERO,
    };
    assert_eq!(
        refusal(6_200, late).to_string(),
        "the interactive TTFT deadline of 5s cannot be met: the predicted time to first token \
         is 6.2s; retry after 1.13s"
    );
    let margin = Unmeetable::Late {
        margin: Duration::from_micros(1_987_654),
    };
    assert_eq!(
        refusal(4_143, margin).to_string(),
        "the interactive TTFT deadline of 5s cannot be met: the predicted time to first token \
         is 4.143s, 6.13s with the margin for how late recent first tokens came; retry after 1.13s"
    );
    assert_eq!(
        refusal(4_143, Unmeetable::WouldDisplace).to_string(),
        "the interactive TTFT deadline of 5s cannot be met: its predicted time to first token is \
         4.143s, but admitting it would make a request already waiting miss its own deadline; \
         retry after 1.13s"
    );
    assert_eq!(
        refusal(4_143, Unmeetable::Held).to_string(),
        "the interactive TTFT deadline of 5s cannot be met: its predicted time to first token is \
         4.143s, but its room is held for a request told to come back before it; retry after \
         1.13s"
    );
}

/// A refusal held to a deadline later than its class's says so, and why.
#[test]
fn a_refusal_under_a_stretched_class_deadline_says_so() {
    let err = GatewayError::DeadlineUnmeetable {
        class: Class::Batch,
        predicted: Duration::from_secs(40),
        deadline: Duration::from_secs(35),
        retry_after: Duration::from_secs(5),
        why: Unmeetable::Late {
            margin: Duration::ZERO,
        },
        line_full: false,
        stretched: Some(Stretched {
            asked: Duration::from_secs(30),
            by_request: false,
            alone: Duration::from_secs(28),
        }),
    };
    assert_eq!(
        err.to_string(),
        "the batch TTFT deadline of 35s (stretched from the 30s of its class: this prompt alone \
         is predicted to take 28s) cannot be met: the predicted time to first token is 40s; retry \
         after 5s"
    );
}

/// A `Retry-After` that is the line's cap, not a prediction, says so.
#[test]
fn a_refusal_at_the_lines_cap_says_it_is_one() {
    let err = GatewayError::DeadlineUnmeetable {
        class: Class::Interactive,
        predicted: Duration::from_millis(9_000),
        deadline: Duration::from_secs(5),
        retry_after: Duration::from_secs(60),
        why: Unmeetable::Late {
            margin: Duration::ZERO,
        },
        line_full: true,
        stretched: None,
    };
    assert_eq!(
        err.to_string(),
        "the interactive TTFT deadline of 5s cannot be met: the predicted time to first token \
         is 9s; retry after 60s at the earliest: the requests told to come back before this one \
         fill more than that (the server is over capacity)"
    );
    assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
}
