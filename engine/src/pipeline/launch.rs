//! `sluice-engine serve --ranks R` on one host: starts ranks 1..R-1 as child processes of its
//! own binary, reads the address each one bound, and kills them when it goes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};

/// The line a rank prints on stdout once it listens: `LISTENING <addr>`.
pub const LISTENING: &str = "LISTENING";
/// The environment variable carrying the cluster secret (kept off command lines).
pub const SECRET_ENV: &str = "SLUICE_CLUSTER_SECRET";

/// Running child ranks; dropping this kills them.
#[derive(Debug)]
pub struct ChildRanks {
    children: Arc<Mutex<Vec<(usize, Child)>>>,
    addrs: Vec<String>,
}

impl ChildRanks {
    /// Listening addresses of ranks 1..R.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// Stops this process when a child rank exits (killed, crashed): a pipeline missing a rank
    /// serves nothing, and whoever supervises rank 0 restarts the pipeline whole at once
    /// rather than after its unhealthy timeout. The streams in flight get half a second to
    /// end with their error events first.
    pub fn stop_when_a_rank_exits(&self) {
        let children = Arc::downgrade(&self.children);
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let Some(children) = children.upgrade() else {
                return;
            };
            let mut children = children.lock().unwrap_or_else(|e| e.into_inner());
            let exited = children
                .iter_mut()
                .find_map(|(k, c)| Some((*k, c.try_wait().ok()??)));
            if let Some((k, status)) = exited {
                drop(children);
                std::thread::sleep(Duration::from_millis(500));
                stop(&format!(
                    "rank {k} exited ({status}); stopping so that the pipeline restarts whole"
                ));
            }
        });
    }
}

impl Drop for ChildRanks {
    fn drop(&mut self) {
        // Taken out first: the watcher must not mistake these exits for a failure.
        let children =
            std::mem::take(&mut *self.children.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, mut c) in children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts ranks `1..n_ranks` with `exe rank --rank K --ranks R <args>`, each on `host:0`, and
/// waits until each one listens. A rank that exits first is reported with its own error text.
pub fn spawn_ranks(
    exe: &std::path::Path,
    n_ranks: usize,
    host: &str,
    args: &[String],
    secret: &str,
) -> Result<ChildRanks> {
    // Built first, so that ranks already started are killed if a later one fails.
    let mut ranks = ChildRanks {
        children: Arc::new(Mutex::new(Vec::new())),
        addrs: Vec::new(),
    };
    for k in 1..n_ranks {
        let mut child = Command::new(exe)
            .arg("rank")
            .args([
                "--rank",
                &k.to_string(),
                "--ranks",
                &n_ranks.to_string(),
                "--listen",
                &format!("{host}:0"),
                "--exit-with-parent",
            ])
            .args(args)
            .env(SECRET_ENV, secret)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A process group of its own: a Ctrl-C at the terminal (or a signal to the whole
            // group, as systemd's default sends) reaches rank 0 alone, which drains its streams
            // and then stops its ranks; in rank 0's group they died at once and failed every
            // stream the drain was for. A child still exits with its parent (--exit-with-parent).
            .process_group(0)
            .spawn()
            .map_err(|e| Error::Transport(format!("cannot start rank {k}: {e}")))?;
        let stderr_tail = Arc::new(Mutex::new(Vec::<String>::new()));
        if let Some(err) = child.stderr.take() {
            let tail = stderr_tail.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(err)
                    .lines()
                    .map_while(std::result::Result::ok)
                {
                    // Never eprintln!: it panics when our own stderr is gone.
                    let _ = writeln!(std::io::stderr(), "[rank {k}] {line}");
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.push(line);
                    if t.len() > 20 {
                        t.remove(0);
                    }
                }
            });
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Transport("no stdout from rank".into()))?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = lines.find_map(|l| {
            l.ok()
                .and_then(|l| l.strip_prefix(LISTENING).map(|a| a.trim().to_owned()))
        });
        // Keep draining the child's stdout so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        match addr {
            Some(a) => {
                ranks.addrs.push(a);
                ranks
                    .children
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((k, child));
            }
            None => {
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                std::thread::sleep(std::time::Duration::from_millis(100)); // let stderr drain
                let tail = stderr_tail
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .join("\n");
                return Err(Error::Transport(format!(
                    "rank {k} could not start ({status}): {tail}"
                )));
            }
        }
    }
    Ok(ranks)
}

/// In a child rank: exits when the parent that started it goes away.
pub fn exit_with_parent() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        if std::os::unix::process::parent_id() != parent {
            stop("the parent process went away; stopping");
        }
    });
}

/// Exits the process after a last word on stderr (which may already be closed: a parent that
/// died took the pipe with it, and `eprintln!` would panic instead of exiting).
pub fn stop(why: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "{why}");
    std::process::exit(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process group of `pid` (field 5 of `/proc/<pid>/stat`, after the command's `(…)`).
    fn pgid(pid: u32) -> String {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        after.split(' ').nth(2).expect("pgrp").to_owned()
    }

    #[test]
    fn child_ranks_run_in_a_process_group_of_their_own() {
        let dir = std::env::temp_dir().join(format!("sluice-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let exe = dir.join("rank.sh");
        std::fs::write(
            &exe,
            "#!/bin/sh\necho LISTENING 127.0.0.1:1\nexec sleep 30\n",
        )
        .expect("script");
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let ranks = spawn_ranks(&exe, 2, "127.0.0.1", &[], "s").expect("spawned");
        let child = ranks.children.lock().expect("lock")[0].1.id();
        assert_ne!(pgid(child), pgid(std::process::id()), "rank 0's group");
        assert_eq!(pgid(child), child.to_string(), "a group of its own");
        drop(ranks);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
