//! Policy tests: one per validation rule, durations, error positions. Shipped files and hot
//! reload have their own modules.

use std::time::Duration;

use super::load::parse;
use super::schema::Policy;

/// The error `text` is refused with.
fn err(text: &str) -> String {
    match parse(text) {
        Ok(p) => panic!("accepted: {text}\n{p:?}"),
        Err(e) => e.message,
    }
}

/// `text` is refused, and the message has every one of `needles`.
macro_rules! refused {
    ($name:ident, $text:expr, $($needle:expr),+ $(,)?) => {
        #[test]
        fn $name() {
            let e = err($text);
            $(assert!(e.contains($needle), "{e:?} lacks {:?}", $needle);)+
        }
    };
}

mod files;
mod guard;
mod reload;
mod tenants;

const ALICE: &str = "26610361abc9db469217e20ea87f004719c498a704d49688c651b26cf7af8963";
const BOB: &str = "6a16ef7bc99244314d6a86571978e4d4f9eb7e0f3081d69293ca70489f7f1a7e";

fn tenant(name: &str, key: &str, extra: &str) -> String {
    format!("[[tenants]]\nname = \"{name}\"\napi_key_sha256 = \"{key}\"\n{extra}\n")
}

#[test]
fn empty_file_is_the_defaults() {
    let p = parse("").expect("empty file");
    assert_eq!(p, Policy::default());
    assert_eq!(p.admission.active_max, 4);
    assert_eq!(p.admission.queue_depth, 16);
    assert_eq!(p.admission.queue_wait_max, Duration::from_secs(60));
    assert_eq!(p.admission.heavy_input_tokens, 4096);
    assert_eq!(p.admission.heavy_active_max, 1);
    assert_eq!(p.limits.input_tokens_max, 8192);
    assert_eq!(p.limits.context_window, 12288);
    assert_eq!(p.limits.max_tokens_default, 512);
    assert_eq!(p.limits.max_tokens_max, 4096);
    assert_eq!(p.server.listen.to_string(), "127.0.0.1:8443");
    assert!(p.tenants.is_empty());
}

// --- durations ---

fn queue_wait(value: &str) -> Result<Duration, String> {
    parse(&format!("[admission]\nqueue_wait_max = \"{value}\""))
        .map(|p| p.admission.queue_wait_max)
        .map_err(|e| e.message)
}

#[test]
fn durations_parse_seconds_minutes_and_milliseconds() {
    assert_eq!(queue_wait("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(queue_wait("1m"), Ok(Duration::from_secs(60)));
    assert_eq!(queue_wait("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(queue_wait("1m 30s"), Ok(Duration::from_secs(90)));
}

refused!(
    duration_in_parsecs,
    "[admission]\nqueue_wait_max = \"30 parsecs\"",
    "line 2, column 18",
    "invalid duration \"30 parsecs\"",
    "\"30s\""
);
refused!(
    duration_as_bare_number,
    "[admission]\nqueue_wait_max = 30",
    "line 2, column 18"
);

// --- syntax, types, unknown keys: line and column ---

refused!(
    syntax_error_has_line_and_column,
    "[admission]\nactive_max 4",
    "line 2, column 12"
);
refused!(
    bad_type_has_line_and_column,
    "[admission]\nactive_max = \"four\"",
    "line 2, column 14"
);
refused!(
    negative_count_is_refused,
    "\n[limits]\ncontext_window = -1",
    "line 3, column 18"
);
refused!(
    listen_not_an_address,
    "[server]\nlisten = \"localhost\"",
    "line 2, column 10"
);
refused!(
    probe_listen_not_an_address_names_its_key,
    "[server]\nlisten = \"127.0.0.1:8443\"\nprobe_listen = \"localhost:99\"",
    "line 3, column 16: server.probe_listen: invalid socket address syntax"
);
refused!(
    bad_type_in_a_dotted_key_names_it,
    "admission.active_max = \"four\"",
    "line 1, column 24: admission.active_max: invalid type"
);
refused!(
    bad_type_in_an_inline_table_names_it,
    "server = { listen = 4 }",
    "line 1, column 21: server.listen: invalid type"
);
refused!(
    bad_item_in_an_array_names_its_index,
    "[upstream]\nurls = [\"http://a:1\", 7]",
    "line 2, column 23: upstream.urls[1]: invalid type"
);
refused!(
    unknown_upstream_kind,
    "[upstream]\nkind = \"vllm\"",
    "line 2, column 8",
    "vllm"
);
refused!(
    unknown_tenant_class,
    &tenant("a", ALICE, "class = \"vip\""),
    "line 4",
    "vip"
);
refused!(
    bad_type_in_the_second_tenant_names_it,
    &format!(
        "{}{}",
        tenant("a", ALICE, ""),
        tenant("b", BOB, "class = 3")
    ),
    "line 8, column 9: tenants[1].class: wanted string or table"
);
refused!(
    tenant_without_key,
    "[[tenants]]\nname = \"a\"",
    "api_key_sha256"
);
refused!(
    unknown_key_at_top_level,
    "actve_max = 4",
    "line 1, column 1",
    "actve_max"
);
refused!(
    unknown_table,
    "[limit]\ncontext_window = 4",
    "line 1",
    "limit"
);

#[test]
fn unknown_key_inside_each_table_is_refused() {
    let tables = [
        "[server]",
        "[limits]",
        "[admission]",
        "[upstream]",
        "[alerts]",
        "[traces]",
        "[admin]",
        &format!("[[tenants]]\nname = \"a\"\napi_key_sha256 = \"{ALICE}\""),
    ];
    for table in tables {
        let text = format!("{table}\nmystery_key = 1");
        let e = err(&text);
        let line = format!("line {}, column 1", text.lines().count());
        assert!(
            e.contains("mystery_key") && e.contains(&line),
            "{table}: {e:?}"
        );
    }
}

// --- [server] ---

refused!(
    server_body_limit_below_1kib,
    "[server]\nbody_limit_bytes = 1000",
    "line 2, column 20: server.body_limit_bytes",
    "1 KiB"
);
refused!(
    server_tls_cert_without_key,
    "[server]\ntls_cert = \"c.pem\"",
    "server.tls_key"
);
refused!(
    server_tls_key_without_cert,
    "[server]\ntls_key = \"k.pem\"",
    "server.tls_cert"
);
refused!(
    server_max_connections_zero,
    "[server]\nmax_connections = 0",
    "server.max_connections"
);
refused!(
    server_max_connections_past_a_million,
    "[server]\nmax_connections = 4611686018427387904",
    "server.max_connections"
);
refused!(
    server_probe_listen_on_the_clients_port,
    "[server]\nlisten = \"127.0.0.1:8443\"\nprobe_listen = \"0.0.0.0:8443\"",
    "server.probe_listen"
);
refused!(
    server_probe_listen_not_an_address,
    "[server]\nprobe_listen = \"localhost\"",
    "line 2",
    "invalid socket address"
);
refused!(
    server_idle_timeout_zero,
    "[server]\nidle_timeout = \"0s\"",
    "server.idle_timeout"
);
refused!(
    server_drain_timeout_over_1h,
    "[server]\ndrain_timeout = \"2h\"",
    "server.drain_timeout"
);

// --- [limits] ---

refused!(
    limits_input_tokens_max_zero,
    "[limits]\ninput_tokens_max = 0",
    "limits.input_tokens_max"
);
refused!(
    limits_context_window_zero,
    "[limits]\ncontext_window = 0",
    "limits.context_window"
);
refused!(
    limits_max_tokens_default_zero,
    "[limits]\nmax_tokens_default = 0",
    "limits.max_tokens_default"
);
refused!(
    limits_max_tokens_max_zero,
    "[limits]\nmax_tokens_max = 0",
    "limits.max_tokens_max"
);
refused!(limits_input_over_context_window, "[limits]\ninput_tokens_max = 16384",
    "line 2, column 20: limits.input_tokens_max: 16384 is larger than limits.context_window (12288)");
refused!(
    limits_default_over_max,
    "[limits]\nmax_tokens_default = 5000",
    "limits.max_tokens_default: 5000 is larger than limits.max_tokens_max (4096)"
);
refused!(
    limits_max_tokens_not_below_context_window,
    "[limits]\nmax_tokens_max = 12288\ninput_tokens_max = 4096",
    "limits.max_tokens_max: 12288 must be smaller than limits.context_window"
);

// --- [admission] ---

refused!(
    admission_active_max_zero,
    "[admission]\nactive_max = 0\nheavy_active_max = 0",
    "admission.active_max: must be at least 1",
    "admission.heavy_active_max: must be at least 1"
);
refused!(
    admission_queue_wait_zero,
    "[admission]\nqueue_wait_max = \"0s\"",
    "admission.queue_wait_max: must be longer than 0s"
);
refused!(
    admission_queue_wait_over_1h,
    "[admission]\nqueue_wait_max = \"61m\"",
    "admission.queue_wait_max",
    "1h"
);
refused!(
    admission_heavy_active_over_active,
    "[admission]\nactive_max = 2\nheavy_active_max = 3",
    "line 3, column 20: admission.heavy_active_max: 3 is larger than admission.active_max (2)"
);
refused!(
    admission_heavy_input_tokens_zero,
    "[admission]\nheavy_input_tokens = 0",
    "admission.heavy_input_tokens: must be at least 1"
);
refused!(
    admission_heavy_input_over_input_max,
    "[limits]\ninput_tokens_max = 2048",
    "admission.heavy_input_tokens: 4096 is larger than limits.input_tokens_max (2048)"
);

#[test]
fn admission_queue_depth_zero_means_no_queue() {
    let p = parse("[admission]\nqueue_depth = 0").expect("queue_depth 0");
    assert_eq!(p.admission.queue_depth, 0);
}

refused!(
    admission_queue_depth_over_max,
    "[admission]\nqueue_depth = 1025",
    "line 2, column 15: admission.queue_depth: 1025 is larger than the largest allowed, 1024"
);

#[test]
fn admission_queue_depth_up_to_the_max_is_accepted() {
    let p = parse("[admission]\nqueue_depth = 1024").expect("queue_depth 1024");
    assert_eq!(p.admission.queue_depth, super::validate::QUEUE_DEPTH_MAX);
}

// --- [upstream] ---

refused!(
    upstream_openai_without_urls,
    "[upstream]\nkind = \"openai\"",
    "upstream.urls: kind \"openai\" needs at least one URL"
);
refused!(
    upstream_url_not_http,
    "[upstream]\nkind = \"openai\"\nurls = [\"ftp://h:21\"]",
    "line 3, column 9: upstream.urls[0]",
    "http://"
);
refused!(
    upstream_url_unparseable,
    "[upstream]\nkind = \"openai\"\nurls = [\"http://a b\"]",
    "upstream.urls[0]",
    "not a URL"
);
refused!(
    upstream_url_with_path,
    "[upstream]\nkind = \"openai\"\nurls = [\"http://h:8000/v1\"]",
    "upstream.urls[0]",
    "path"
);
refused!(
    upstream_url_twice,
    "[upstream]\nkind = \"openai\"\nurls = [\"http://h:1\", \"http://h:1\"]",
    "line 3, column 23: upstream.urls[1]",
    "repeats upstream.urls[0]"
);
refused!(
    upstream_bundled_with_urls,
    "[upstream]\nurls = [\"http://h:1\"]",
    "upstream.urls: kind \"bundled\" takes no URLs"
);
refused!(
    upstream_ranks_zero,
    "[upstream]\nranks = 0",
    "upstream.ranks: 0 is outside 1..=30"
);
refused!(
    upstream_ranks_31,
    "[upstream]\nranks = 31",
    "upstream.ranks: 31 is outside 1..=30"
);
refused!(
    upstream_start_timeout_zero,
    "[upstream]\nstart_timeout = \"0s\"",
    "upstream.start_timeout"
);
refused!(
    upstream_model_empty,
    "[upstream]\nmodel = \" \"",
    "upstream.model"
);

#[test]
fn upstream_sampling_defaults_become_engine_flags() {
    let p = parse("[upstream.sampling]\ntemperature = 0.7\ntop_k = 20").expect("sampling");
    assert_eq!(
        p.upstream.sampling.flags(),
        [
            ("temperature", "0.7".to_owned()),
            ("top-k", "20".to_owned())
        ]
    );
    assert!(parse("")
        .expect("defaults")
        .upstream
        .sampling
        .flags()
        .is_empty());
}
refused!(
    upstream_sampling_top_p_zero,
    "[upstream.sampling]\ntop_p = 0",
    "upstream.sampling.top_p: 0 is outside (0, 1]"
);
refused!(
    upstream_sampling_temperature_3,
    "[upstream.sampling]\ntemperature = 3.0",
    "upstream.sampling.temperature: 3 is outside [0, 2]"
);
refused!(
    upstream_sampling_unknown_key,
    "[upstream.sampling]\ntop_a = 1",
    "top_a"
);
refused!(
    upstream_sampling_for_openai,
    "[upstream]\nkind = \"openai\"\nurls = [\"http://h:1\"]\n[upstream.sampling]\ntemperature = 0.5",
    "upstream.sampling: only the bundled engine"
);

#[test]
fn upstream_openai_with_urls_is_accepted() {
    let text = "[upstream]\nkind = \"openai\"\nurls = [\"http://10.0.0.1:8000\", \"https://h/\"]";
    let p = parse(text).expect("openai upstream");
    assert_eq!(p.upstream.urls.len(), 2);
}

// --- [traces] ---

refused!(
    traces_endpoint_https,
    "[traces]\nendpoint = \"https://collector:4318\"",
    "traces.endpoint",
    "not an http:// URL"
);
refused!(
    traces_protocol_json,
    "[traces]\nendpoint = \"http://c:4318\"\nprotocol = \"http/json\"",
    "traces.protocol",
    "use \"grpc\" or \"http/protobuf\""
);

#[test]
fn traces_grpc_endpoint_is_accepted() {
    let p = parse("[traces]\nendpoint = \"http://127.0.0.1:4317\"\nprotocol = \"grpc\"")
        .expect("grpc traces");
    assert_eq!(p.traces.protocol.as_deref(), Some("grpc"));
}

// --- the error as a whole ---

#[test]
fn every_broken_rule_is_reported_at_once() {
    let e = err("[limits]\ninput_tokens_max = 0\n[admission]\nactive_max = 0");
    assert!(
        e.contains("line 2, column 20: limits.input_tokens_max"),
        "{e}"
    );
    assert!(e.contains("line 4, column 14: admission.active_max"), "{e}");
}

#[test]
fn from_file_prefixes_the_path() {
    let dir = files::temp_dir("prefix");
    let path = dir.join("p.toml");
    std::fs::write(&path, "[admission]\nactive_max = 0\n").expect("write");
    let e = super::check_file(&path).expect_err("refused");
    let want = format!(
        "{}: line 2, column 14: admission.active_max",
        path.display()
    );
    assert!(e.message.starts_with(&want), "{e}");
    let missing = super::check_file(&dir.join("none.toml")).expect_err("missing");
    assert!(missing.message.contains("none.toml"), "{missing}");
}

/// A refused policy's message goes to the log, `sluice policy check` and the reload alert (to
/// Alertmanager and webhooks): it never quotes a password or a webhook's secret path.
#[test]
fn refusals_never_quote_a_secret() {
    for text in [
        "[shared]\nredis_url = \"rediss://:s3cret@10.0.0.5:6379\"",
        "[shared]\nredis_url = \"redis://:s3cret@host:notaport\"",
        "[upstream]\nkind = \"openai\"\nurls = [\"http://u:s3cret@h:1/v1\"]",
        "[upstream]\nkind = \"openai\"\nurls = [\"http://u:s3cret@h:1\", \"http://u:s3cret@h:1\"]",
        "[alerts]\nwebhooks = [\"ftp://hooks.slack.com/services/T0/B0/s3cret\"]",
        "[alerts]\nalertmanager_urls = [\"http://u:s3cret@am:9093/api/v2/alerts\"]",
        // A list written as one string: the parser quotes the value it refused.
        "[alerts]\nwebhooks = \"https://hooks.slack.com/services/T0/B0/s3cret\"",
        "[alerts]\nalertmanager_urls = \"http://u:s3cret@am:9093\"",
        "[upstream]\nkind = \"openai\"\nurls = \"http://u:s3cret@h:1/v1\"",
    ] {
        let e = err(text);
        assert!(!e.contains("s3cret"), "{text}\n{e}");
    }
}

refused!(
    expected_replicas_has_a_bound,
    "[shared]\nredis_url = \"redis://127.0.0.1:6379\"\nexpected_replicas = 4294967296",
    "shared.expected_replicas",
    "1024"
);
