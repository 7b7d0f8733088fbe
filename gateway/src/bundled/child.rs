//! One engine process: start it, forward its output, stop it.

use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use super::BundledConfig;

/// Starts the engine listening on `addr`, its stdout and stderr forwarded to `tracing`.
pub(crate) fn spawn(config: &BundledConfig, addr: SocketAddr) -> std::io::Result<Child> {
    let mut child = Command::new(&config.engine_bin)
        .args(config.args(addr))
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward(out, pid, "stdout"));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward(err, pid, "stderr"));
    }
    Ok(child)
}

/// Logs each line of `from` until it closes (bytes that are not UTF-8 are replaced, so the
/// pipe is always drained).
async fn forward(from: impl AsyncRead + Unpin, pid: u32, stream: &'static str) {
    let mut from = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                tracing::info!(target: "sluice::engine", pid, stream, "{text}");
            }
        }
    }
}

/// Stops `child`: SIGTERM, up to `grace` to exit, then SIGKILL. Returns how it ended.
pub(crate) async fn terminate(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    if let Some(pid) = child.id() {
        // The child is not reaped yet, so `pid` is still ours.
        if sigterm(pid).await {
            if let Ok(status) = tokio::time::timeout(grace, child.wait()).await {
                return status;
            }
            tracing::warn!(target: "sluice::engine", pid, "the engine ignored SIGTERM for {grace:?}; killing it");
        }
    }
    child.kill().await?;
    child.wait().await
}

/// Sends SIGTERM to `pid` with the `kill` utility (this crate does not link libc); false if
/// that failed.
async fn sigterm(pid: u32) -> bool {
    let sent = Command::new("kill")
        .args(["-s", "TERM", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match sent {
        Ok(status) if status.success() => true,
        Ok(status) => {
            tracing::warn!(target: "sluice::engine", pid, "kill -s TERM: {status}");
            false
        }
        Err(e) => {
            tracing::warn!(target: "sluice::engine", pid, "cannot run kill -s TERM: {e}");
            false
        }
    }
}
