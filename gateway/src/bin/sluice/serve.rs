//! `sluice serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use sluice_engine::trace::otlp::{self, OtlpConfig};
use sluice_gateway::app::{stack, App};
use sluice_gateway::bundled::{BundledConfig, Supervisor};
use sluice_gateway::forward::{http_client, BundledUpstream, ReplicaPool, Upstream};
use sluice_gateway::middleware::count::PromptCounter;
use sluice_gateway::policy::reload::spawn_reloader;
use sluice_gateway::policy::{Guard, LoadedPolicy, PolicyError, PolicyStore, UpstreamKind};
use sluice_gateway::routes::Router;
use sluice_gateway::server::Surface;
use sluice_gateway::{server, tls};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Options of `sluice serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The policy file (default: policies/default.toml when it exists, else built-in defaults).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// The GGUF model: the bundled engine runs it, and its tokenizer counts prompts.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Where to listen (overrides the policy's `server.listen`).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serve plain HTTP instead of HTTPS (never on a network others can reach).
    #[arg(long)]
    plain_http: bool,
    /// Where the development certificates are generated when the policy names none.
    #[arg(long, default_value = "certs")]
    certs_dir: PathBuf,
    /// Extra arguments for the bundled engine (e.g. `--engine-arg=--threads --engine-arg=1`).
    #[arg(long = "engine-arg", allow_hyphen_values = true)]
    engine_args: Vec<String>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let loaded = load_policy(args.policy.as_deref())?;
    tracing::info!(
        sha256 = %loaded.sha256,
        file = %loaded.path.as_deref().map_or("(built-in defaults)".into(), |p| p.display().to_string()),
        "policy loaded"
    );
    let policy = loaded.policy.clone();
    let listen = args.listen.unwrap_or(policy.server.listen);
    // Open off loopback only on purpose; every reload is held to the same rules.
    let guard = Guard::new(listen);
    guard.check_start(&policy)?;
    if policy.tenants.is_empty() {
        tracing::warn!(
            explicit = policy.server.open,
            "no [[tenants]] in the policy: the gateway is OPEN (no API key needed)"
        );
    }
    let store = PolicyStore::new(loaded);
    let model = args
        .model
        .clone()
        .unwrap_or_else(sluice_engine::model::default_model_path);
    let counting = policy
        .upstream
        .tokenizer
        .clone()
        .unwrap_or_else(|| model.clone());
    let counter = PromptCounter::open(&counting)
        .with_context(|| format!("reading the tokenizer from {}", counting.display()))?;

    // Traces: the standard OTEL_* variables, else the policy's [traces]; none: no export.
    let otlp = OtlpConfig::from_env(&policy.traces.settings(), "sluice-gateway")
        .context("the OTLP trace settings")?;
    let exporter = otlp.clone().map(otlp::install);

    let mut supervisor = None;
    let upstream: Arc<dyn Upstream> = match policy.upstream.kind {
        UpstreamKind::Bundled => {
            if args
                .engine_args
                .iter()
                .any(|a| a.starts_with("--prefill-order"))
            {
                // The gateway's prediction plays the policy's order: one source for both.
                bail!("the engine's prefill order is the policy's upstream.prefill_order, not an engine argument");
            }
            let bin = BundledConfig::locate_engine_bin()?;
            let mut cfg = BundledConfig::for_upstream(bin, model.clone(), &policy.upstream);
            cfg.extra_args = args.engine_args.clone();
            if let Some(o) = &otlp {
                // The engine's spans join the gateway's traces, under their own service name.
                cfg.env = o
                    .child_env("sluice-engine")
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect();
            }
            let sup = Arc::new(Supervisor::start(cfg).await?);
            tracing::info!(addr = %sup.addr(), ranks = policy.upstream.ranks, "bundled engine starting");
            supervisor = Some(sup.clone());
            Arc::new(BundledUpstream::new(sup)?)
        }
        UpstreamKind::Openai => {
            if policy.upstream.urls.is_empty() {
                bail!("upstream.kind = \"openai\" needs at least one URL in upstream.urls");
            }
            let pool = ReplicaPool::new(&policy.upstream.urls, store.clone())?;
            pool.spawn_probes(http_client(policy.upstream.ca.as_deref())?);
            tracing::info!(replicas = ?policy.upstream.urls, "fronting OpenAI-compatible replicas");
            Arc::new(pool)
        }
    };
    let model_name = policy
        .upstream
        .model
        .clone()
        .unwrap_or_else(|| file_name(&model));
    let policy_file = store.current().path.clone();
    let app = App::new(store, upstream, model_name);
    // The status page's windowed percentiles sample from start-up.
    sluice_gateway::ui::start(&app);
    // The gateway's own alerts (load shedding, refused policy edits), posted per [alerts].
    let instance = sluice_gateway::alerts::instance(listen);
    let alerter =
        sluice_gateway::alerts::Alerter::spawn(app.metrics.clone(), app.policy.clone(), instance)?;
    let _ = app.alerter.set(alerter.clone());
    // Edits of the policy file (and SIGHUP) reload it; the handle stops watching when dropped.
    let _reloader = match policy_file {
        Some(path) => {
            let metrics = app.metrics.clone();
            let alerter = alerter.clone();
            let on_result = move |r: Result<&LoadedPolicy, &PolicyError>| {
                metrics.policy_reload(r.is_ok());
                match r {
                    Ok(_) => alerter.policy_reload_ok(),
                    Err(e) => alerter.policy_reload_failed(&e.message),
                }
            };
            Some(spawn_reloader(path, app.policy.clone(), guard, on_result)?)
        }
        None => None,
    };
    let router = Router {
        stack: stack(&app, Arc::new(counter)),
        app,
    };

    let acceptor = if args.plain_http {
        if listen.ip().is_loopback() {
            tracing::warn!("serving plain HTTP (--plain-http)");
        } else {
            // Behind a TLS-terminating proxy this is the deployment; anywhere else the API
            // keys and prompts cross the network in cleartext.
            tracing::warn!(
                %listen,
                "serving plain HTTP (--plain-http) off loopback: API keys and prompts travel \
                 unencrypted unless a TLS-terminating proxy is the only way in"
            );
        }
        None
    } else {
        let (cert, key) = match (&policy.server.tls_cert, &policy.server.tls_key) {
            (Some(c), Some(k)) => (c.clone(), k.clone()),
            _ => {
                let (certs, created) = tls::ensure_dev_certs(&args.certs_dir)?;
                let verb = if created { "generated" } else { "using" };
                eprintln!(
                    "sluice: {verb} a development certificate; trust its CA: {}",
                    certs.ca_cert.display()
                );
                (certs.cert, certs.key)
            }
        };
        Some(TlsAcceptor::from(tls::server_config(&cert, &key)?))
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    eprintln!("sluice: listening on {scheme}://{}", listener.local_addr()?);
    server::warn_if_fds_short(policy.server.max_connections);
    // One signal stops every listener.
    let stop = server::Stop::default();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.stop();
        }
    });
    let drain = policy.server.drain_timeout;
    let probes = match policy.server.probe_listen {
        Some(addr) => {
            let probes = TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening for probes on {addr} (server.probe_listen)"))?;
            eprintln!(
                "sluice: probes and metrics on {scheme}://{}",
                probes.local_addr()?
            );
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, "/healthz, /readyz and /metrics answer off loopback without a key (server.probe_listen)");
            }
            let serve = server::serve(
                probes,
                acceptor.clone(),
                router.clone(),
                Surface::Probes,
                stop.stopped(),
                drain,
            );
            Some(tokio::spawn(serve))
        }
        None => None,
    };
    server::serve(
        listener,
        acceptor,
        router,
        Surface::Clients,
        stop.stopped(),
        drain,
    )
    .await?;
    if let Some(probes) = probes {
        probes.await.context("the probe listener")??;
    }
    tracing::info!("drained; stopping");
    if let Some(e) = exporter {
        e.flush().await;
    }
    if let Some(sup) = supervisor {
        sup.shutdown().await;
    }
    Ok(())
}

fn load_policy(path: Option<&Path>) -> anyhow::Result<LoadedPolicy> {
    let default = Path::new("policies/default.toml");
    let path = match path {
        Some(p) => p,
        None if default.exists() => default,
        None => return Ok(LoadedPolicy::defaults()),
    };
    Ok(LoadedPolicy::from_file(path)?)
}

/// The model's name as the engine reports it: the file name without its extension.
fn file_name(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("shutting down: draining requests in flight");
}
