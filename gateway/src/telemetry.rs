//! Metrics in Prometheus text.

use std::fmt::Write;

use http::{header, HeaderValue, Response};

use crate::app::App;
use crate::body::{self, GatewayBody};

/// `GET /metrics`.
pub fn render(app: &App) -> Response<GatewayBody> {
    let s = app.admission.snapshot();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, v: usize| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    };
    gauge(
        "sluice_active_requests",
        "Requests holding an upstream slot.",
        s.active,
    );
    gauge(
        "sluice_active_heavy_requests",
        "Heavy-input requests holding a slot.",
        s.heavy_active,
    );
    gauge(
        "sluice_active_max",
        "The admission ceiling in force.",
        s.active_max,
    );
    gauge(
        "sluice_queue_depth_max",
        "The queue bound in force.",
        s.queue_depth,
    );
    let _ = writeln!(
        out,
        "# HELP sluice_queue_depth Requests waiting for a slot.\n# TYPE sluice_queue_depth gauge\n\
         sluice_queue_depth{{class=\"interactive\"}} {}\nsluice_queue_depth{{class=\"batch\"}} {}",
        s.queued_interactive, s.queued_batch
    );
    let mut resp = Response::new(body::full(out));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    resp
}
