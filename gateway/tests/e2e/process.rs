//! `sluice serve` as a process of its own, on plain HTTP, on a loopback port it picks itself.
//!
//! The port is the one the gateway reports on its stderr (`sluice: listening on …`) once it
//! has bound it, never one a test found free and let go: another test of the suite may take
//! such a port before the child binds it, and the child then exits while the test talks to a
//! stranger.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_gateway::policy::Policy;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, ChildStderr, Command};

/// What the gateway prints once it listens, before the address.
const LISTENING: &str = "sluice: listening on http://";

/// A running `sluice serve`; killed when dropped.
pub struct ServeProcess {
    child: Child,
    /// The address it bound.
    pub addr: SocketAddr,
    /// Its stderr, line by line, as it comes.
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl ServeProcess {
    /// Writes `p` to `dir/policy.toml` and serves it on `127.0.0.1:0`; waits (at most 30 s)
    /// for the gateway to say where it listens. Panics with its stderr if it never does.
    pub async fn start(p: &Policy, dir: &Path) -> Self {
        let file = dir.join("policy.toml");
        std::fs::write(&file, toml::to_string(p).expect("policy as TOML")).expect("write policy");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args([
                "serve",
                "--plain-http",
                "--listen",
                "127.0.0.1:0",
                "--policy",
            ])
            .arg(&file)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start sluice serve");
        let lines = collect_lines(child.stderr.take().expect("stderr"));
        let bound = || {
            lines
                .lock()
                .expect("lock")
                .iter()
                .find_map(|l| l.split_once(LISTENING))
                .and_then(|(_, addr)| addr.trim().parse::<SocketAddr>().ok())
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let addr = loop {
            if let Some(addr) = bound() {
                break addr;
            }
            let exited = child.try_wait().expect("try_wait");
            assert!(
                exited.is_none() && tokio::time::Instant::now() < deadline,
                "sluice serve never listened (exit: {exited:?}): {:#?}",
                lines.lock().expect("lock")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Self { child, addr, lines }
    }

    /// Kills it and waits for it to exit.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// Its process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("sluice serve still running")
    }
}

/// A child's stderr lines, as they come.
fn collect_lines(stderr: ChildStderr) -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            sink.lock().expect("lock").push(line);
        }
    });
    lines
}
