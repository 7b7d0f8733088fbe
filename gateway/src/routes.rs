//! Which path goes where: the generation endpoints into the stack, the rest answered here.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/chat/completions`, `POST /v1/completions` | the stack ([`crate::app::stack`]) |
//! | `GET /v1/models` | the model behind the gateway (API key required when tenants exist) |
//! | `GET /healthz` | 200 while the gateway runs (liveness) |
//! | `GET /readyz` | 200 when the upstream (every engine rank) is ready, else 503 |
//! | `GET /metrics` | Prometheus text |

use std::convert::Infallible;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tower::ServiceExt;

use crate::app::{App, Stack};
use crate::body::{self, GatewayBody};
use crate::error::GatewayError;
use crate::middleware::auth::Auth;
use crate::middleware::check::Check;
use crate::telemetry;

/// Routes requests.
#[derive(Clone, Debug)]
pub struct Router {
    pub app: App,
    pub stack: Stack,
}

impl Router {
    pub async fn handle(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<GatewayBody>, Infallible> {
        let path = req.uri().path();
        let method = req.method().clone();
        let resp = match (path, &method) {
            ("/v1/chat/completions" | "/v1/completions", &Method::POST) => {
                return self.stack.clone().oneshot(req).await;
            }
            ("/v1/chat/completions" | "/v1/completions", _) => Err(not_allowed(&req, "POST")),
            ("/v1/models", &Method::GET) => self.models(req),
            ("/healthz", &Method::GET) => Ok(json_ok(StatusCode::OK, &json!({"status": "ok"}))),
            ("/readyz", &Method::GET) => Ok(self.readyz()),
            ("/metrics", &Method::GET) => Ok(telemetry::render(&self.app)),
            ("/v1/models" | "/healthz" | "/readyz" | "/metrics", _) => {
                Err(not_allowed(&req, "GET"))
            }
            _ => Err(GatewayError::NotFound {
                method: method.to_string(),
                path: path.to_owned(),
            }),
        };
        Ok(resp.unwrap_or_else(|e| {
            e.log("-");
            e.into_response()
        }))
    }

    fn models(&self, mut req: Request<Incoming>) -> Result<Response<GatewayBody>, GatewayError> {
        Auth::new(self.app.policy.clone()).check(&mut req)?;
        Ok(json_ok(
            StatusCode::OK,
            &json!({
                "object": "list",
                "data": [{"id": self.app.model, "object": "model", "created": 0, "owned_by": "sluice"}],
            }),
        ))
    }

    fn readyz(&self) -> Response<GatewayBody> {
        let ready = self.app.upstream.is_ready();
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        json_ok(
            status,
            &json!({"ready": ready, "upstream": if ready { "ready" } else { "not ready" }}),
        )
    }
}

fn not_allowed<B>(req: &Request<B>, allow: &'static str) -> GatewayError {
    GatewayError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        allow,
    }
}

/// A JSON response.
pub fn json_ok(status: StatusCode, value: &serde_json::Value) -> Response<GatewayBody> {
    let mut resp = Response::new(body::json(value));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
