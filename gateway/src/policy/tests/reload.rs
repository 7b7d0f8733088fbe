//! Hot reload: good edits go in, broken ones change nothing, SIGHUP and drop work.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::files::temp_dir;
use crate::policy::reload::{reload_now, spawn_reloader, Outcome, Trigger};
use crate::policy::{Guard, LoadedPolicy, PolicyError, PolicyStore};

/// What the callback saw: `Ok(sha256)` or `Err(message)`.
type Seen = Arc<Mutex<Vec<Result<String, String>>>>;

fn recorder() -> (
    Seen,
    impl Fn(Result<&LoadedPolicy, &PolicyError>) + Send + Sync + 'static,
) {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    let record = move |r: Result<&LoadedPolicy, &PolicyError>| {
        let entry = r.map(|p| p.sha256.clone()).map_err(|e| e.message.clone());
        sink.lock().expect("lock").push(entry);
    };
    (seen, record)
}

/// The guard of a gateway on loopback.
pub(super) fn loopback() -> Guard {
    Guard::new(std::net::SocketAddr::from(([127, 0, 0, 1], 8443)))
}

/// One reload of `path` under a loopback gateway's rules.
fn reload(
    path: &Path,
    store: &PolicyStore,
    record: &(dyn Fn(Result<&LoadedPolicy, &PolicyError>) + Send + Sync + 'static),
    last_failed: &mut Option<String>,
    trigger: Trigger,
) -> Outcome {
    reload_now(path, store, &loopback(), record, last_failed, trigger)
}

fn policy_text(active_max: usize) -> String {
    format!("[admission]\nactive_max = {active_max}\nheavy_active_max = 1\n")
}

const BROKEN: &str = "[admission]\nactive_max = \n";

/// Writes `text` the way editors do: a new file renamed over the old one.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn setup(name: &str) -> (PathBuf, Arc<PolicyStore>) {
    let path = temp_dir(name).join("policy.toml");
    std::fs::write(&path, policy_text(4)).expect("write");
    let store = PolicyStore::new(LoadedPolicy::from_file(&path).expect("initial policy"));
    (path, store)
}

/// Polls `cond` for up to 2 s.
async fn within_2s(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..40 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond()
}

fn active_max(store: &PolicyStore) -> usize {
    store.current().policy.admission.active_max
}

#[tokio::test]
async fn watcher_applies_good_edits_and_keeps_the_last_good_policy() {
    let (path, store) = setup("watch");
    let (seen, record) = recorder();
    let _handle =
        spawn_reloader(path.clone(), store.clone(), loopback(), record).expect("reloader");

    replace_file(&path, &policy_text(2));
    assert!(
        within_2s(|| active_max(&store) == 2).await,
        "rename edit not applied"
    );
    let good_hash = store.current().sha256.clone();
    assert!(seen.lock().expect("lock").contains(&Ok(good_hash.clone())));

    std::fs::write(&path, BROKEN).expect("write");
    let got_error = || seen.lock().expect("lock").iter().any(Result::is_err);
    assert!(within_2s(got_error).await, "broken edit not reported");
    let errors: Vec<String> = seen
        .lock()
        .expect("lock")
        .iter()
        .filter_map(|r| r.clone().err())
        .collect();
    assert!(errors[0].contains("line 2, column 14"), "{errors:?}");
    assert!(
        errors[0].starts_with(&path.display().to_string()),
        "{errors:?}"
    );
    assert_eq!(active_max(&store), 2);
    assert_eq!(store.current().sha256, good_hash);

    std::fs::write(&path, policy_text(6)).expect("write");
    assert!(
        within_2s(|| active_max(&store) == 6).await,
        "edit after a broken one not applied"
    );
}

#[tokio::test]
async fn dropping_the_handle_stops_reloading() {
    let (path, store) = setup("drop");
    let (_seen, record) = recorder();
    let handle = spawn_reloader(path.clone(), store.clone(), loopback(), record).expect("reloader");
    replace_file(&path, &policy_text(3));
    assert!(within_2s(|| active_max(&store) == 3).await);
    drop(handle);
    replace_file(&path, &policy_text(2));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(active_max(&store), 3);
}

#[tokio::test]
async fn sighup_reloads() {
    let (path, store) = setup("sighup");
    // Edited before the watcher starts, so only the signal can bring it in.
    replace_file(&path, &policy_text(5));
    let (_seen, record) = recorder();
    let _handle =
        spawn_reloader(path.clone(), store.clone(), loopback(), record).expect("reloader");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(active_max(&store), 4, "reloaded without a signal");
    let pid = std::process::id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill -HUP");
    assert!(
        within_2s(|| active_max(&store) == 5).await,
        "SIGHUP did not reload"
    );
}

#[test]
fn reload_now_reports_each_outcome() {
    let (path, store) = setup("now");
    let (seen, record) = recorder();
    let mut last_failed = None;
    let mut again = |trigger| reload(&path, &store, &record, &mut last_failed, trigger);

    assert_eq!(again(Trigger::Signal), Outcome::Unchanged);
    std::fs::write(&path, BROKEN).expect("write");
    assert_eq!(again(Trigger::Watch), Outcome::Refused);
    // The same broken bytes again: quiet on a watch event, reported on SIGHUP.
    assert_eq!(again(Trigger::Watch), Outcome::Unchanged);
    assert_eq!(again(Trigger::Signal), Outcome::Refused);
    std::fs::write(&path, policy_text(2)).expect("write");
    let Outcome::Replaced(hash) = again(Trigger::Signal) else {
        panic!("good edit not replaced");
    };
    assert_eq!(again(Trigger::Watch), Outcome::Unchanged);
    // A file still missing once settled is reported (once per state on watch events).
    std::fs::remove_file(&path).expect("remove");
    assert_eq!(again(Trigger::Watch), Outcome::Refused);
    assert_eq!(again(Trigger::Watch), Outcome::Unchanged);
    assert_eq!(again(Trigger::Signal), Outcome::Refused);

    assert_eq!(store.current().sha256, hash);
    assert_eq!(store.current().policy.admission.active_max, 2);
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(
        seen[0]
            .as_ref()
            .is_err_and(|e| e.contains("line 2, column 14")),
        "{seen:?}"
    );
    assert_eq!(seen[2], Ok(hash));
}

#[test]
fn writing_back_the_policy_in_force_after_a_refusal_reports_it_good_again() {
    let (path, store) = setup("back");
    let (seen, record) = recorder();
    let mut last_failed = None;
    let good = std::fs::read(&path).expect("read");
    std::fs::write(&path, BROKEN).expect("write");
    assert_eq!(
        reload(&path, &store, &record, &mut last_failed, Trigger::Watch),
        Outcome::Refused
    );
    std::fs::write(&path, &good).expect("write");
    assert_eq!(
        reload(&path, &store, &record, &mut last_failed, Trigger::Watch),
        Outcome::Unchanged
    );
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].is_err());
    assert_eq!(seen[1], Ok(store.current().sha256.clone()));
}

#[test]
fn an_empty_file_is_refused_on_reload_and_says_why() {
    let (path, store) = setup("empty");
    let (seen, record) = recorder();
    let mut last_failed = None;
    let before = store.current().sha256.clone();
    std::fs::write(&path, "").expect("truncate");
    for trigger in [Trigger::Watch, Trigger::Signal] {
        assert_eq!(
            reload(&path, &store, &record, &mut last_failed, trigger),
            Outcome::Refused
        );
    }
    assert_eq!(store.current().sha256, before);
    let seen = seen.lock().expect("lock");
    let e = seen[0].as_ref().expect_err("refused");
    assert!(
        e.contains("the file is empty") && e.contains("only at start-up"),
        "{e}"
    );
}

#[test]
fn a_fifo_or_directory_in_the_files_place_is_refused_without_reading_it() {
    let (path, store) = setup("special");
    let (seen, record) = recorder();
    let mut last_failed = None;
    std::fs::remove_file(&path).expect("rm");
    let made = std::process::Command::new("mkfifo").arg(&path).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    // Reading a FIFO with no writer would block the reloader for good.
    let started = std::time::Instant::now();
    assert_eq!(
        reload(&path, &store, &record, &mut last_failed, Trigger::Signal),
        Outcome::Refused
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    std::fs::remove_file(&path).expect("rm fifo");
    std::fs::create_dir(&path).expect("dir");
    assert_eq!(
        reload(&path, &store, &record, &mut last_failed, Trigger::Signal),
        Outcome::Refused
    );
    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|r| r.as_ref().is_err_and(|e| e.contains("not a regular file"))));
    assert_eq!(active_max(&store), 4);
}

#[test]
fn a_reload_that_drops_every_tenant_is_refused_with_the_key_path() {
    let dir = temp_dir("tenants-dropped");
    let path = dir.join("policy.toml");
    let key = "26610361abc9db469217e20ea87f004719c498a704d49688c651b26cf7af8963";
    std::fs::write(
        &path,
        format!("[[tenants]]\nname = \"a\"\napi_key_sha256 = \"{key}\"\n"),
    )
    .expect("write");
    let store = PolicyStore::new(LoadedPolicy::from_file(&path).expect("initial"));
    let (seen, record) = recorder();
    let mut last_failed = None;
    std::fs::write(&path, "[admission]\nactive_max = 2\n").expect("write");
    assert_eq!(
        reload(&path, &store, &record, &mut last_failed, Trigger::Watch),
        Outcome::Refused
    );
    assert_eq!(store.current().policy.tenants.len(), 1);
    let seen = seen.lock().expect("lock");
    let e = seen[0].as_ref().expect_err("refused");
    assert!(
        e.starts_with(&format!("{}: tenants: ", path.display())),
        "{e}"
    );
}

#[test]
fn a_reload_that_widens_a_tenant_goes_in_force_with_its_access_changes() {
    let dir = temp_dir("tenant-widened");
    let path = dir.join("policy.toml");
    let key = "26610361abc9db469217e20ea87f004719c498a704d49688c651b26cf7af8963";
    let bob =
        |extra: &str| format!("[[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{key}\"\n{extra}");
    std::fs::write(&path, bob("class = \"batch\"\ntokens_per_minute = 1000\n")).expect("write");
    let store = PolicyStore::new(LoadedPolicy::from_file(&path).expect("initial"));
    assert!(store.current().access_changes.is_empty());
    let (_seen, record) = recorder();
    let mut last_failed = None;
    std::fs::write(&path, bob("")).expect("write");
    let outcome = reload(&path, &store, &record, &mut last_failed, Trigger::Watch);
    assert!(matches!(outcome, Outcome::Replaced(_)), "{outcome:?}");
    assert_eq!(
        store.current().access_changes,
        vec![
            "tenant \"bob\": class batch -> interactive",
            "tenant \"bob\": tokens_per_minute 1000 -> unlimited",
        ]
    );
    let mut metrics = String::new();
    crate::telemetry::metrics::render_policy(&mut metrics, &store.current());
    assert!(
        metrics.contains("\nsluice_policy_access_changes 2\n"),
        "{metrics}"
    );
}

#[test]
fn a_reload_that_changes_listen_applies_the_rest_and_reports_the_restart() {
    let (path, store) = setup("restart");
    let (_seen, record) = recorder();
    let mut last_failed = None;
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:9999\"\n[admission]\nactive_max = 2\nheavy_active_max = 1\n",
    )
    .expect("write");
    let outcome = reload(&path, &store, &record, &mut last_failed, Trigger::Watch);
    assert!(matches!(outcome, Outcome::Replaced(_)), "{outcome:?}");
    let now = store.current();
    assert_eq!(now.policy.admission.active_max, 2);
    assert_eq!(now.policy.server.listen.to_string(), "127.0.0.1:8443");
    assert_eq!(now.restart_pending, vec!["server.listen"]);
}

#[tokio::test]
async fn a_writer_holding_the_file_open_holds_the_reload_off() {
    use std::io::Write as _;
    let (path, store) = setup("held");
    let (seen, record) = recorder();
    let _handle =
        spawn_reloader(path.clone(), store.clone(), loopback(), record).expect("reloader");
    let text = policy_text(2);
    let (first, second) = text.split_at(text.find("heavy").expect("split"));
    let mut f = std::fs::File::create(&path).expect("open");
    f.write_all(first.as_bytes()).expect("first half");
    // The first half parses (active_max = 2, heavy_active_max defaults to 1) but must not go
    // in: the writer still has the file open.
    tokio::time::sleep(super::super::reload::SETTLE * 3).await;
    assert_eq!(active_max(&store), 4, "half a file went in force");
    assert!(seen.lock().expect("lock").is_empty(), "{:?}", seen.lock());
    f.write_all(second.as_bytes()).expect("second half");
    drop(f);
    assert!(
        within_2s(|| active_max(&store) == 2).await,
        "the finished file was not applied"
    );
    let hashes: Vec<_> = seen.lock().expect("lock").clone();
    assert_eq!(
        hashes,
        vec![Ok(crate::policy::load::hex_sha256(text.as_bytes()))]
    );
}
