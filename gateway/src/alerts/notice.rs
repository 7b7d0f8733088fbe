//! One alert notification, and its two wire formats: Alertmanager's v2 API and a plain JSON
//! webhook.

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

/// The alerts the gateway raises itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlertName {
    /// The share of shed requests over the window passed `alerts.shed_ratio`.
    LoadShedding,
    /// The last policy edit was refused; the gateway runs on the last good policy.
    PolicyReloadFailed,
}

impl AlertName {
    /// Every alert, in a fixed order (for `/metrics`).
    pub const ALL: [AlertName; 2] = [Self::LoadShedding, Self::PolicyReloadFailed];

    /// The `alertname` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LoadShedding => "SluiceLoadShedding",
            Self::PolicyReloadFailed => "SluicePolicyReloadFailed",
        }
    }

    /// The `severity` label: shedding turns clients away now; a refused policy edit does not.
    pub fn severity(self) -> &'static str {
        match self {
            Self::LoadShedding => "critical",
            Self::PolicyReloadFailed => "warning",
        }
    }
}

/// Whether a notification raises (or repeats) an alert or ends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Firing,
    Resolved,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Firing => "firing",
            Self::Resolved => "resolved",
        }
    }
}

/// The numbers behind a shedding alert.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShedDetails {
    /// `shed / total`.
    pub share: f64,
    pub shed: u64,
    pub total: u64,
    pub window: Duration,
}

/// One notification about one alert.
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub name: AlertName,
    pub status: Status,
    pub summary: String,
    pub description: String,
    /// When the alert started firing (kept across repeats and in the resolve).
    pub starts_at: SystemTime,
    /// Resolved: now. Firing: a few repeat intervals ahead, so Alertmanager resolves it by
    /// itself if the gateway goes away without resolving it.
    pub ends_at: SystemTime,
    /// Which gateway raised it (`host:port`), the `instance` label: several gateways in front
    /// of one deployment raise the same alert, and Alertmanager must keep them apart (one
    /// gateway's resolve must not end another's alert).
    pub instance: String,
    /// Where to look: the gateway's `/metrics`.
    pub generator_url: String,
    /// Shedding alerts only.
    pub shed: Option<ShedDetails>,
}

impl Alert {
    /// One element of the array `POST /api/v2/alerts` takes (Alertmanager's `postableAlert`).
    pub fn alertmanager_json(&self) -> Value {
        json!({
            "labels": {
                "alertname": self.name.as_str(),
                "severity": self.name.severity(),
                "service": "sluice",
                "instance": self.instance,
            },
            "annotations": {
                "summary": self.summary,
                "description": self.description,
            },
            "startsAt": rfc3339(self.starts_at),
            "endsAt": rfc3339(self.ends_at),
            "generatorURL": self.generator_url,
        })
    }

    /// The body of a plain webhook:
    /// `{status, alert, severity, instance, summary, description, started_at, [share, shed,
    /// total, window_seconds]}`.
    pub fn webhook_json(&self) -> Value {
        let mut v = json!({
            "status": self.status.as_str(),
            "alert": self.name.as_str(),
            "severity": self.name.severity(),
            "instance": self.instance,
            "summary": self.summary,
            "description": self.description,
            "started_at": rfc3339(self.starts_at),
        });
        if let (Some(d), Some(obj)) = (self.shed, v.as_object_mut()) {
            obj.insert("share".into(), json!(d.share));
            obj.insert("shed".into(), json!(d.shed));
            obj.insert("total".into(), json!(d.total));
            obj.insert("window_seconds".into(), json!(d.window.as_secs_f64()));
        }
        v
    }
}

/// The `instance` of a gateway listening on `listen`: the address, or the host's name in
/// place of an unspecified IP (`0.0.0.0:8443` on every host would tell no gateway apart).
pub fn instance(listen: std::net::SocketAddr) -> String {
    if !listen.ip().is_unspecified() {
        return listen.to_string();
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{name}:{}", listen.port())
}

/// `2025-01-31T12:00:00.000Z`.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The summary and description of a shedding alert.
pub(super) fn shedding_text(status: Status, d: &ShedDetails, threshold: f64) -> (String, String) {
    let window = humantime::format_duration(d.window);
    let percent = d.share * 100.0;
    match status {
        Status::Firing => (
            format!("Sluice is shedding {percent:.1}% of requests"),
            format!(
                "{shed} of {total} requests ended over the last {window} were shed \
                 (503 overloaded or queue_timeout): {percent:.1}%, at or above the \
                 alerts.shed_ratio of {threshold_pct:.1}%. Clients are being turned away; \
                 add capacity or lower the load.",
                shed = d.shed,
                total = d.total,
                threshold_pct = threshold * 100.0,
            ),
        ),
        Status::Resolved => (
            "Sluice stopped shedding requests".to_string(),
            format!(
                "{shed} of {total} requests ended over the last {window} were shed: \
                 {percent:.1}%, below alerts.resolve_ratio of {threshold_pct:.1}%.",
                shed = d.shed,
                total = d.total,
                threshold_pct = threshold * 100.0,
            ),
        ),
    }
}

/// The summary and description of the policy alert.
pub(super) fn policy_text(status: Status, message: &str) -> (String, String) {
    match status {
        Status::Firing => (
            "Sluice refused a policy edit; the last good policy stays in force".to_string(),
            format!("The policy file failed to reload: {message}"),
        ),
        Status::Resolved => (
            "Sluice's policy file reloads again".to_string(),
            format!("A good policy was loaded after the refused edit ({message})."),
        ),
    }
}
