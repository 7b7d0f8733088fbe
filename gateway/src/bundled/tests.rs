use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::*;
use crate::telemetry::captured::Captured;

/// A fresh scratch directory for this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-bundled-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// A stand-in model file (the fake engines never read it).
fn fake_model(dir: &Path) -> PathBuf {
    let model = dir.join("model.gguf");
    std::fs::write(&model, b"GGUF").expect("write fake model");
    model
}

/// Quick restarts, so the backoff can be watched without waiting long.
fn quick_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(20),
        max: Duration::from_millis(80),
        reset_after: Duration::from_secs(60),
    }
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let b = Backoff::default();
    let secs: Vec<f64> = (1..=9).map(|n| b.delay(n).as_secs_f64()).collect();
    assert_eq!(secs, [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]);
    assert_eq!(b.delay(u32::MAX), Duration::from_secs(30));
    assert_eq!(b.delay(0), Duration::from_millis(500));
}

#[test]
fn engine_command_line() {
    let mut config = BundledConfig::new("/opt/sluice-engine", "/models/m.gguf");
    config.extra_args = vec!["--threads".into(), "2".into()];
    let addr: SocketAddr = "127.0.0.1:4321".parse().expect("addr");
    assert_eq!(
        config.args(addr).join(" "),
        "serve --ranks 3 --listen 127.0.0.1:4321 --model /models/m.gguf --exit-with-parent \
         --exit-when-a-rank-exits --threads 2"
    );
    // The policy's generation defaults, unless the command line gives the same flag.
    config.defaults = vec![("temperature", "0.7".into()), ("top-k", "20".into())];
    config.extra_args = vec!["--default-top-k".into(), "5".into()];
    assert_eq!(
        config.args(addr).join(" "),
        "serve --ranks 3 --listen 127.0.0.1:4321 --model /models/m.gguf --exit-with-parent \
         --exit-when-a-rank-exits --default-temperature 0.7 --default-top-k 5"
    );
    // The policy's prefill order, which the prediction plays.
    config.defaults.clear();
    config.extra_args.clear();
    config.prefill_order = Some("shortest");
    assert!(config
        .args(addr)
        .join(" ")
        .ends_with("--exit-when-a-rank-exits --prefill-order shortest"));
}

#[tokio::test]
async fn missing_engine_binary_is_a_clear_error() {
    let dir = scratch("missing-bin");
    let bin = dir.join("no-such-sluice-engine");
    let err = Supervisor::start(BundledConfig::new(&bin, fake_model(&dir)))
        .await
        .expect_err("a missing binary cannot start");
    assert!(
        matches!(err, SupervisorError::EngineNotFound { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&bin.display().to_string()),
        "{err}"
    );
}

#[tokio::test]
async fn missing_model_is_a_clear_error() {
    let dir = scratch("missing-model");
    let model = dir.join("no-such-model.gguf");
    let err = Supervisor::start(BundledConfig::new("/bin/false", &model))
        .await
        .expect_err("a missing model cannot start");
    assert!(
        err.to_string().contains(&model.display().to_string()),
        "{err}"
    );
    assert!(err.to_string().contains("fetch-model"), "{err}");
}

#[tokio::test]
async fn fast_failing_engine_restarts_with_growing_backoff() {
    let dir = scratch("false");
    let mut config = BundledConfig::new("/bin/false", fake_model(&dir));
    config.backoff = quick_backoff();
    let sup = Supervisor::start(config).await.expect("start");
    let mut state = sup.state();
    let mut seen = Vec::new();
    timeout(Duration::from_secs(20), async {
        while seen.last().is_none_or(|&(attempt, _)| attempt < 5) {
            state.changed().await.expect("the supervisor runs");
            if let EngineState::Restarting { attempt, backoff } = *state.borrow_and_update() {
                seen.push((attempt, backoff));
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("five restarts in time; saw {seen:?}"));
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "attempts grow: {seen:?}"
    );
    for &(attempt, backoff) in &seen {
        assert_eq!(backoff, quick_backoff().delay(attempt), "{seen:?}");
    }
    assert!(!sup.is_ready());
    let why = sup.last_error().expect("a reason");
    assert!(why.contains("exited"), "{why}");
    sup.shutdown().await;
}

#[tokio::test]
async fn unrunnable_engine_is_reported_and_retried() {
    let dir = scratch("not-executable");
    let bin = dir.join("sluice-engine");
    std::fs::write(&bin, b"#!/bin/sh\nexit 0\n").expect("write");
    let mut config = BundledConfig::new(&bin, fake_model(&dir));
    config.backoff = quick_backoff();
    let sup = Supervisor::start(config).await.expect("start");
    let mut state = sup.state();
    timeout(
        Duration::from_secs(10),
        state.wait_for(|s| matches!(s, EngineState::Restarting { attempt, .. } if *attempt >= 2)),
    )
    .await
    .expect("restarts in time")
    .expect("the supervisor runs");
    let why = sup.last_error().expect("a reason");
    assert!(why.contains(&bin.display().to_string()), "{why}");
    assert_eq!(sup.child_pid(), None);
    let mut state = sup.state();
    sup.shutdown().await;
    assert_eq!(*state.borrow_and_update(), EngineState::Stopped);
}

#[tokio::test]
async fn wait_ready_times_out_with_the_state() {
    let dir = scratch("never-ready");
    let mut config = BundledConfig::new("/bin/false", fake_model(&dir));
    config.backoff = quick_backoff();
    let sup = Supervisor::start(config).await.expect("start");
    let err = sup
        .wait_ready(Duration::from_millis(200))
        .await
        .expect_err("/bin/false is never ready");
    assert!(matches!(err, SupervisorError::NotReady { .. }), "{err:?}");
    sup.shutdown().await;
}

/// A fake engine: `script` as an executable shell script in `dir`.
fn fake_engine(dir: &Path, script: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("sluice-engine");
    std::fs::write(&bin, format!("#!/bin/sh\n{script}")).expect("write");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

/// The process group of the process whose `/proc/PID/stat` is `stat`.
fn pgid(stat: &str) -> String {
    let after_name = &stat[stat.rfind(')').expect("stat") + 2..];
    after_name.split(' ').nth(2).expect("pgrp").to_owned()
}

#[test]
fn engine_lines_keep_their_level_and_lose_their_timestamp() {
    use tracing::Level;
    let cases = [
        (
            " WARN sluice_engine::serve: careful",
            Level::WARN,
            "sluice_engine::serve: careful",
        ),
        (
            "2026-12-04T10:00:00.123456Z ERROR sluice_engine: stamped",
            Level::ERROR,
            "sluice_engine: stamped",
        ),
        (
            "2026-12-04T10:00:00Z  INFO x: two spaces",
            Level::INFO,
            "x: two spaces",
        ),
        ("DEBUG a: b", Level::DEBUG, "a: b"),
        (
            "KV token pool: 158928 tokens",
            Level::INFO,
            "KV token pool: 158928 tokens",
        ),
        (
            "thread 'main' panicked at src/x.rs:1:1:",
            Level::INFO,
            "thread 'main' panicked at src/x.rs:1:1:",
        ),
        ("WARNING not a level", Level::INFO, "WARNING not a level"),
        (
            "[rank 2]  WARN sluice_engine::pipeline: slow",
            Level::WARN,
            "[rank 2] sluice_engine::pipeline: slow",
        ),
        (
            "[rank 1] 2026-12-04T10:00:00.1Z ERROR e: stamped",
            Level::ERROR,
            "[rank 1] e: stamped",
        ),
        ("[rank 1] listening", Level::INFO, "[rank 1] listening"),
        ("[rank x] WARN y", Level::INFO, "[rank x] WARN y"),
        ("", Level::INFO, ""),
    ];
    for (line, level, text) in cases {
        let (got_level, got_text) = child::parse_line(line);
        assert_eq!((got_level, &*got_text), (level, text), "{line:?}");
    }
}

#[tokio::test]
async fn an_engine_s_lines_are_relayed_at_their_level_and_before_its_exit() {
    let log = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .without_time()
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // The test's runtime has one thread: every task logs through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let dir = scratch("relay");
    let bin = fake_engine(
        &dir,
        r#"echo "timestamps=$SLUICE_LOG_TIMESTAMPS group=$(cut -d')' -f2 /proc/$$/stat | cut -d' ' -f4)"
echo " WARN sluice_engine::serve: careful now" >&2
echo "2026-12-04T10:00:00.000000Z ERROR sluice_engine::x: stamped" >&2
i=0; while [ $i -lt 300 ]; do echo "line $i"; i=$((i+1)); done
exit 3
"#,
    );
    let mut config = BundledConfig::new(&bin, fake_model(&dir));
    config.backoff = Backoff {
        initial: Duration::from_secs(30),
        ..quick_backoff()
    };
    let sup = Supervisor::start(config).await.expect("start");
    let mut state = sup.state();
    timeout(
        Duration::from_secs(10),
        state.wait_for(|s| matches!(s, EngineState::Restarting { .. })),
    )
    .await
    .expect("the engine exits")
    .expect("the supervisor runs");
    let text = log.text();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
            .trim_start()
            .to_owned()
    };
    assert!(
        line("careful now").starts_with("WARN sluice::engine: sluice_engine::serve: careful now"),
        "{text}"
    );
    let stamped = line("stamped");
    assert!(
        stamped.starts_with("ERROR") && !stamped.contains("2026-12-04T10"),
        "{stamped}"
    );
    assert!(line("line 7").starts_with("INFO"), "{text}");
    // The engine was told to leave out its timestamps, and runs in a process group of its
    // own (a Ctrl-C at the terminal reaches the gateway, not the engine).
    assert!(line("timestamps=").contains("timestamps=0 "), "{text}");
    let theirs = line("group=");
    let theirs = theirs
        .split("group=")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .expect("group");
    let ours = pgid(&std::fs::read_to_string("/proc/self/stat").expect("stat"));
    assert_ne!(theirs, ours, "{text}");
    // Every line it wrote is logged before the supervisor's word on how it ended.
    let (last, exited) = (text.find("line 299"), text.find("exited"));
    assert!(
        last.is_some() && exited.is_some() && last < exited,
        "{text}"
    );
    sup.shutdown().await;
}

#[tokio::test]
async fn any_holder_can_shut_the_engine_down_and_it_is_not_restarted() {
    let dir = scratch("shutdown");
    let stopped = dir.join("stopped");
    let bin = fake_engine(
        &dir,
        &format!(
            "trap 'echo term > {}; exit 1' TERM\nwhile :; do sleep 0.05; done\n",
            stopped.display()
        ),
    );
    let mut config = BundledConfig::new(&bin, fake_model(&dir));
    config.backoff = quick_backoff();
    let sup = std::sync::Arc::new(Supervisor::start(config).await.expect("start"));
    let held_elsewhere = sup.clone();
    let pid = timeout(Duration::from_secs(10), async {
        loop {
            if let Some(pid) = sup.child_pid() {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the engine starts");
    // Let the script set its trap.
    tokio::time::sleep(Duration::from_millis(200)).await;
    timeout(Duration::from_secs(10), sup.shutdown())
        .await
        .expect("shutdown ends");
    assert_eq!(*held_elsewhere.state().borrow(), EngineState::Stopped);
    assert_eq!(
        std::fs::read_to_string(&stopped).expect("SIGTERM reached it"),
        "term\n"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} is gone"
    );
    // It exited 1 on SIGTERM: no restart follows a shutdown.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(held_elsewhere.child_pid(), None);
    assert_eq!(*held_elsewhere.state().borrow(), EngineState::Stopped);
    held_elsewhere.shutdown().await;
}

// ---- the real engine ----

/// The bundled model, found from the working directory or this crate's manifest.
fn real_model() -> PathBuf {
    let model = sluice_engine::model::default_model_path();
    let model = if model.is_file() {
        model
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(sluice_engine::model::DEFAULT_MODEL_PATH)
    };
    assert!(
        model.is_file(),
        "{} is missing: run `make fetch-model`",
        model.display()
    );
    model.canonicalize().expect("canonical model path")
}

/// The status code of `GET path`, on a fresh connection.
async fn http_status(addr: SocketAddr, path: &str) -> u16 {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.expect("send");
    let mut resp = Vec::new();
    conn.read_to_end(&mut resp).await.expect("read");
    let resp = String::from_utf8_lossy(&resp);
    resp.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {resp}"))
}

/// `(pid, parent pid, command name)` of each live process.
fn processes() -> Vec<(u32, u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (head, tail) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_owned();
        let mut fields = tail.split_whitespace();
        let state = fields.next()?;
        let ppid = fields.next()?.parse().ok()?;
        (state != "Z").then_some((pid, ppid, comm))
    })
    .collect()
}

/// The live `sluice-engine` processes whose parent is `parent`.
fn engine_children(parent: u32) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|(_, ppid, comm)| *ppid == parent && comm == ENGINE_BIN_NAME)
        .map(|(pid, ..)| pid)
        .collect()
}

/// Waits (at most `limit`) until none of `pids` is alive.
async fn wait_gone(pids: &[u32], limit: Duration) {
    let alive = || {
        let live: Vec<u32> = processes().into_iter().map(|(pid, ..)| pid).collect();
        pids.iter().filter(|p| live.contains(p)).count()
    };
    timeout(limit, async {
        while alive() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("processes {pids:?} still run after {limit:?}"));
}

fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-s", "KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s KILL {pid}: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_engine_is_restarted_after_rank0_is_killed_and_stopped_cleanly() {
    let bin = BundledConfig::locate_engine_bin().unwrap_or_else(|e| panic!("{e}"));
    let mut config = BundledConfig::new(bin, real_model());
    config.ranks = 3;
    let sup = Supervisor::start(config).await.expect("start");
    let addr = sup.addr();
    assert!(addr.ip().is_loopback());
    sup.wait_ready(Duration::from_secs(120))
        .await
        .expect("the engine gets ready");
    assert!(sup.is_ready());
    assert_eq!(http_status(addr, "/health").await, 200);

    let first = sup.child_pid().expect("rank 0 runs");
    assert!(engine_children(std::process::id()).contains(&first));
    let first_ranks = engine_children(first);
    assert_eq!(first_ranks.len(), 2, "ranks 1 and 2 run under rank 0");

    sigkill(first);
    let mut state = sup.state();
    timeout(
        Duration::from_secs(10),
        state.wait_for(|s| *s != EngineState::Ready),
    )
    .await
    .expect("the supervisor notices")
    .expect("the supervisor runs");
    timeout(
        Duration::from_secs(120),
        state.wait_for(|s| *s == EngineState::Ready),
    )
    .await
    .expect("the engine is restarted")
    .expect("the supervisor runs");
    let second = sup.child_pid().expect("rank 0 runs again");
    assert_ne!(first, second);
    assert_eq!(sup.addr(), addr, "the port survives restarts");
    assert_eq!(http_status(addr, "/health").await, 200);
    let why = sup.last_error().expect("the restart has a reason");
    assert!(
        why.contains(&first.to_string()) && why.contains("signal"),
        "{why}"
    );
    // The killed rank 0's ranks go by themselves (--exit-with-parent).
    wait_gone(&first_ranks, Duration::from_secs(10)).await;

    let second_ranks = engine_children(second);
    assert_eq!(second_ranks.len(), 2);
    sup.shutdown().await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "nothing listens on {addr} after shutdown"
    );
    wait_gone(&[second], Duration::from_secs(1)).await;
    wait_gone(&second_ranks, Duration::from_secs(10)).await;
    let ours = engine_children(std::process::id());
    assert!(
        !ours.contains(&first) && !ours.contains(&second),
        "{ours:?}"
    );
}
