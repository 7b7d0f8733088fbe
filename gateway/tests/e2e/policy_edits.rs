//! The ways policy files really get written, each under load: a client with a valid key and a
//! client without one send requests throughout while the file is rewritten, and back again.
//!
//! In every case: only complete files the test wrote ever go in force (every policy the
//! reloader puts in force is recorded), the keyless client never gets a success, no request
//! with a valid key fails, and the final file is in force within 2 s of being written.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use sluice_gateway::policy::{spawn_reloader, Guard, LoadedPolicy};

use crate::common::{chat, eventually, sha256_hex, Client, Gateway, ScriptedUpstream};

const KEY: &str = "sk-edits-valid-key";
const ADMIN_KEY: &str = "sk-edits-admin";

/// A complete policy: tenants and the admin key first, then the tables the second half of a
/// two-part write adds (so the first half alone parses to a valid policy with the same keys,
/// which must still never go in force).
fn policy_text(active_max: usize) -> (String, usize) {
    let first = format!(
        "# policy with active_max {active_max}\n[admin]\napi_key_sha256 = \"{}\"\n\n\
         [[tenants]]\nname = \"alice\"\napi_key_sha256 = \"{}\"\n\n",
        sha256_hex(ADMIN_KEY),
        sha256_hex(KEY)
    );
    let rest = format!(
        "[admission]\nactive_max = {active_max}\nqueue_depth = 64\nheavy_active_max = 1\n\n\
         [limits]\nmax_tokens_default = 64\n"
    );
    let split = first.len();
    (first + &rest, split)
}

/// How a test rewrites the file with `text` (split at `split` for two-part writes).
#[derive(Clone, Copy, Debug)]
enum Way {
    /// `: > file`, a pause, then the whole text (two opens).
    TruncateThenWrite,
    /// One open: truncate, a pause longer than the settle time, the text, close.
    TruncateHeldOpen,
    /// The first half, closed; a pause; the second half appended.
    TwoHalves,
    /// The first half, the file held open for a second, the second half, close.
    TwoHalvesHeldOpen,
    /// A temporary file renamed over the policy (vim, most editors).
    RenameOver,
    /// `cp new policy.toml`.
    CopyOver,
    /// `rm policy.toml`, a pause, the new file.
    DeleteRecreate,
    /// A Kubernetes ConfigMap volume: `policy.toml -> ..data/policy.toml`, and the `..data`
    /// symlink swapped to a new timestamped directory.
    ConfigMap,
    /// A FIFO, then a directory in the file's place (neither readable as a policy), then the
    /// new file renamed over; and the file made mode 000 for a while.
    Unreadable,
}

struct Layout {
    dir: PathBuf,
    /// The path the gateway watches.
    file: PathBuf,
    version: usize,
}

impl Layout {
    fn new(way: Way, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-edits-{}-{way:?}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("policy.toml");
        let mut l = Self {
            dir,
            file,
            version: 0,
        };
        if matches!(way, Way::ConfigMap) {
            l.configmap_swap(text);
            std::os::unix::fs::symlink("..data/policy.toml", &l.file).expect("symlink");
        } else {
            std::fs::write(&l.file, text).expect("write");
        }
        l
    }

    /// What the kubelet's atomic writer does: a new timestamped directory, `..data_tmp`
    /// pointing at it, renamed over `..data`, the old directory removed.
    fn configmap_swap(&mut self, text: &str) {
        self.version += 1;
        let name = format!(
            "..2026_12_01_09_00_0{}.{}",
            self.version,
            1000 + self.version
        );
        let version_dir = self.dir.join(&name);
        std::fs::create_dir(&version_dir).expect("version dir");
        std::fs::write(version_dir.join("policy.toml"), text).expect("write");
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).expect("symlink");
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).expect("remove old version");
        }
    }

    async fn write(&mut self, way: Way, text: &str, split: usize) {
        let file = self.file.clone();
        let pause = |ms| tokio::time::sleep(Duration::from_millis(ms));
        match way {
            Way::TruncateThenWrite => {
                std::fs::File::create(&file).expect("truncate");
                pause(300).await;
                std::fs::write(&file, text).expect("write");
            }
            Way::TruncateHeldOpen => {
                let mut f = std::fs::File::create(&file).expect("truncate");
                pause(1200).await;
                f.write_all(text.as_bytes()).expect("write");
            }
            Way::TwoHalves => {
                std::fs::write(&file, &text[..split]).expect("first half");
                pause(200).await;
                append(&file, &text[split..]);
            }
            Way::TwoHalvesHeldOpen => {
                let mut f = std::fs::File::create(&file).expect("open");
                f.write_all(&text.as_bytes()[..split]).expect("first half");
                pause(1200).await;
                f.write_all(&text.as_bytes()[split..]).expect("second half");
            }
            Way::RenameOver => {
                let tmp = self.dir.join(".policy.toml.swp");
                std::fs::write(&tmp, text).expect("write");
                std::fs::rename(&tmp, &file).expect("rename");
            }
            Way::CopyOver => {
                let src = self.dir.join("staged.toml.new");
                std::fs::write(&src, text).expect("stage");
                std::fs::copy(&src, &file).expect("cp");
            }
            Way::DeleteRecreate => {
                std::fs::remove_file(&file).expect("rm");
                pause(300).await;
                std::fs::write(&file, text).expect("write");
            }
            Way::ConfigMap => self.configmap_swap(text),
            Way::Unreadable => {
                use std::os::unix::fs::PermissionsExt;
                let perms = |mode| std::fs::Permissions::from_mode(mode);
                std::fs::set_permissions(&file, perms(0o000)).expect("chmod 000");
                pause(1000).await;
                std::fs::set_permissions(&file, perms(0o644)).expect("chmod 644");
                let fifo = self.dir.join("fifo");
                let made = std::process::Command::new("mkfifo").arg(&fifo).status();
                assert!(made.is_ok_and(|s| s.success()), "mkfifo");
                std::fs::rename(&fifo, &file).expect("fifo over the file");
                pause(1000).await;
                std::fs::remove_file(&file).expect("rm fifo");
                std::fs::create_dir(&file).expect("a directory in its place");
                pause(1000).await;
                std::fs::remove_dir(&file).expect("rmdir");
                let tmp = self.dir.join("policy.toml.new");
                std::fs::write(&tmp, text).expect("write");
                std::fs::rename(&tmp, &file).expect("rename");
            }
        }
    }
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open");
    f.write_all(text.as_bytes()).expect("append");
}

/// Counts of one client's answers.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    refused: AtomicUsize,
    other: Mutex<Vec<String>>,
}

/// Sends requests with `client` until `stop`.
fn keep_sending(
    client: Client,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let (status, _, v) = client.post("/v1/chat/completions", &chat()).await;
            match status {
                StatusCode::OK => tally.ok.fetch_add(1, Ordering::SeqCst),
                StatusCode::UNAUTHORIZED => tally.refused.fetch_add(1, Ordering::SeqCst),
                s => {
                    tally.other.lock().expect("lock").push(format!("{s} {v}"));
                    0
                }
            };
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

async fn edit_under_load(way: Way) {
    let texts = [policy_text(4), policy_text(3)];
    let hashes: Vec<String> = texts.iter().map(|(t, _)| sha256_hex(t)).collect();
    let mut layout = Layout::new(way, &texts[0].0);
    let loaded = LoadedPolicy::from_file(&layout.file).expect("valid");

    let mut up = ScriptedUpstream::start().await;
    let upstream = up.upstream();
    tokio::spawn(async move {
        while let Some(a) = up.arrivals.recv().await {
            let mut tx = a.tx;
            tokio::spawn(async move {
                let _ = tx.send_data(Bytes::from_static(b"data: [DONE]\n\n")).await;
            });
        }
    });
    let gw = Gateway::start(loaded.policy.clone(), upstream).await;
    gw.app.policy.replace(loaded);
    let in_force: Arc<Mutex<Vec<String>>> = Arc::default();
    let refusals: Arc<Mutex<Vec<String>>> = Arc::default();
    let (seen, refused) = (in_force.clone(), refusals.clone());
    let _watch = spawn_reloader(
        layout.file.clone(),
        gw.app.policy.clone(),
        Guard::new(gw.addr),
        move |r| match r {
            Ok(p) => seen.lock().expect("lock").push(p.sha256.clone()),
            Err(e) => refused.lock().expect("lock").push(e.message.clone()),
        },
    )
    .expect("watch");

    let stop = Arc::new(AtomicBool::new(false));
    let (valid, keyless) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let clients = [
        keep_sending(
            gw.client()
                .with_header("authorization", &format!("Bearer {KEY}")),
            stop.clone(),
            valid.clone(),
        ),
        keep_sending(gw.client(), stop.clone(), keyless.clone()),
    ];
    tokio::time::sleep(Duration::from_millis(300)).await;

    for (text, split) in [&texts[1], &texts[0]].map(|(t, s)| (t.clone(), *s)) {
        layout.write(way, &text, split).await;
        let want = sha256_hex(&text);
        let store = gw.app.policy.clone();
        assert!(
            eventually(Duration::from_secs(2), || store.current().sha256 == want).await,
            "{way:?}: the file written was not in force within 2 s (refusals: {:?})",
            refusals.lock().expect("lock")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("client");
    }
    let in_force = in_force.lock().expect("lock").clone();
    for h in &in_force {
        assert!(
            hashes.contains(h),
            "{way:?}: a policy that is not a file the test wrote went in force: {h}"
        );
    }
    assert!(in_force.len() >= 2, "{way:?}: {in_force:?}");
    assert_eq!(
        keyless.ok.load(Ordering::SeqCst),
        0,
        "{way:?}: a keyless request was served"
    );
    assert!(
        keyless.refused.load(Ordering::SeqCst) > 10,
        "{way:?}: the keyless client barely ran"
    );
    assert!(
        valid.refused.load(Ordering::SeqCst) == 0,
        "{way:?}: a valid key was refused"
    );
    let other = valid.other.lock().expect("lock").clone();
    assert!(
        other.is_empty(),
        "{way:?}: valid-key requests failed: {other:?}"
    );
    assert!(
        valid.ok.load(Ordering::SeqCst) > 10,
        "{way:?}: the valid client barely ran"
    );
    gw.assert_accounted().await;
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&layout.dir);
}

macro_rules! ways {
    ($($name:ident => $way:expr),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                edit_under_load($way).await;
            }
        )*
    };
}

ways!(
    truncate_then_write => Way::TruncateThenWrite,
    truncate_held_open_then_write => Way::TruncateHeldOpen,
    two_halves => Way::TwoHalves,
    two_halves_held_open => Way::TwoHalvesHeldOpen,
    temp_file_renamed_over => Way::RenameOver,
    cp_over => Way::CopyOver,
    delete_then_recreate => Way::DeleteRecreate,
    configmap_data_symlink_swap => Way::ConfigMap,
    unreadable_file => Way::Unreadable,
);

/// `sluice serve` off loopback with no tenants refuses to start unless the policy says
/// `[server] open = true`, and names the key.
#[tokio::test]
async fn serving_open_off_loopback_needs_server_open_at_start() {
    let dir = std::env::temp_dir().join(format!("sluice-edits-{}-start", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let upstream = "[upstream]\nkind = \"openai\"\nurls = [\"http://127.0.0.1:9\"]\n";
    let serve = |text: String| {
        let file = dir.join("policy.toml");
        std::fs::write(&file, text).expect("write");
        tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--plain-http", "--listen", "0.0.0.0:0", "--policy"])
            .arg(&file)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("sluice serve")
    };
    let refused = serve(upstream.to_owned())
        .wait_with_output()
        .await
        .expect("exit");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "started open on 0.0.0.0: {stderr}"
    );
    assert!(
        stderr.contains("server.open: the gateway listens on 0.0.0.0:0"),
        "{stderr}"
    );

    let mut open = serve(format!("[server]\nopen = true\n{upstream}"));
    let mut err = tokio::io::BufReader::new(open.stderr.take().expect("stderr"));
    let mut line = String::new();
    let listening = tokio::time::timeout(Duration::from_secs(20), async {
        use tokio::io::AsyncBufReadExt as _;
        loop {
            line.clear();
            if err.read_line(&mut line).await.expect("read") == 0 {
                return false;
            }
            if line.contains("sluice: listening on http://0.0.0.0:") {
                return true;
            }
        }
    })
    .await;
    assert_eq!(
        listening.ok(),
        Some(true),
        "explicitly open did not start: {line}"
    );
    let _ = open.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice policy check NEW --against RUNNING` says what saving NEW over RUNNING would do, by
/// the reload's own rules: its access changes and the keys that wait for a restart; and it
/// refuses, naming the key, what a reload would refuse.
#[tokio::test]
async fn policy_check_against_the_file_in_force_says_what_a_reload_would_do() {
    let dir = std::env::temp_dir().join(format!("sluice-edits-{}-check", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let (running_text, _) = policy_text(4);
    let running = dir.join("running.toml");
    std::fs::write(&running, &running_text).expect("write");
    let check = |text: String| {
        let new = dir.join("new.toml");
        std::fs::write(&new, text).expect("write");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["policy", "check"])
            .arg(&new)
            .arg("--against")
            .arg(&running)
            .output()
            .expect("sluice policy check");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success(), stdout)
    };

    // The same file: ok, nothing to say.
    let (ok, out) = check(running_text.clone());
    assert!(ok, "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("ok "), "{out}");

    // A second tenant, alice's limit raised, a new listen address: two access lines, one
    // restart line.
    let widened = running_text.replace(
        "name = \"alice\"\n",
        "name = \"alice\"\nrequests_per_second = 5.0\n",
    ) + &format!(
        "\n[[tenants]]\nname = \"bob\"\napi_key_sha256 = \"{}\"\n\n[server]\nlisten = \"127.0.0.1:9443\"\n",
        sha256_hex("sk-bob")
    );
    let (ok, out) = check(widened);
    assert!(ok, "{out}");
    for line in [
        "access: tenants added: [\"bob\"]\n",
        "access: tenant \"alice\": requests_per_second unlimited -> 5\n",
        "restart: server.listen (a reload keeps its running value)\n",
    ] {
        assert!(out.contains(line), "{out:?} lacks {line:?}");
    }

    // Every tenant dropped without `server.open`: refused, as the reload would.
    let (first, split) = policy_text(4);
    let no_tenants = first[..split]
        .split("[[tenants]]")
        .next()
        .expect("text")
        .to_owned()
        + &first[split..];
    let (ok, out) = check(no_tenants);
    assert!(!ok, "{out}");
    assert!(
        out.contains("new.toml: tenants: the new file has no [[tenants]]"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
