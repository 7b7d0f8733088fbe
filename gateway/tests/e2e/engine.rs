//! The real bundled engine for the fault, overload and soak tests: started once per test by
//! the gateway's supervisor, as `sluice serve` does; and what `/proc` says about processes.

use std::sync::Arc;
use std::time::Duration;

use sluice_gateway::bundled::{BundledConfig, Supervisor};
use sluice_gateway::forward::BundledUpstream;
use sluice_gateway::policy::Policy;

use crate::common::Gateway;

/// Three ranks on the real model, started as the policy's `[upstream]` says, ready; a ready
/// engine that stays unhealthy (a rank died) is restarted after `unhealthy_limit`.
pub async fn start(policy: Policy, unhealthy_limit: Duration) -> (Arc<Supervisor>, Gateway) {
    let bin = BundledConfig::locate_engine_bin().unwrap_or_else(|e| panic!("{e}"));
    let model = sluice_engine::model::default_model_path();
    let mut cfg = BundledConfig::for_upstream(bin, model, &policy.upstream);
    cfg.ranks = 3;
    cfg.start_timeout = unhealthy_limit;
    let sup = Arc::new(Supervisor::start(cfg).await.expect("engine"));
    sup.wait_ready(Duration::from_secs(180))
        .await
        .expect("engine ready");
    let up = Arc::new(BundledUpstream::new(sup.clone()).expect("upstream"));
    (sup, Gateway::start(policy, up).await)
}

/// Stops the gateway, then the engine.
pub async fn stop(sup: Arc<Supervisor>, gw: Gateway) {
    gw.shutdown().await;
    if let Ok(sup) = Arc::try_unwrap(sup) {
        sup.shutdown().await;
    }
}

/// The live children of `parent` (from `/proc/*/stat`).
pub fn children(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let mut after = stat
                .rsplit_once(')')
                .map_or("", |(_, t)| t)
                .split_whitespace();
            let state = after.next();
            let ppid = after.next().and_then(|p| p.parse::<u32>().ok());
            state != Some("Z") && ppid == Some(parent)
        })
        .collect()
}

/// `kill -s KILL pid`.
pub fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-s", "KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s KILL {pid}: {status}");
}

/// Held by each test that runs a real engine (the bundled one, or vLLM once it is up), so that
/// they run one at a time: two engines at once on two cores would make every latency figure
/// meaningless.
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}

/// The TCP addresses process `pid` listens on (its socket inodes matched in `/proc/net/tcp`
/// and `tcp6`).
pub fn listening(pid: u32) -> Vec<std::net::SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, state 0A (LISTEN), inode
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                found.extend(parse_proc_addr(f[1]));
            }
        }
    }
    found
}

/// `0100007F:1F90` (little-endian words, as the kernel prints them) → `127.0.0.1:8080`.
fn parse_proc_addr(s: &str) -> Option<std::net::SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).map(u32::swap_bytes))
        .collect::<Result<_, _>>()
        .ok()?;
    let ip: std::net::IpAddr = match words[..] {
        [a] => std::net::Ipv4Addr::from(a).into(),
        [a, b, c, d] => {
            let bits = (u128::from(a) << 96)
                | (u128::from(b) << 64)
                | (u128::from(c) << 32)
                | u128::from(d);
            std::net::Ipv6Addr::from(bits).into()
        }
        _ => return None,
    };
    Some((ip, port).into())
}
