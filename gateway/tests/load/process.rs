//! What the load tests read of their own process and of the engine's: the gateway's memory,
//! the ranks' KV use, and the engine's priority.

use std::time::Duration;

use sluice_gateway::bundled::Supervisor;

use crate::engine::children;

/// This process's resident set, in bytes.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Waits until no rank holds KV blocks (a leak would keep them), at most `limit`.
pub async fn kv_drained(sup: &Supervisor, limit: Duration) -> bool {
    crate::common::eventually(limit, || {
        let ranks = sup.ranks();
        !ranks.is_empty() && ranks.iter().all(|r| r.up && r.kv_tokens_used == 0)
    })
    .await
}

/// Lowers the priority of every thread of the engine's processes (rank 0 and its ranks) by
/// `nice`, so that on a machine the two share, the gateway's own work comes first.
pub fn renice_engine(sup: &Supervisor, nice: i32) {
    let Some(rank0) = sup.child_pid() else {
        return;
    };
    for pid in std::iter::once(rank0).chain(children(rank0)) {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_else(|_| Vec::<String>::new());
        for tid in tasks {
            let _ = std::process::Command::new("renice")
                .args(["-n", &nice.to_string(), "-p", &tid])
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}
