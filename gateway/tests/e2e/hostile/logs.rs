//! The gateway's log output, captured: a `tracing` subscriber writing every event (debug
//! included) into memory, installed for the current thread — a `current_thread` test runtime
//! runs the gateway's tasks on it, so everything the gateway logs lands here.

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// Captured log lines, each starting with its level.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures the current thread's events until the guard drops.
    pub fn capture() -> (Self, DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(sub))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned()
    }

    /// The lines logged at info, warn or error.
    pub fn above_debug(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                l.starts_with("INFO") || l.starts_with("WARN") || l.starts_with("ERROR")
            })
            .map(str::to_owned)
            .collect()
    }

    /// Nothing secret leaked: no `secret` at any level, no `private` above debug.
    pub fn assert_clean(&self, secrets: &[&str], private: &[&str]) {
        let all = self.text();
        assert!(!all.is_empty(), "the capture saw nothing: is it installed?");
        for s in secrets {
            assert!(!all.contains(s), "a key was logged:\n{all}");
        }
        for line in self.above_debug() {
            for p in private {
                assert!(!line.contains(p), "prompt text logged above debug: {line}");
            }
        }
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
