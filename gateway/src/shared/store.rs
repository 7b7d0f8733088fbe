//! The connection to Redis: one multiplexed connection for every call, a probe that
//! reconnects while Redis is away, and the subscription that wakes local waiters when a slot
//! of the shared ceiling frees.

use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, FromRedisValue, ScriptInvocation};
use tokio::sync::Notify;

use super::health::{Health, Unavailable};

/// How often a down state is probed (a new connection and a `PING`, each within the bound).
pub const PROBE_DOWN: Duration = Duration::from_millis(250);
/// How often an up state is checked with a `PING` when nothing else used it.
pub const PROBE_UP: Duration = Duration::from_secs(1);

/// The client, its connection and the health of both.
#[derive(Debug)]
pub struct Store {
    client: Client,
    conn: RwLock<Option<MultiplexedConnection>>,
    pub health: Health,
}

impl Store {
    pub fn new(client: Client, health: Health) -> Self {
        Self {
            client,
            conn: RwLock::new(None),
            health,
        }
    }

    fn connection(&self) -> Option<MultiplexedConnection> {
        self.conn.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_connection(&self, c: Option<MultiplexedConnection>) {
        *self.conn.write().unwrap_or_else(|e| e.into_inner()) = c;
    }

    /// Runs a script within the bound; a failure drops the connection for the probe to renew.
    pub async fn script<T: FromRedisValue>(
        &self,
        op: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Unavailable> {
        let Some(mut conn) = self.connection().filter(|_| self.health.is_up()) else {
            return Err(Unavailable(self.health.why()));
        };
        let r = self
            .health
            .bounded(op, invocation.invoke_async(&mut conn))
            .await;
        if r.is_err() {
            self.set_connection(None);
        }
        r
    }

    /// One command within the bound (as [`Self::script`]).
    pub async fn command<T: FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T, Unavailable> {
        let Some(mut conn) = self.connection().filter(|_| self.health.is_up()) else {
            return Err(Unavailable(self.health.why()));
        };
        let r = self.health.bounded(op, cmd.query_async(&mut conn)).await;
        if r.is_err() {
            self.set_connection(None);
        }
        r
    }

    /// A fresh connection answering `PING` within the bound.
    async fn connect(&self) -> Result<MultiplexedConnection, String> {
        let bound = self.health.timeout();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(bound))
            .set_response_timeout(Some(bound));
        let attempt = async {
            let mut conn = self
                .client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok::<_, redis::RedisError>(conn)
        };
        match tokio::time::timeout(bound, attempt).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {bound:?} (shared.timeout)")),
        }
    }

    /// Keeps the connection: reconnects while down, pings while up. Ends with the store.
    pub fn spawn_probe(self: &Arc<Self>) {
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut reported = false;
            while let Some(s) = store.upgrade() {
                let pause = if s.health.is_up() && s.connection().is_some() {
                    let ping = redis::cmd("PING");
                    let _ = s.command::<()>("ping", &ping).await;
                    PROBE_UP
                } else {
                    match s.connect().await {
                        Ok(c) => {
                            s.set_connection(Some(c));
                            s.health.recovered();
                            reported = false;
                        }
                        Err(why) => {
                            if !reported {
                                // The first failure of a run is logged (through `failed`).
                                reported = true;
                                if s.health.is_up() {
                                    let _ = s.health.failed("connect", why);
                                } else {
                                    tracing::warn!(reason = %why, "shared state: cannot reach Redis yet");
                                }
                            }
                        }
                    }
                    PROBE_DOWN
                };
                drop(s);
                tokio::time::sleep(pause).await;
            }
        });
    }

    /// Subscribes to `channel` while the state is up and wakes every waiter of `freed` on each
    /// message (and whenever the state changes). Ends with the store.
    pub fn spawn_subscriber(self: &Arc<Self>, channel: String, freed: Arc<Notify>) {
        let store: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(s) = store.upgrade() else { return };
                let mut changes = s.health.subscribe();
                let (up, bound, client) = (s.health.is_up(), s.health.timeout(), s.client.clone());
                // Nothing below holds the store: when it goes, `changes` ends and so does this.
                drop(s);
                if up {
                    if let Ok(Ok(mut pubsub)) =
                        tokio::time::timeout(bound, client.get_async_pubsub()).await
                    {
                        if pubsub.subscribe(&channel).await.is_ok() {
                            let mut stream = pubsub.on_message();
                            loop {
                                tokio::select! {
                                    m = stream.next() => match m {
                                        Some(_) => freed.notify_waiters(),
                                        None => break,
                                    },
                                    c = changes.changed() => {
                                        freed.notify_waiters();
                                        if c.is_err() || !*changes.borrow_and_update() {
                                            break;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                tokio::select! {
                    c = changes.changed() => {
                        freed.notify_waiters();
                        if c.is_err() {
                            return;
                        }
                    }
                    () = tokio::time::sleep(PROBE_DOWN) => {}
                }
            }
        });
    }
}
