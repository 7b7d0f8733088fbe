//! The gateway's own alerts, posted to Alertmanager (v2 API) and/or plain JSON webhooks.
//!
//! - `SluiceLoadShedding`: every `alerts.evaluate_every` the [`Alerter`] samples the outcome
//!   counters of [`Metrics`]; when the share of requests shed (503 `overloaded` or
//!   `queue_timeout`) among those ended over `alerts.window` reaches `alerts.shed_ratio` (with
//!   at least `alerts.min_requests` ended), it fires. It repeats every `alerts.repeat_interval`
//!   while firing and resolves only once the share falls below `alerts.resolve_ratio`.
//! - `SluicePolicyReloadFailed`: raised by [`Alerter::policy_reload_failed`] with the reload
//!   error (file, line and column), repeated while firing, resolved by the next good reload
//!   ([`Alerter::policy_reload_ok`]).
//!
//! The settings are read from the policy in force at every evaluation, so they follow a
//! reload. Posting never blocks the evaluation: notifications queue for a delivery task, and
//! failures are logged at warn, at most once a minute per target. No URL configured: nothing
//! is sent (the alert still shows in the logs and in [`Alerter::render_prometheus`]). Every
//! alert carries the label `instance` (the gateway's `host:port`), so that the alerts of several
//! gateways in front of one deployment stay apart in Alertmanager.
//!
//! - [`window`]: the shed share over the sliding window, and the hysteresis rule.
//! - [`notice`]: one notification and its wire formats.
//! - [`sink`]: the [`AlertSink`] trait, its HTTP implementation, delivery.

mod evaluate;
pub mod notice;
pub mod sink;
pub mod window;

#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use sluice_engine::prom::header as help;
use tokio::sync::mpsc;

pub use notice::{instance, Alert, AlertName, ShedDetails, Status};
pub use sink::{AlertSink, HttpSink, SendError, Target};
pub use window::{Counts, Share, ShedWindow};

use crate::policy::PolicyStore;
use crate::telemetry::Metrics;
use crate::tls::TlsError;

/// What the alerter task is told from outside.
#[derive(Debug)]
enum Command {
    PolicyFailed(String),
    PolicyOk,
}

/// State the task publishes for [`Alerter::render_prometheus`] and [`Alerter::firing`].
#[derive(Debug, Default)]
struct Shared {
    shedding: AtomicBool,
    policy: AtomicBool,
    /// `f64` bits of the last shed share.
    share: AtomicU64,
    sent_ok: AtomicU64,
    sent_error: AtomicU64,
    dropped: AtomicU64,
}

/// A handle on the alerting task. Cheap to clone; the task stops once every handle is gone.
#[derive(Clone, Debug)]
pub struct Alerter {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
}

impl Alerter {
    /// Starts alerting over HTTP or HTTPS (trusting `alerts.ca`, else the system's roots) on
    /// the counters of `metrics`, with the `[alerts]` settings of the policy in force in
    /// `store`, every alert labelled `instance` (see [`instance`]). Call inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// `alerts.ca` cannot be read or holds no certificate.
    pub fn spawn(
        metrics: Arc<Metrics>,
        store: Arc<PolicyStore>,
        instance: String,
    ) -> Result<Self, TlsError> {
        let sink = HttpSink::new(store.current().policy.alerts.ca.as_deref())?;
        Ok(Self::spawn_with(metrics, store, Arc::new(sink), instance))
    }

    /// [`Alerter::spawn`] with notifications going to `sink`.
    pub fn spawn_with(
        metrics: Arc<Metrics>,
        store: Arc<PolicyStore>,
        sink: Arc<dyn AlertSink>,
        instance: String,
    ) -> Self {
        let shared = Arc::new(Shared::default());
        let (commands, rx) = mpsc::unbounded_channel();
        let task = evaluate::Evaluator::new(metrics, store, sink, shared.clone(), instance);
        tokio::spawn(task.run(rx));
        Self { commands, shared }
    }

    /// A policy reload was refused with `message` (which names the file, line and column):
    /// fires `SluicePolicyReloadFailed`, or updates it with the newest error.
    pub fn policy_reload_failed(&self, message: &str) {
        let _ = self
            .commands
            .send(Command::PolicyFailed(message.to_owned()));
    }

    /// A policy reload succeeded: resolves `SluicePolicyReloadFailed` if it is firing.
    pub fn policy_reload_ok(&self) {
        let _ = self.commands.send(Command::PolicyOk);
    }

    /// Whether `alert` is firing now.
    pub fn firing(&self, alert: AlertName) -> bool {
        match alert {
            AlertName::LoadShedding => self.shared.shedding.load(Ordering::Relaxed),
            AlertName::PolicyReloadFailed => self.shared.policy.load(Ordering::Relaxed),
        }
    }

    /// The shed share over the window at the last evaluation.
    pub fn shed_share(&self) -> f64 {
        f64::from_bits(self.shared.share.load(Ordering::Relaxed))
    }

    /// Prometheus text for `/metrics`: `sluice_alert_firing{alertname}`,
    /// `sluice_alert_shed_ratio` and `sluice_alert_notifications_total{result}`.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        help(
            &mut out,
            "sluice_alert_firing",
            "Alerts the gateway raises itself: 1 while firing.",
            "gauge",
        );
        for name in AlertName::ALL {
            let _ = writeln!(
                out,
                "sluice_alert_firing{{alertname=\"{}\"}} {}",
                name.as_str(),
                u8::from(self.firing(name))
            );
        }
        help(
            &mut out,
            "sluice_alert_shed_ratio",
            "Share of the requests ended over alerts.window that were shed, at the last evaluation.",
            "gauge",
        );
        let _ = writeln!(out, "sluice_alert_shed_ratio {}", self.shed_share());
        help(
            &mut out,
            "sluice_alert_notifications_total",
            "Alert notifications posted, by result (dropped: the queue to slow targets was full).",
            "counter",
        );
        for (result, n) in [
            ("ok", &self.shared.sent_ok),
            ("error", &self.shared.sent_error),
            ("dropped", &self.shared.dropped),
        ] {
            let _ = writeln!(
                out,
                "sluice_alert_notifications_total{{result=\"{result}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        out
    }
}
