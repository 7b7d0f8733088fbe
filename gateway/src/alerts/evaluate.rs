//! The alerting task: samples the counters, decides, and hands notifications to delivery.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::notice::{policy_text, shedding_text, Alert, AlertName, ShedDetails, Status};
use super::sink::{AlertSink, Dispatcher, Target};
use super::window::{Counts, ShedWindow};
use super::{Command, Shared};
use crate::policy::{Alerts, LoadedPolicy, PolicyStore};
use crate::telemetry::Metrics;

/// A firing `endsAt` lies this many repeat intervals ahead.
const ENDS_AFTER_REPEATS: u32 = 4;

/// An alert that is firing.
#[derive(Debug)]
struct Firing {
    started_at: SystemTime,
    last_sent: Instant,
}

/// The task's state.
#[derive(Debug)]
pub(super) struct Evaluator {
    metrics: Arc<Metrics>,
    store: Arc<PolicyStore>,
    dispatcher: Dispatcher,
    shared: Arc<Shared>,
    window: ShedWindow,
    shedding: Option<Firing>,
    policy: Option<Firing>,
    /// The newest policy reload error.
    policy_error: String,
    /// The `instance` label of every alert.
    instance: String,
}

impl Evaluator {
    pub(super) fn new(
        metrics: Arc<Metrics>,
        store: Arc<PolicyStore>,
        sink: Arc<dyn AlertSink>,
        shared: Arc<Shared>,
        instance: String,
    ) -> Self {
        Self {
            instance,
            metrics,
            store,
            dispatcher: Dispatcher::spawn(sink, shared.clone()),
            shared,
            window: ShedWindow::default(),
            shedding: None,
            policy: None,
            policy_error: String::new(),
        }
    }

    /// Evaluates now and every `evaluate_every` (as the policy says at the time), and follows
    /// commands, until every [`super::Alerter`] is dropped.
    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut next = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    let every = self.evaluate();
                    next = Instant::now() + every;
                }
                got = commands.recv() => match got {
                    Some(command) => self.command(command),
                    None => return,
                },
            }
        }
    }

    /// One evaluation; returns the interval until the next.
    fn evaluate(&mut self) -> Duration {
        let loaded = self.store.current();
        let al = &loaded.policy.alerts;
        let now = Instant::now();
        let share = self
            .window
            .sample(now, Counts::of(&self.metrics), al.window);
        self.shared
            .share
            .store(share.ratio().to_bits(), Ordering::Relaxed);
        let details = ShedDetails {
            share: share.ratio(),
            shed: share.shed,
            total: share.ended,
            window: al.window,
        };
        let was_firing = self.shedding.is_some();
        match (was_firing, share.fires(was_firing, al)) {
            (false, true) => {
                tracing::warn!(
                    share = details.share,
                    shed = details.shed,
                    total = details.total,
                    "load shedding alert firing"
                );
                let started_at = SystemTime::now();
                self.shedding = Some(Firing {
                    started_at,
                    last_sent: now,
                });
                self.send_shedding(&loaded, Status::Firing, &details, started_at);
            }
            (true, false) => {
                if let Some(f) = self.shedding.take() {
                    tracing::info!(share = details.share, "load shedding alert resolved");
                    self.send_shedding(&loaded, Status::Resolved, &details, f.started_at);
                }
            }
            (true, true) => {
                if let Some(started_at) = due(&mut self.shedding, now, al) {
                    self.send_shedding(&loaded, Status::Firing, &details, started_at);
                }
            }
            (false, false) => {}
        }
        self.shared
            .shedding
            .store(self.shedding.is_some(), Ordering::Relaxed);

        if let Some(started_at) = due(&mut self.policy, now, al) {
            self.send_policy(&loaded, Status::Firing, &self.policy_error, started_at);
        }
        al.evaluate_every
    }

    fn command(&mut self, command: Command) {
        let loaded = self.store.current();
        match command {
            Command::PolicyFailed(message) => {
                let started_at = self
                    .policy
                    .as_ref()
                    .map_or_else(SystemTime::now, |f| f.started_at);
                self.send_policy(&loaded, Status::Firing, &message, started_at);
                self.policy = Some(Firing {
                    started_at,
                    last_sent: Instant::now(),
                });
                self.policy_error = message;
            }
            Command::PolicyOk => {
                if let Some(firing) = self.policy.take() {
                    tracing::info!("policy reload alert resolved");
                    self.send_policy(
                        &loaded,
                        Status::Resolved,
                        &self.policy_error,
                        firing.started_at,
                    );
                }
            }
        }
        self.shared
            .policy
            .store(self.policy.is_some(), Ordering::Relaxed);
    }

    fn send_shedding(
        &self,
        loaded: &LoadedPolicy,
        status: Status,
        details: &ShedDetails,
        started_at: SystemTime,
    ) {
        let al = &loaded.policy.alerts;
        let threshold = match status {
            Status::Firing => al.shed_ratio,
            Status::Resolved => al.resolve_ratio,
        };
        let (summary, description) = shedding_text(status, details, threshold);
        let mut alert = notice(
            loaded,
            &self.instance,
            AlertName::LoadShedding,
            status,
            started_at,
        );
        alert.summary = summary;
        alert.description = description;
        alert.shed = Some(*details);
        self.dispatcher.send(alert, targets(al));
    }

    fn send_policy(
        &self,
        loaded: &LoadedPolicy,
        status: Status,
        message: &str,
        started_at: SystemTime,
    ) {
        let (summary, description) = policy_text(status, message);
        let mut alert = notice(
            loaded,
            &self.instance,
            AlertName::PolicyReloadFailed,
            status,
            started_at,
        );
        alert.summary = summary;
        alert.description = description;
        self.dispatcher.send(alert, targets(&loaded.policy.alerts));
    }
}

/// When the firing alert in `slot` is due to be sent again: marks it sent and returns its
/// start.
fn due(slot: &mut Option<Firing>, now: Instant, al: &Alerts) -> Option<SystemTime> {
    let f = slot.as_mut()?;
    if now.saturating_duration_since(f.last_sent) < al.repeat_interval {
        return None;
    }
    f.last_sent = now;
    Some(f.started_at)
}

/// A notification from `instance` without its texts, timed for `status`.
fn notice(
    loaded: &LoadedPolicy,
    instance: &str,
    name: AlertName,
    status: Status,
    starts_at: SystemTime,
) -> Alert {
    let al = &loaded.policy.alerts;
    let now = SystemTime::now();
    let ends_at = match status {
        Status::Resolved => now,
        Status::Firing => now + al.repeat_interval.max(al.evaluate_every) * ENDS_AFTER_REPEATS,
    };
    Alert {
        name,
        status,
        summary: String::new(),
        description: String::new(),
        starts_at,
        ends_at,
        generator_url: format!("https://{instance}/metrics"),
        instance: instance.to_owned(),
        shed: None,
    }
}

/// Where notifications go under `al`: every Alertmanager, then every webhook.
fn targets(al: &Alerts) -> Vec<Target> {
    let managers = al
        .alertmanager_urls
        .iter()
        .cloned()
        .map(Target::Alertmanager);
    let hooks = al.webhooks.iter().cloned().map(Target::Webhook);
    managers.chain(hooks).collect()
}
