//! Where and how spans are exported: the OpenTelemetry SDK environment variables
//! (<https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/>), with
//! settings from elsewhere (the gateway's policy) as the fallback.

use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};

/// The OTLP transports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `grpc`: `TraceService/Export` over HTTP/2 cleartext.
    Grpc,
    /// `http/protobuf`: `POST /v1/traces` with a protobuf body (the specification's default).
    HttpProtobuf,
}

impl Protocol {
    fn parse(s: &str) -> Result<Self, OtlpConfigError> {
        match s.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            other => Err(OtlpConfigError::Protocol(other.to_owned())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Settings that stand in for unset variables (the gateway's `[traces]` policy section).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OtlpSettings {
    pub endpoint: Option<String>,
    pub protocol: Option<String>,
    pub service_name: Option<String>,
}

/// A resolved exporter configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpConfig {
    /// The full URL spans are sent to (`…/v1/traces` for HTTP, `…/<service>/Export` for gRPC).
    pub url: Uri,
    pub protocol: Protocol,
    pub service_name: String,
    /// `OTEL_EXPORTER_OTLP_HEADERS`: sent with every export (e.g. a collector's API key).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `OTEL_BSP_SCHEDULE_DELAY`: the longest a finished span waits to be sent.
    pub batch_delay: Duration,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`.
    pub max_batch: usize,
    /// `OTEL_BSP_MAX_QUEUE_SIZE`: spans beyond it are dropped (and counted), never blocking a
    /// request.
    pub max_queue: usize,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`: one export's limit.
    pub timeout: Duration,
}

/// A configuration that cannot work; the process says so at start instead of failing quietly.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OtlpConfigError {
    #[error("OTLP protocol {0:?} is not supported (use \"grpc\" or \"http/protobuf\")")]
    Protocol(String),
    #[error("OTLP endpoint {0:?} is not an http:// URL (TLS to the collector is not supported: run it on loopback or behind a local agent)")]
    Endpoint(String),
    #[error("{name}={value:?} is not a number")]
    Number { name: &'static str, value: String },
    #[error("OTEL_EXPORTER_OTLP_HEADERS entry {0:?} is not key=value")]
    Header(String),
}

const GRPC_EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

impl OtlpConfig {
    /// The configuration from the process's environment, `fallback` filling what it leaves
    /// unset; `None` when no endpoint is configured or export is disabled.
    pub fn from_env(
        fallback: &OtlpSettings,
        default_service: &str,
    ) -> Result<Option<Self>, OtlpConfigError> {
        Self::resolve(|k| std::env::var(k).ok(), fallback, default_service)
    }

    /// As [`Self::from_env`], reading variables through `var`.
    pub fn resolve(
        var: impl Fn(&str) -> Option<String>,
        fallback: &OtlpSettings,
        default_service: &str,
    ) -> Result<Option<Self>, OtlpConfigError> {
        let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none")
        {
            return Ok(None);
        }
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .or_else(|| fallback.protocol.clone())
        {
            Some(p) => Protocol::parse(&p)?,
            None => Protocol::HttpProtobuf,
        };
        // A signal-specific endpoint is the whole URL; the general one is a base to extend.
        let (base, whole) = match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            Some(e) => (e, true),
            None => {
                match var("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| fallback.endpoint.clone()) {
                    Some(e) => (e, false),
                    None => return Ok(None),
                }
            }
        };
        let url = export_url(&base, whole, protocol)?;
        let service_name = var("OTEL_SERVICE_NAME")
            .or_else(|| fallback.service_name.clone())
            .unwrap_or_else(|| default_service.to_owned());
        let headers = var("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
            .map_or(Ok(Vec::new()), |h| parse_headers(&h))?;
        let number = |name: &'static str, default: u64| match var(name) {
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map_err(|_| OtlpConfigError::Number {
                    name,
                    value: v.clone(),
                }),
            None => Ok(default),
        };
        Ok(Some(Self {
            url,
            protocol,
            service_name,
            headers,
            batch_delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)?),
            max_batch: number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.max(1) as usize,
            max_queue: number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?.max(1) as usize,
            timeout: Duration::from_millis(number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?),
        }))
    }

    /// As [`Self::resolve`], from a list of `(variable, value)` pairs.
    pub fn from_pairs(
        vars: &[(&str, &str)],
        fallback: &OtlpSettings,
        default_service: &str,
    ) -> Result<Option<Self>, OtlpConfigError> {
        let var = |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        Self::resolve(var, fallback, default_service)
    }

    /// The variables that give a child process (the bundled engine) this configuration under
    /// its own service name.
    pub fn child_env(&self, service_name: &str) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", self.url.to_string()),
            (
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                self.protocol.as_str().to_owned(),
            ),
            ("OTEL_SERVICE_NAME", service_name.to_owned()),
            (
                "OTEL_BSP_SCHEDULE_DELAY",
                self.batch_delay.as_millis().to_string(),
            ),
        ]
    }
}

fn export_url(base: &str, whole: bool, protocol: Protocol) -> Result<Uri, OtlpConfigError> {
    let bad = || OtlpConfigError::Endpoint(base.to_owned());
    let uri: Uri = base.trim().parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(bad());
    }
    let trimmed = base.trim().trim_end_matches('/');
    let url = match protocol {
        // gRPC addresses a service method; any path in the endpoint is not part of it.
        Protocol::Grpc => format!(
            "http://{}{GRPC_EXPORT_PATH}",
            uri.authority().map_or("", |a| a.as_str())
        ),
        Protocol::HttpProtobuf if whole => trimmed.to_owned(),
        Protocol::HttpProtobuf => format!("{trimmed}/v1/traces"),
    };
    url.parse().map_err(|_| bad())
}

fn parse_headers(s: &str) -> Result<Vec<(HeaderName, HeaderValue)>, OtlpConfigError> {
    s.split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| {
            let bad = || OtlpConfigError::Header(kv.split('=').next().unwrap_or("").to_owned());
            let (k, v) = kv.split_once('=').ok_or_else(bad)?;
            Ok((
                HeaderName::try_from(k.trim()).map_err(|_| bad())?,
                HeaderValue::try_from(v.trim()).map_err(|_| bad())?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(vars: &[(&str, &str)], fallback: &OtlpSettings) -> Option<OtlpConfig> {
        OtlpConfig::from_pairs(vars, fallback, "svc").unwrap()
    }

    #[test]
    fn nothing_configured_means_no_export() {
        assert_eq!(resolve(&[], &OtlpSettings::default()), None);
        assert_eq!(
            resolve(
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_TRACES_EXPORTER", "none")
                ],
                &OtlpSettings::default()
            ),
            None
        );
        assert_eq!(
            resolve(
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_SDK_DISABLED", "TRUE")
                ],
                &OtlpSettings::default()
            ),
            None
        );
    }

    #[test]
    fn http_protobuf_is_the_default_and_appends_the_signal_path() {
        let c = resolve(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")],
            &OtlpSettings::default(),
        )
        .unwrap();
        assert_eq!(c.protocol, Protocol::HttpProtobuf);
        assert_eq!(c.url, "http://collector:4318/v1/traces");
        assert_eq!(c.service_name, "svc");
        assert_eq!(c.batch_delay, Duration::from_secs(5));
        let c = resolve(
            &[(
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://collector:4318/custom",
            )],
            &OtlpSettings::default(),
        )
        .unwrap();
        assert_eq!(c.url, "http://collector:4318/custom");
    }

    #[test]
    fn grpc_addresses_the_export_method() {
        let c = resolve(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_SERVICE_NAME", "gw"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=abc, x-team=llm"),
                ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ],
            &OtlpSettings::default(),
        )
        .unwrap();
        assert_eq!(
            c.url,
            "http://127.0.0.1:4317/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        assert_eq!(c.service_name, "gw");
        assert_eq!(c.headers.len(), 2);
        assert_eq!(c.batch_delay, Duration::from_millis(50));
        let child = resolve(
            &c.child_env("engine")
                .iter()
                .map(|(k, v)| (*k, v.as_str()))
                .collect::<Vec<_>>(),
            &OtlpSettings::default(),
        )
        .unwrap();
        assert_eq!((child.url, child.protocol), (c.url, Protocol::Grpc));
        assert_eq!(child.service_name, "engine");
    }

    #[test]
    fn the_environment_wins_over_the_fallback() {
        let policy = OtlpSettings {
            endpoint: Some("http://policy:4318".into()),
            protocol: Some("grpc".into()),
            service_name: Some("from-policy".into()),
        };
        let c = resolve(&[], &policy).unwrap();
        assert_eq!(
            (c.protocol, c.service_name.as_str()),
            (Protocol::Grpc, "from-policy")
        );
        let c = resolve(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")], &policy).unwrap();
        assert_eq!(c.url, "http://policy:4318/v1/traces");
    }

    #[test]
    fn bad_settings_are_errors() {
        let r =
            |vars: &[(&str, &str)]| OtlpConfig::from_pairs(vars, &OtlpSettings::default(), "svc");
        let e = "OTEL_EXPORTER_OTLP_ENDPOINT";
        assert!(matches!(
            r(&[
                (e, "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            ]),
            Err(OtlpConfigError::Protocol(_))
        ));
        assert!(matches!(
            r(&[(e, "https://c:4318")]),
            Err(OtlpConfigError::Endpoint(_))
        ));
        assert!(matches!(
            r(&[(e, "collector:4318")]),
            Err(OtlpConfigError::Endpoint(_))
        ));
        assert!(matches!(
            r(&[(e, "http://c:4318"), ("OTEL_BSP_SCHEDULE_DELAY", "soon")]),
            Err(OtlpConfigError::Number { .. })
        ));
        assert!(matches!(
            r(&[
                (e, "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")
            ]),
            Err(OtlpConfigError::Header(_))
        ));
    }
}
