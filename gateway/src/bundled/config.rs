//! What the supervisor starts, and how long it waits between restarts.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::SupervisorError;
use crate::policy::Upstream;

/// Environment variable naming the engine executable; it overrides the search next to the
/// gateway's own executable.
pub const ENGINE_BIN_ENV: &str = "SLUICE_ENGINE_BIN";

/// The engine executable's file name.
pub const ENGINE_BIN_NAME: &str = "sluice-engine";

/// How the bundled engine is started.
#[derive(Debug, Clone)]
pub struct BundledConfig {
    /// The `sluice-engine` executable (see [`BundledConfig::locate_engine_bin`]).
    pub engine_bin: PathBuf,
    /// The GGUF model file (`--model`).
    pub model: PathBuf,
    /// Pipeline ranks (`--ranks`).
    pub ranks: usize,
    /// How long a fresh engine may take to answer `GET /health` with 200 before it is killed
    /// and restarted; also how long a ready engine may then stay unhealthy.
    pub start_timeout: Duration,
    /// Generation defaults for requests that leave a field out: `--default-<flag> <value>`
    /// (the policy's `[upstream.sampling]`); a flag also in `extra_args` is left to it.
    pub defaults: Vec<(&'static str, String)>,
    /// The order it prefills in (`--prefill-order`, the policy's `upstream.prefill_order`,
    /// which the gateway's prediction plays); `None`: the engine's own.
    pub prefill_order: Option<&'static str>,
    /// Arguments passed after the supervisor's own, e.g. `--threads 2`.
    pub extra_args: Vec<String>,
    /// Environment set for the engine on top of the gateway's own (its OTLP settings).
    pub env: Vec<(String, String)>,
    /// Delays between restarts.
    pub backoff: Backoff,
}

impl BundledConfig {
    /// Three ranks, two minutes to start, the engine's own defaults, no extra arguments, the
    /// default [`Backoff`].
    pub fn new(engine_bin: impl Into<PathBuf>, model: impl Into<PathBuf>) -> Self {
        Self {
            engine_bin: engine_bin.into(),
            model: model.into(),
            ranks: 3,
            start_timeout: Duration::from_secs(120),
            defaults: Vec::new(),
            prefill_order: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            backoff: Backoff::default(),
        }
    }

    /// As [`Self::new`], with what the policy's `[upstream]` sets of the engine's command line:
    /// its ranks, start timeout, generation defaults and prefill order.
    pub fn for_upstream(
        engine_bin: impl Into<PathBuf>,
        model: impl Into<PathBuf>,
        upstream: &Upstream,
    ) -> Self {
        Self {
            ranks: upstream.ranks,
            start_timeout: upstream.start_timeout,
            defaults: upstream.sampling.flags(),
            prefill_order: Some(upstream.prefill_order().flag()),
            ..Self::new(engine_bin, model)
        }
    }

    /// Finds the engine executable: `$SLUICE_ENGINE_BIN`, else `sluice-engine` in the
    /// directory of this executable or the one above it (test binaries live in
    /// `target/<profile>/deps`).
    pub fn locate_engine_bin() -> Result<PathBuf, SupervisorError> {
        if let Some(path) = std::env::var_os(ENGINE_BIN_ENV) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(SupervisorError::EngineNotFound { path })
            };
        }
        let exe = std::env::current_exe().map_err(SupervisorError::CurrentExe)?;
        let searched: Vec<PathBuf> = exe
            .ancestors()
            .skip(1)
            .take(2)
            .map(|dir| dir.join(ENGINE_BIN_NAME))
            .collect();
        match searched.iter().find(|p| p.is_file()) {
            Some(found) => Ok(found.clone()),
            None => Err(SupervisorError::EngineNotBuilt { searched }),
        }
    }

    /// The engine's command line (after the executable), listening on `addr`.
    pub(crate) fn args(&self, addr: SocketAddr) -> Vec<String> {
        let mut args = vec![
            "serve".to_owned(),
            "--ranks".to_owned(),
            self.ranks.to_string(),
            "--listen".to_owned(),
            addr.to_string(),
            "--model".to_owned(),
            self.model.display().to_string(),
            "--exit-with-parent".to_owned(),
            // A dead rank: restart the whole pipeline now, not after the unhealthy limit.
            "--exit-when-a-rank-exits".to_owned(),
        ];
        for (flag, value) in &self.defaults {
            let flag = format!("--default-{flag}");
            let given = |a: &String| a == &flag || a.starts_with(&format!("{flag}="));
            if !self.extra_args.iter().any(given) {
                args.extend([flag, value.clone()]);
            }
        }
        if let Some(order) = self.prefill_order {
            args.extend(["--prefill-order".to_owned(), order.to_owned()]);
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// Exponential restart delays: `initial`, doubled for each consecutive restart up to `max`.
/// The count starts over once an engine has stayed ready for `reset_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the first restart.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
    /// How long an engine must stay ready for the next failure to count as the first again.
    pub reset_after: Duration,
}

impl Default for Backoff {
    /// 0.5 s, 1 s, 2 s … at most 30 s; reset after 60 s ready.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay before restart number `attempt` (1 for the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }
}
