//! One engine process: start it, relay its output, stop it.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use tracing::Level;

use super::BundledConfig;

/// What the engine is told so that its log lines carry no timestamp of their own: the
/// gateway's log stamps each relayed line once.
pub const LOG_TIMESTAMPS_ENV: &str = "SLUICE_LOG_TIMESTAMPS";
/// The longest relayed line; the rest of a longer one is dropped (a runaway line must not grow
/// the gateway's memory without bound).
const MAX_LINE: usize = 64 * 1024;
/// How long the relays get to pass on what the engine wrote last, once it has exited.
const RELAY_GRACE: Duration = Duration::from_secs(1);

/// A running engine and the tasks relaying its output.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) child: Child,
    relays: JoinSet<()>,
}

impl Engine {
    /// Waits (at most [`RELAY_GRACE`]) until everything the engine wrote has been logged, so
    /// that its last lines come before the supervisor's word on how it ended. The pipes stay
    /// open while a rank the engine started still holds them: then the relays are left to
    /// finish by themselves.
    pub(crate) async fn flush_logs(&mut self) {
        let relays = &mut self.relays;
        let all = async { while relays.join_next().await.is_some() {} };
        if tokio::time::timeout(RELAY_GRACE, all).await.is_err() {
            self.relays.detach_all();
        }
    }
}

/// Starts the engine listening on `addr`, in a process group of its own (a Ctrl-C at the
/// terminal goes to the gateway, which drains and then stops the engine, instead of killing
/// the engine under requests still draining), its stdout and stderr relayed to `tracing`.
pub(crate) fn spawn(config: &BundledConfig, addr: SocketAddr) -> std::io::Result<Engine> {
    let mut child = Command::new(&config.engine_bin)
        .args(config.args(addr))
        .env(LOG_TIMESTAMPS_ENV, "0")
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().unwrap_or(0);
    let mut relays = JoinSet::new();
    if let Some(out) = child.stdout.take() {
        relays.spawn(relay(out, pid, "stdout"));
    }
    if let Some(err) = child.stderr.take() {
        relays.spawn(relay(err, pid, "stderr"));
    }
    Ok(Engine { child, relays })
}

/// Logs each line of `from` until it closes, at the level the engine gave it (bytes that are
/// not UTF-8 are replaced, so the pipe is always drained).
async fn relay(from: impl AsyncRead + Unpin, pid: u32, stream: &'static str) {
    let mut from = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line(&mut from, &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let (level, text) = parse_line(text.trim_end_matches(['\n', '\r']));
                match level {
                    Level::ERROR => {
                        tracing::error!(target: "sluice::engine", pid, stream, "{text}")
                    }
                    Level::WARN => tracing::warn!(target: "sluice::engine", pid, stream, "{text}"),
                    Level::INFO => tracing::info!(target: "sluice::engine", pid, stream, "{text}"),
                    Level::DEBUG => {
                        tracing::debug!(target: "sluice::engine", pid, stream, "{text}")
                    }
                    Level::TRACE => {
                        tracing::trace!(target: "sluice::engine", pid, stream, "{text}")
                    }
                }
            }
        }
    }
}

/// Reads one line into `line`, keeping at most [`MAX_LINE`] bytes of it; the number of bytes
/// read (0 at the end).
async fn read_line(
    from: &mut BufReader<impl AsyncRead + Unpin>,
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut read = 0;
    loop {
        let buf = from.fill_buf().await?;
        if buf.is_empty() {
            return Ok(read);
        }
        let (n, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = MAX_LINE.saturating_sub(line.len());
        line.extend_from_slice(&buf[..n.min(room)]);
        from.consume(n);
        read += n;
        if end {
            return Ok(read);
        }
    }
}

/// The level and message of one line the engine wrote: its `tracing` lines
/// (`[TIMESTAMP] LEVEL target: message`, those of ranks 1 and up behind `[rank N] `, which rank 0
/// keeps) keep their level and lose their timestamp (the gateway's log gives each line one);
/// anything else (a panic, `eprintln!`) is INFO as it is.
pub(crate) fn parse_line(line: &str) -> (Level, Cow<'_, str>) {
    if let Some((rank, rest)) = line
        .strip_prefix("[rank ")
        .and_then(|r| r.split_once("] "))
        .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    {
        let (level, message) = parse_tracing(rest);
        return (level, Cow::Owned(format!("[rank {rank}] {message}")));
    }
    let (level, message) = parse_tracing(line);
    (level, Cow::Borrowed(message))
}

/// [`parse_line`] without the rank.
fn parse_tracing(line: &str) -> (Level, &str) {
    let mut rest = line.trim_start();
    // An RFC 3339 timestamp, from an engine that was not told to leave it out.
    if let Some((first, after)) = rest.split_once(' ') {
        let b = first.as_bytes();
        if b.len() > 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T' {
            rest = after.trim_start();
        }
    }
    let Some((word, message)) = rest.split_once(' ') else {
        return (Level::INFO, line);
    };
    let level = match word {
        "ERROR" => Level::ERROR,
        "WARN" => Level::WARN,
        "INFO" => Level::INFO,
        "DEBUG" => Level::DEBUG,
        "TRACE" => Level::TRACE,
        _ => return (Level::INFO, line),
    };
    (level, message.trim_start())
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
