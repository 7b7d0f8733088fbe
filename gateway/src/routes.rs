//! Which path goes where: the generation endpoints into the stack, the rest answered here.
//!
//! | route | answer |
//! | --- | --- |
//! | `POST /v1/chat/completions`, `POST /v1/completions` | the stack ([`crate::app::stack`]) |
//! | `GET /v1/models` | the model behind the gateway (API key required when tenants exist) |
//! | `GET /healthz` | 200 while the gateway runs (liveness) |
//! | `GET /readyz` | 200 when the upstream (every engine rank) is ready, else 503 |
//! | `GET /metrics` | Prometheus text (each tenant's counters only on the probe listener or with the admin key) |
//! | `GET /admin/policy` | the policy in force: hash, load time, effective values (admin key) |
//! | `GET /ui`, `GET /ui/stats` | the status page and its figures ([`crate::ui`]) |
//!
//! The probe listener (`server.probe_listen`) answers [`PROBE_PATHS`] alone ([`Router::probe`]).

use std::convert::Infallible;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tower::ServiceExt;

use crate::app::{App, Stack};
use crate::body::{self, GatewayBody};
use crate::error::GatewayError;
use crate::middleware::auth::{key_matches, presented_key, Auth};
use crate::middleware::check::Check;

/// What the probe listener answers: liveness, readiness and metrics.
pub const PROBE_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

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
            ("/metrics", &Method::GET) => Ok(self.metrics(self.admin_presented(&req))),
            ("/admin/policy", &Method::GET) => self.admin_policy(&req),
            ("/ui", &Method::GET) => Ok(crate::ui::page()),
            ("/ui/", &Method::GET) => Ok(crate::ui::redirect()),
            ("/ui/stats", &Method::GET) => Ok(crate::ui::stats(&self.app)),
            // Without an admin key the endpoint is not there, whatever the method.
            ("/admin/policy", _) if !self.has_admin() => Err(not_found(&req)),
            (
                "/v1/models" | "/healthz" | "/readyz" | "/metrics" | "/admin/policy" | "/ui"
                | "/ui/" | "/ui/stats",
                _,
            ) => Err(not_allowed(&req, "GET")),
            _ => Err(not_found(&req)),
        };
        Ok(resp.unwrap_or_else(error_response))
    }

    /// A request on the probe listener: [`PROBE_PATHS`] as on the clients' listener, any other
    /// path 404 (no generation, no admin, no status page there).
    /// Its scrapes read each tenant's counters, as the deployment's own Prometheus does.
    pub async fn probe(&self, req: Request<Incoming>) -> Result<Response<GatewayBody>, Infallible> {
        if req.uri().path() == "/metrics" && req.method() == Method::GET {
            return Ok(self.metrics(true));
        }
        if PROBE_PATHS.contains(&req.uri().path()) {
            return self.handle(req).await;
        }
        Ok(error_response(not_found(&req)))
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

    /// Whether the policy in force names an admin key (without one, `/admin/policy` is 404).
    fn has_admin(&self) -> bool {
        self.app
            .policy
            .current()
            .policy
            .admin
            .api_key_sha256
            .is_some()
    }

    /// Whether `req` presents the admin key of the policy in force (compared in constant time).
    fn admin_presented<B>(&self, req: &Request<B>) -> bool {
        let loaded = self.app.policy.current();
        let admin = loaded.policy.admin.api_key_sha256.as_deref();
        admin
            .zip(presented_key(req))
            .is_some_and(|(admin, key)| key_matches(admin, key))
    }

    /// The policy in force; only with the admin key (404 when the policy names none, so the
    /// endpoint's existence says nothing to others).
    fn admin_policy<B>(&self, req: &Request<B>) -> Result<Response<GatewayBody>, GatewayError> {
        let loaded = self.app.policy.current();
        let Some(admin) = loaded.policy.admin.api_key_sha256.as_deref() else {
            return Err(not_found(req));
        };
        let key = presented_key(req).ok_or(GatewayError::MissingApiKey)?;
        if !key_matches(admin, key) {
            return Err(GatewayError::InvalidApiKey);
        }
        let loaded_at = loaded
            .loaded_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(json_ok(
            StatusCode::OK,
            &json!({
                "sha256": loaded.sha256,
                "loaded_at": loaded_at,
                "path": loaded.path.as_ref().map(|p| p.display().to_string()),
                "restart_pending": loaded.restart_pending,
                "access_changes": loaded.access_changes,
                "policy": crate::policy::redact::shown(&loaded.policy),
            }),
        ))
    }

    /// The gateway's metrics, the engine's ranks and the alerter's state; each tenant's
    /// counters too when `tenants`. The clients' listener asks no key for `/metrics`, and one
    /// tenant must not read another's name or volume there: they go to the probe listener's
    /// scrapes and to a scrape with the admin key.
    fn metrics(&self, tenants: bool) -> Response<GatewayBody> {
        let app = &self.app;
        let mut text = app
            .metrics
            .render(&app.admission.snapshot(), &app.upstream.ranks());
        if tenants {
            app.metrics.tenants.render(&mut text);
        }
        let loaded = app.policy.current();
        crate::telemetry::metrics::render_policy(&mut text, &loaded);
        let probes = loaded.policy.server.probe_listen.is_some();
        crate::telemetry::metrics::render_connections(
            &mut text,
            &app.connections,
            probes.then_some(&app.probe_connections),
        );
        crate::telemetry::metrics::render_failed_handshakes(&mut text, &app.failed_handshakes);
        if let Some(shared) = &app.shared {
            crate::telemetry::metrics::render_shared(&mut text, &shared.report());
        }
        crate::telemetry::metrics::render_prediction(&mut text, &app.admission.prediction());
        app.upstream.render_metrics(&mut text);
        if let Some(alerter) = app.alerter.get() {
            text.push_str(&alerter.render_prometheus());
        }
        let mut resp = Response::new(body::full(text));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(sluice_engine::prom::CONTENT_TYPE),
        );
        resp
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

fn not_found<B>(req: &Request<B>) -> GatewayError {
    GatewayError::NotFound {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
    }
}

/// The answer to a request refused here, outside the stack (logged as the stack logs its own).
fn error_response(e: GatewayError) -> Response<GatewayBody> {
    e.log("-");
    e.into_response()
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
