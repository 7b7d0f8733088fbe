//! Hot reload: a file watcher and SIGHUP put a new policy in force without a restart.
//!
//! The watcher watches the file's *directory*, because editors and config managers replace a
//! file by renaming a new one over it (and Kubernetes swaps a `..data` symlink), which a watch
//! on the file itself would lose. A reload reads only a finished file:
//!
//! - **Settled.** After an event the file's size, modification time and inode must stay the same
//!   for [`SETTLE`] (500 ms) with no further event; a writer that has modified the file in place
//!   and not yet closed it holds the reload off until it does (at most [`WRITER_WAIT_MAX`]).
//! - **Read whole.** The bytes read must be as many as the file held, and its stamp the same
//!   after the read as before; otherwise it is settled and read again.
//! - **Never empty, never anything but a regular file.** An empty file is the built-in defaults
//!   only at start-up; on a reload it is what a truncating save leaves for an instant, so it is
//!   refused. A directory, FIFO or device in the file's place is refused without being read.
//!
//! The bytes are then hashed, parsed, validated and passed through the [`Guard`] (no silent
//! widening of access; restart-only keys held) before [`PolicyStore::replace`] swaps them in.
//! Anything refused keeps the last good policy. Writing the same bytes again changes nothing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::guard::Guard;
use super::load::{hex_sha256, LoadedPolicy, PolicyError};
use super::store::PolicyStore;

/// How long the file must stay unchanged, with no event, before it is read.
pub const SETTLE: Duration = Duration::from_millis(500);
/// The longest a writer that modified the file in place and has not closed it holds a reload
/// off (a lost close event must not stop reloads).
pub const WRITER_WAIT_MAX: Duration = Duration::from_secs(10);
/// The longest a file that keeps changing puts a read off.
const SETTLE_MAX: Duration = Duration::from_secs(20);
/// Reads of a file that changed while it was read, before the reload is refused.
const READ_ATTEMPTS: usize = 5;

type Callback = dyn Fn(Result<&LoadedPolicy, &PolicyError>) + Send + Sync;

/// What the watcher saw happen to the file (or its directory's `..data` entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Written in place (created, modified): a writer may still hold it open.
    Written,
    /// A writer closed it.
    Closed,
    /// Its mode or owner changed.
    Touched,
    /// Another file took its place: renamed over, removed, a directory made there, a `..data`
    /// swap. A writer of the old file no longer writes the policy.
    Replaced,
}

/// What identifies one version of the file: a change to any field is a new version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    dev: u64,
    ino: u64,
}

impl Stamp {
    fn of_meta(m: &std::fs::Metadata) -> Self {
        Self {
            len: m.len(),
            modified: m.modified().ok(),
            dev: m.dev(),
            ino: m.ino(),
        }
    }

    /// The file's stamp (through symlinks); none when it cannot be read.
    fn of(path: &Path) -> Option<Self> {
        std::fs::metadata(path).ok().map(|m| Self::of_meta(&m))
    }
}

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
    /// The file changed while it was read: settle and read again.
    Changing,
}

/// Watches `path` and reloads it into `store` on change and on SIGHUP, each new file checked
/// by `guard`, calling `on_result` with each new policy or error (for metrics and alerts). Call
/// inside a Tokio runtime.
pub fn spawn_reloader(
    path: PathBuf,
    store: Arc<PolicyStore>,
    guard: Guard,
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

    let (tx, mut rx) = mpsc::unbounded_channel::<Change>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let names = || event.paths.iter().filter_map(|p| p.file_name());
        let own = names().any(|n| n == name.as_os_str());
        let data = names().any(|n| n.to_string_lossy().starts_with(".."));
        let change = match event.kind {
            // Reads (ours among them) change nothing.
            EventKind::Access(AccessKind::Close(AccessMode::Write)) if own => Change::Closed,
            EventKind::Access(_) => return,
            EventKind::Create(CreateKind::Folder) => Change::Replaced,
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any)
                if own =>
            {
                Change::Written
            }
            EventKind::Modify(ModifyKind::Metadata(_)) if own => Change::Touched,
            _ => Change::Replaced,
        };
        if own || data {
            let _ = tx.send(change);
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
        let mut writer = Writer::default();
        loop {
            let trigger = tokio::select! {
                got = rx.recv() => match got {
                    Some(change) => {
                        writer.note(change);
                        Trigger::Watch
                    }
                    None => return,
                },
                got = hangup.recv() => match got {
                    Some(()) => Trigger::Signal,
                    None => return,
                },
            };
            for attempt in 1..=READ_ATTEMPTS {
                // SIGHUP: the operator says the file is ready; read it at once.
                if trigger == Trigger::Watch || attempt > 1 {
                    settle(&mut rx, &path, &mut writer).await;
                }
                let outcome = reload_now(
                    &path,
                    &store,
                    &guard,
                    &*on_result,
                    &mut last_failed,
                    trigger,
                );
                if outcome != Outcome::Changing {
                    break;
                }
                if attempt == READ_ATTEMPTS {
                    let e = PolicyError::new(format!(
                        "{}: the file changed while it was read, {READ_ATTEMPTS} times; the last \
                         good policy stays (write it whole, or rename a finished file over it)",
                        path.display()
                    ));
                    tracing::error!(error = %e, "policy reload refused; the last good policy stays in force");
                    on_result(Err(&e));
                }
            }
        }
    });
    Ok(ReloadHandle {
        task,
        _watcher: watcher,
    })
}

/// Whether a writer has the file open: it wrote in place and has not closed it yet.
#[derive(Debug, Default)]
struct Writer {
    since: Option<Instant>,
}

impl Writer {
    fn note(&mut self, change: Change) {
        match change {
            Change::Written => {
                self.since.get_or_insert_with(Instant::now);
            }
            Change::Closed | Change::Replaced => self.since = None,
            Change::Touched => {}
        }
    }

    /// A writer still has the file open (for at most [`WRITER_WAIT_MAX`]).
    fn holds(&mut self) -> bool {
        match self.since {
            Some(t) if t.elapsed() < WRITER_WAIT_MAX => true,
            Some(_) => {
                self.since = None;
                false
            }
            None => false,
        }
    }
}

/// Waits until the file has been left alone for [`SETTLE`]: no event, the same stamp before and
/// after, no writer holding it open (at most [`SETTLE_MAX`] in all).
async fn settle(rx: &mut mpsc::UnboundedReceiver<Change>, path: &Path, writer: &mut Writer) {
    let start = Instant::now();
    loop {
        let before = Stamp::of(path);
        tokio::time::sleep(SETTLE).await;
        let mut quiet = true;
        while let Ok(change) = rx.try_recv() {
            quiet = false;
            writer.note(change);
        }
        let settled = quiet && !writer.holds() && Stamp::of(path) == before;
        if settled || start.elapsed() >= SETTLE_MAX {
            return;
        }
    }
}

/// Reads `path` once and puts it in force if it is new, whole, valid and let through by
/// `guard`. `last_failed` names the last refused state of the file (the hash of its bytes, or
/// why it could not be read), so a watch event on an unchanged broken file stays quiet.
pub(super) fn reload_now(
    path: &Path,
    store: &PolicyStore,
    guard: &Guard,
    on_result: &Callback,
    last_failed: &mut Option<String>,
    trigger: Trigger,
) -> Outcome {
    let mut refuse = |state: String, e: PolicyError| {
        if trigger == Trigger::Watch && last_failed.as_deref() == Some(state.as_str()) {
            return Outcome::Unchanged;
        }
        *last_failed = Some(state);
        tracing::error!(error = %e, "policy reload refused; the last good policy stays in force");
        on_result(Err(&e));
        Outcome::Refused
    };
    let at = |m: &str| PolicyError::new(format!("{}: {m}", path.display()));
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return refuse(format!("unreadable: {e}"), at(&e.to_string())),
    };
    if !meta.is_file() {
        return refuse(
            "not a file".into(),
            at("not a regular file (a directory, FIFO or device is never read as a policy)"),
        );
    }
    let empty = || {
        at(
            "the file is empty. An empty file means the built-in defaults only at start-up; on a \
            reload it is what a save in progress or a truncation leaves for an instant, so it is \
            refused (to go back to the defaults, write a file with a comment in it)",
        )
    };
    if meta.len() == 0 {
        return refuse(hex_sha256(b""), empty());
    }
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => return refuse(format!("unreadable: {e}"), at(&e.to_string())),
    };
    if bytes.len() as u64 != meta.len() || Stamp::of(path) != Some(Stamp::of_meta(&meta)) {
        return Outcome::Changing;
    }
    if bytes.is_empty() {
        return refuse(hex_sha256(b""), empty());
    }
    let sha256 = hex_sha256(&bytes);
    let current = store.current();
    if sha256 == current.sha256 {
        // Written back to the policy in force after a refused edit: the file is good again,
        // so whoever raised an alert for the refusal hears that it is over.
        if last_failed.take().is_some() {
            tracing::info!(path = %path.display(), %sha256, "policy file is back to the policy in force");
            on_result(Ok(&current));
        }
        return Outcome::Unchanged;
    }
    let admitted = LoadedPolicy::from_bytes(&bytes, Some(path)).and_then(|new| {
        let checked = guard
            .admit(&current.policy, new.policy.clone())
            .map_err(|e| at(&e.message))?;
        Ok((new, checked))
    });
    match admitted {
        Ok((mut new, checked)) => {
            *last_failed = None;
            new.policy = checked.policy;
            new.restart_pending = checked.restart_pending;
            new.access_changes = checked.access_changes;
            tracing::info!(path = %path.display(), sha256 = %new.sha256, "policy reloaded");
            for change in &new.access_changes {
                tracing::warn!(path = %path.display(), %change, "policy reload changed access");
            }
            if !new.restart_pending.is_empty() {
                tracing::warn!(
                    keys = %new.restart_pending.join(", "),
                    "policy reloaded, but these keys need a restart to take effect; their running values stay in force"
                );
            }
            store.replace(new.clone());
            on_result(Ok(&new));
            Outcome::Replaced(new.sha256)
        }
        Err(e) => refuse(sha256, e),
    }
}
