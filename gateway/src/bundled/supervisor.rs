//! The supervisor: one task that starts the engine, polls its health and restarts it.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{child, health, BundledConfig, EngineState, RankStatus, SupervisorError};

/// Health poll period while the engine starts.
const START_POLL: Duration = Duration::from_millis(500);
/// Health poll period once it has been ready.
const READY_POLL: Duration = Duration::from_secs(1);
/// How long one health check may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the engine gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Starts the bundled engine and keeps it running until [`Supervisor::shutdown`].
///
/// Dropping it without `shutdown` stops the engine in the background.
#[derive(Debug)]
pub struct Supervisor {
    addr: SocketAddr,
    state: watch::Receiver<EngineState>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

/// What the task reports besides the state.
#[derive(Debug, Default)]
struct Shared {
    /// The running engine's pid; 0 when none runs.
    pid: AtomicU32,
    /// Why the engine last stopped or failed to start.
    last_error: Mutex<Option<String>>,
    /// The ranks as the last health check saw them.
    ranks: Mutex<Vec<RankStatus>>,
}

impl Supervisor {
    /// Checks the engine executable and model exist, reserves a loopback port (kept across
    /// restarts) and starts supervising; returns at once, with the engine still starting.
    pub async fn start(config: BundledConfig) -> Result<Self, SupervisorError> {
        if !config.engine_bin.is_file() {
            return Err(SupervisorError::EngineNotFound {
                path: config.engine_bin,
            });
        }
        if !config.model.is_file() {
            return Err(SupervisorError::ModelNotFound { path: config.model });
        }
        let addr = {
            let probe = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .await
                .map_err(SupervisorError::Port)?;
            probe.local_addr().map_err(SupervisorError::Port)?
        };
        let (state_tx, state) = watch::channel(EngineState::Starting);
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared::default());
        let task = Task {
            config,
            addr,
            state: state_tx,
            stop: stop_rx,
            shared: shared.clone(),
        };
        tokio::spawn(task.run());
        Ok(Self {
            addr,
            state,
            shared,
            stop,
        })
    }

    /// Where the engine's OpenAI-compatible API listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The engine's state, and its changes.
    pub fn state(&self) -> watch::Receiver<EngineState> {
        self.state.clone()
    }

    /// Whether the last health check answered 200.
    pub fn is_ready(&self) -> bool {
        matches!(*self.state.borrow(), EngineState::Ready)
    }

    /// The running engine's process id (rank 0), if one runs.
    pub fn child_pid(&self) -> Option<u32> {
        match self.shared.pid.load(Ordering::Acquire) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// The engine's ranks as the last health check saw them (all down when it did not answer).
    pub fn ranks(&self) -> Vec<RankStatus> {
        self.shared
            .ranks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why the engine last exited, failed to start or was killed (for status pages and logs).
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until the engine is ready, at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), SupervisorError> {
        let mut state = self.state.clone();
        let waited = tokio::time::timeout(
            timeout,
            state.wait_for(|s| matches!(s, EngineState::Ready | EngineState::Stopped)),
        )
        .await
        .map(|seen| seen.map(|s| *s == EngineState::Ready));
        match waited {
            Ok(Ok(true)) => Ok(()),
            Ok(_) => Err(SupervisorError::Stopped),
            Err(_) => Err(SupervisorError::NotReady {
                waited: timeout,
                state: self.state.borrow().clone(),
            }),
        }
    }

    /// Stops the engine (SIGTERM, up to 5 s, then SIGKILL) and the supervising task, and
    /// returns once it is stopped; no restart follows. Any holder of the supervisor may call
    /// it (the status page and the forwarder share it), and more than once.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let mut state = self.state.clone();
        if state
            .wait_for(|s| *s == EngineState::Stopped)
            .await
            .is_err()
        {
            tracing::error!(target: "sluice::engine", "the engine supervisor ended before stopping the engine");
        }
    }
}

/// Why one engine process ended.
enum Outcome {
    /// Shutdown was asked for; the engine is stopped.
    Stopped,
    /// It exited or was killed (why); restart it.
    Failed(String),
}

/// What woke the task while an engine runs.
enum Event {
    Exited(std::io::Result<ExitStatus>),
    Stop,
    Health(Result<(), String>),
}

/// The supervising task's state.
struct Task {
    config: BundledConfig,
    addr: SocketAddr,
    state: watch::Sender<EngineState>,
    stop: watch::Receiver<bool>,
    shared: Arc<Shared>,
}

impl Task {
    async fn run(mut self) {
        let mut attempt = 0u32;
        loop {
            self.set(EngineState::Starting);
            let outcome = match child::spawn(&self.config, self.addr) {
                Ok(engine) => self.watch_child(engine, &mut attempt).await,
                Err(e) => Outcome::Failed(format!(
                    "cannot start {}: {e}",
                    self.config.engine_bin.display()
                )),
            };
            self.shared.pid.store(0, Ordering::Release);
            let Outcome::Failed(why) = outcome else { break };
            if *self.stop.borrow() {
                // The engine ended as shutdown was asked for: it is not started again.
                tracing::info!(target: "sluice::engine", "{why}; shutting down");
                break;
            }
            attempt = attempt.saturating_add(1);
            let backoff = self.config.backoff.delay(attempt);
            tracing::warn!(target: "sluice::engine", attempt, ?backoff, "{why}; restarting");
            *self
                .shared
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(why);
            self.set(EngineState::Restarting { attempt, backoff });
            let stop = &mut self.stop;
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = stop.wait_for(|stop| *stop) => break,
            }
        }
        self.set(EngineState::Stopped);
    }

    /// Polls one engine process until it ends, is killed or shutdown is asked for.
    async fn watch_child(&mut self, mut engine: child::Engine, attempt: &mut u32) -> Outcome {
        let child = &mut engine.child;
        let pid = child.id().unwrap_or(0);
        self.shared.pid.store(pid, Ordering::Release);
        tracing::info!(target: "sluice::engine", pid, addr = %self.addr, "engine started");
        let started = Instant::now();
        let addr = self.addr;
        let limit = self.config.start_timeout;
        let mut was_ready = false;
        let mut ready_since: Option<Instant> = None;
        let mut failing_since: Option<Instant> = None;
        loop {
            let period = if was_ready { READY_POLL } else { START_POLL };
            let stop = &mut self.stop;
            let shared = &self.shared;
            let event = tokio::select! {
                status = child.wait() => Event::Exited(status),
                _ = stop.wait_for(|stop| *stop) => Event::Stop,
                health = async {
                    tokio::time::sleep(period).await;
                    health::probe(addr, PROBE_TIMEOUT, &shared.ranks).await
                } => Event::Health(health),
            };
            match event {
                Event::Exited(Ok(status)) => {
                    engine.flush_logs().await;
                    return Outcome::Failed(format!("the engine (pid {pid}) exited: {status}"));
                }
                Event::Exited(Err(e)) => {
                    engine.flush_logs().await;
                    return Outcome::Failed(format!("waiting for the engine (pid {pid}): {e}"));
                }
                Event::Stop => {
                    let ended = child::terminate(child, STOP_GRACE).await;
                    engine.flush_logs().await;
                    match ended {
                        Ok(status) => {
                            tracing::info!(target: "sluice::engine", pid, "engine stopped: {status}");
                        }
                        Err(e) => {
                            tracing::error!(target: "sluice::engine", pid, "stopping the engine: {e}");
                        }
                    }
                    return Outcome::Stopped;
                }
                Event::Health(Ok(())) => {
                    if !was_ready {
                        tracing::info!(target: "sluice::engine", pid, "engine ready after {:?}", started.elapsed());
                    } else if failing_since.is_some() {
                        tracing::info!(target: "sluice::engine", pid, "engine healthy again");
                    }
                    was_ready = true;
                    failing_since = None;
                    let since = *ready_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.config.backoff.reset_after {
                        *attempt = 0;
                    }
                    self.set(EngineState::Ready);
                }
                Event::Health(Err(why)) => {
                    ready_since = None;
                    let (since, what) = if was_ready {
                        if failing_since.is_none() {
                            tracing::warn!(target: "sluice::engine", pid, "engine unhealthy: {why}");
                        }
                        self.set(EngineState::Unhealthy(why.clone()));
                        (
                            *failing_since.get_or_insert_with(Instant::now),
                            "stayed unhealthy",
                        )
                    } else {
                        (started, "was not ready")
                    };
                    if since.elapsed() >= limit {
                        let why = format!("the engine (pid {pid}) {what} for {limit:?} ({why})");
                        let ended = child::terminate(child, STOP_GRACE).await;
                        engine.flush_logs().await;
                        return Outcome::Failed(match ended {
                            Ok(status) => format!("{why}; stopped it: {status}"),
                            Err(e) => format!("{why}; stopping it: {e}"),
                        });
                    }
                }
            }
        }
    }

    /// Publishes `state` if it differs from the current one.
    fn set(&self, state: EngineState) {
        self.state.send_if_modified(|current| {
            if *current == state {
                false
            } else {
                *current = state;
                true
            }
        });
    }
}
