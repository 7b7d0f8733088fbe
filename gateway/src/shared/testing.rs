//! For the unit tests of the layers over the shared state: a [`Shared`] whose Redis never
//! answers (nothing listens on port 1), so every decision goes by `fail`.

use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::policy::{Policy, SharedFail, UpstreamKind};

/// A policy with `[shared]` on an unreachable Redis, an `openai` upstream (a shared ceiling),
/// `active_max` 4 and 2 expected replicas.
pub fn unreachable_policy(fail: SharedFail) -> Policy {
    let mut p = Policy::default();
    p.upstream.kind = UpstreamKind::Openai;
    p.upstream.urls = vec!["http://127.0.0.1:9".into()];
    p.admission.active_max = 4;
    p.shared.redis_url = Some("redis://127.0.0.1:1".into());
    p.shared.fail = fail;
    p.shared.expected_replicas = 2;
    p
}

/// The shared state of [`unreachable_policy`] (down from the start: never connected).
pub fn unreachable(fail: SharedFail) -> Arc<Shared> {
    Shared::start(&unreachable_policy(fail))
        .expect("a valid URL")
        .expect("[shared] on")
}

/// Makes `shared` remember that `tenant`'s bucket of `per_second` and `burst` refuses for
/// `wait` (as an arrival's script would have said).
pub fn refused(shared: &Shared, tenant: &str, per_second: f64, burst: u32, wait: Duration) {
    let rate = super::Rate::new(per_second, burst);
    shared
        .refusals
        .note(tenant, rate, tokio::time::Instant::now() + wait);
}

/// A `redis-server` of the test's own on a free loopback port (`--save '' --appendonly no`),
/// killed when dropped. `None` (and a note) when none is installed, unless
/// `SLUICE_REQUIRE_REDIS=1`, which makes that a failure (as in `tests/e2e/shared.rs`).
pub struct RealRedis {
    child: std::process::Child,
    port: u16,
}

impl RealRedis {
    pub async fn start() -> Option<Self> {
        let bin = ["/usr/bin/redis-server", "/usr/local/bin/redis-server"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.exists());
        let Some(bin) = bin else {
            assert!(
                std::env::var("SLUICE_REQUIRE_REDIS").as_deref() != Ok("1"),
                "SLUICE_REQUIRE_REDIS=1 but redis-server is not installed"
            );
            eprintln!("redis-server not installed: skipping");
            return None;
        };
        // A port found free may be taken by another test before redis-server binds it: then
        // the server exits, and another port is tried.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            if let Some(redis) = Self::start_on(&bin, port).await {
                return Some(redis);
            }
        }
        panic!("redis-server did not start on any of five free ports");
    }

    /// Starts one on `port`: `None` when it exits before answering `PING` (the port was taken).
    async fn start_on(bin: &std::path::Path, port: u16) -> Option<Self> {
        let child = std::process::Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start redis-server");
        let mut redis = Self { child, port };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if matches!(redis.child.try_wait(), Ok(Some(_))) {
                return None;
            }
            let client = redis::Client::open(redis.url()).expect("redis url");
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING").query_async::<()>(&mut c).await.is_ok()
                    && matches!(redis.child.try_wait(), Ok(None))
                {
                    return Some(redis);
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server on port {port} did not answer PING"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A connection of the test's own, to look inside (or to pause Redis).
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis")
    }

    /// [`unreachable_policy`] on this Redis under `prefix`, with a bound no call of a loaded
    /// machine reaches and leases that outlast the test.
    pub fn policy(&self, prefix: &str) -> Policy {
        let mut p = unreachable_policy(SharedFail::Local);
        p.shared.redis_url = Some(self.url());
        p.shared.prefix = prefix.into();
        p.shared.timeout = Duration::from_secs(2);
        p.shared.lease_ttl = Duration::from_secs(60);
        p
    }
}

impl Drop for RealRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
