//! Hot reload: a file watcher and SIGHUP put a new policy in force without a restart.
//!
//! The watcher watches the file's *directory*, because editors and config managers replace a
//! file by renaming a new one over it (and Kubernetes swaps a `..data` symlink), which a watch
//! on the file itself would lose. Events are debounced, then the file is read whole, hashed,
//! parsed and validated before [`PolicyStore::replace`] swaps it in; an edit that fails keeps
//! the last good policy. Writing the same bytes again changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::EventKind;
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::load::{hex_sha256, LoadedPolicy, PolicyError};
use super::store::PolicyStore;

/// How long the file must stay quiet after an event before it is read.
pub const DEBOUNCE: Duration = Duration::from_millis(150);
/// The longest a stream of events can put a reload off.
const DEBOUNCE_MAX_ROUNDS: usize = 10;

type Callback = dyn Fn(Result<&LoadedPolicy, &PolicyError>) + Send + Sync;

/// Keeps the watcher and the reload task alive; dropping it stops both.
#[derive(Debug)]
pub struct ReloadHandle {
    task: JoinHandle<()>,
    _watcher: RecommendedWatcher,
}

impl Drop for ReloadHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What woke the reloader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Trigger {
    /// The file (or its directory entry) changed: a file whose bytes failed before is not
    /// reported again until they change.
    Watch,
    /// SIGHUP: the operator asked, so the outcome is always reported.
    Signal,
}

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The file's bytes are the policy in force (or the last that failed, on a watch event).
    Unchanged,
    /// A new policy, with this hash, is in force.
    Replaced(String),
    /// The file was refused; the last good policy stays.
    Refused,
}

/// Watches `path` and reloads it into `store` on change and on SIGHUP, calling `on_result`
/// with each new policy or error (for metrics and alerts). Call inside a Tokio runtime.
pub fn spawn_reloader(
    path: PathBuf,
    store: Arc<PolicyStore>,
    on_result: impl Fn(Result<&LoadedPolicy, &PolicyError>) + Send + Sync + 'static,
) -> Result<ReloadHandle, PolicyError> {
    let name = path
        .file_name()
        .map(ToOwned::to_owned)
        .ok_or_else(|| PolicyError::new(format!("{}: not a file name", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let watch_err = |e: notify::Error| {
        PolicyError::new(format!("{}: cannot watch for changes: {e}", dir.display()))
    };

    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        // Our own reads show up as access events; only changes matter.
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        let ours = event.paths.iter().any(|p| {
            p.file_name()
                .is_some_and(|n| n == name.as_os_str() || n.to_string_lossy().starts_with(".."))
        });
        if ours {
            let _ = tx.send(());
        }
    })
    .map_err(watch_err)?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(watch_err)?;
    let mut hangup = signal(SignalKind::hangup())
        .map_err(|e| PolicyError::new(format!("cannot listen for SIGHUP: {e}")))?;

    let on_result: Arc<Callback> = Arc::new(on_result);
    let task = tokio::spawn(async move {
        let mut last_failed: Option<String> = None;
        loop {
            let trigger = tokio::select! {
                got = rx.recv() => match got {
                    Some(()) => {
                        debounce(&mut rx).await;
                        Trigger::Watch
                    }
                    None => return,
                },
                got = hangup.recv() => match got {
                    Some(()) => Trigger::Signal,
                    None => return,
                },
            };
            reload_now(&path, &store, &*on_result, &mut last_failed, trigger);
        }
    });
    Ok(ReloadHandle {
        task,
        _watcher: watcher,
    })
}

/// Waits until no event has come for [`DEBOUNCE`] (at most a few rounds).
async fn debounce(rx: &mut mpsc::UnboundedReceiver<()>) {
    for _ in 0..DEBOUNCE_MAX_ROUNDS {
        tokio::time::sleep(DEBOUNCE).await;
        let mut more = false;
        while rx.try_recv().is_ok() {
            more = true;
        }
        if !more {
            return;
        }
    }
}

/// Reads `path` once and puts it in force if it is new and valid. `last_failed` holds the
/// hash of the last refused bytes, so a watch event on an unchanged broken file stays quiet.
pub(super) fn reload_now(
    path: &Path,
    store: &PolicyStore,
    on_result: &Callback,
    last_failed: &mut Option<String>,
    trigger: Trigger,
) -> Outcome {
    let refuse = |e: PolicyError| {
        tracing::error!(error = %e, "policy reload refused; the last good policy stays in force");
        on_result(Err(&e));
        Outcome::Refused
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        // A rename over the file leaves a moment with no file; its own event follows.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && trigger == Trigger::Watch => {
            return Outcome::Unchanged;
        }
        Err(e) => return refuse(PolicyError::new(format!("{}: {e}", path.display()))),
    };
    let sha256 = hex_sha256(&bytes);
    if sha256 == store.current().sha256 {
        // Written back to the policy in force after a refused edit: the file is good again,
        // so whoever raised an alert for the refusal hears that it is over.
        if last_failed.take().is_some() {
            tracing::info!(path = %path.display(), %sha256, "policy file is back to the policy in force");
            on_result(Ok(&store.current()));
        }
        return Outcome::Unchanged;
    }
    if trigger == Trigger::Watch && last_failed.as_deref() == Some(sha256.as_str()) {
        return Outcome::Unchanged;
    }
    match LoadedPolicy::from_bytes(&bytes, Some(path)) {
        Ok(new) => {
            *last_failed = None;
            tracing::info!(path = %path.display(), sha256 = %new.sha256, "policy reloaded");
            store.replace(new.clone());
            on_result(Ok(&new));
            Outcome::Replaced(new.sha256)
        }
        Err(e) => {
            *last_failed = Some(sha256);
            refuse(e)
        }
    }
}
