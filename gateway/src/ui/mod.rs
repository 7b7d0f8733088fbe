//! The status page: `GET /ui` (one self-contained HTML page) and `GET /ui/stats` (its figures
//! as JSON, polled by the page every 1.5 s).
//!
//! The page shows the engine ranks (up or down, KV pool use), active and queued requests per
//! class, the shed rate, queue wait and time to first token (p50/p95 over the last five
//! minutes), the policy in force, and has a chat box that streams from
//! `/v1/chat/completions`. Everything it needs is inline: its content security policy lets it
//! load nothing and talk to nothing but this gateway.
//!
//! - [`stats`]: the JSON.
//! - [`window`]: readings kept every 5 s for 5 min, and percentiles from their bucket deltas.
//!
//! Each gateway's [`Metrics`] get one [`Sampler`], made on the first call to [`start`] or the
//! first page view, and fed by a task that lives as long as those metrics. Call [`start`] when
//! the gateway starts so the window covers the minutes before anyone looks.

pub mod stats;
pub mod window;

#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, PoisonError, Weak};

use http::{header, HeaderValue, Response, StatusCode};
use tokio::time::MissedTickBehavior;

use crate::app::App;
use crate::body::{self, GatewayBody};
use crate::routes::json_ok;
use crate::telemetry::Metrics;
pub use stats::Stats;
pub use window::{quantile, Reading, Sampler, Window};

/// The page.
pub const INDEX_HTML: &str = include_str!("index.html");

/// What the page may do: run its own inline script and style, and fetch from this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /ui`.
pub fn page() -> Response<GatewayBody> {
    let mut resp = Response::new(body::full(INDEX_HTML));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

/// `GET /ui/stats`.
pub fn stats(app: &App) -> Response<GatewayBody> {
    let figures = Stats::collect(app, &start(app));
    let value = serde_json::to_value(&figures).unwrap_or_else(
        |e| serde_json::json!({"error": {"message": format!("cannot encode the stats: {e}")}}),
    );
    let mut resp = json_ok(StatusCode::OK, &value);
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `GET /ui/`: a permanent redirect to `/ui`.
pub fn redirect() -> Response<GatewayBody> {
    let mut resp = Response::new(body::full(""));
    *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/ui"));
    resp
}

/// One gateway's sampler, known by its metrics.
#[derive(Debug)]
struct Entry {
    metrics: Weak<Metrics>,
    sampler: Arc<Sampler>,
}

/// The samplers of the gateways in this process (tests run several).
static SAMPLERS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The sampler of `app`'s metrics, made (and its sampling task spawned, when called inside a
/// tokio runtime) on first use.
pub fn start(app: &App) -> Arc<Sampler> {
    let mut all = SAMPLERS.lock().unwrap_or_else(PoisonError::into_inner);
    all.retain(|e| e.metrics.strong_count() > 0);
    let wanted = Arc::downgrade(&app.metrics);
    if let Some(e) = all.iter().find(|e| e.metrics.ptr_eq(&wanted)) {
        return e.sampler.clone();
    }
    let sampler = Arc::new(Sampler::default());
    sampler.record(Reading::take(&app.metrics));
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(sample(wanted.clone(), Arc::downgrade(&sampler)));
    }
    all.push(Entry {
        metrics: wanted,
        sampler: sampler.clone(),
    });
    sampler
}

/// Keeps a reading every [`Sampler::every`] until the metrics or the sampler are gone.
async fn sample(metrics: Weak<Metrics>, sampler: Weak<Sampler>) {
    let every = match sampler.upgrade() {
        Some(s) => s.every(),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (Some(metrics), Some(sampler)) = (metrics.upgrade(), sampler.upgrade()) else {
            break;
        };
        sampler.record(Reading::take(&metrics));
    }
    SAMPLERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .retain(|e| e.metrics.strong_count() > 0);
}
