//! [`Transport`] over TCP: blocking I/O, `TCP_NODELAY`, a reader thread that takes heartbeats out
//! of the stream and queues everything else for `recv`, a heartbeat thread, and writes behind a
//! mutex through a `BufWriter` flushed after every message.
//!
//! Liveness: both directions of the socket get a timeout equal to the heartbeat timeout
//! (`SO_RCVTIMEO` / `SO_SNDTIMEO`). The reader thread is always reading, so a read that waits that
//! long means the peer sent nothing at all, not even a heartbeat: the link goes down and `recv`
//! says so. A write that waits that long means the peer stopped draining its socket (a hung
//! process): the link goes down too. End of stream and resets are reported at once. Once a link is
//! down it stays down; every later call fails with the first reason.
//!
//! Flow control: the queue between the reader thread and `recv` is unbounded, so a peer is never
//! held up (and heartbeats never starve) because this side is slow to call `recv`; callers bound
//! what is in flight (rank 0 caps the micro-batches in the pipeline).

use std::fmt;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::frame::{self, FrameError};
use super::handshake::{self, Expected};
use super::message::{Hello, Message, RankStatus};
use super::Transport;
use crate::error::{Error, Result};

/// Where a rank's heartbeats get the status they carry; called once per heartbeat, from the
/// link's heartbeat thread, so it should be quick (read a few counters).
pub type StatusSource = Arc<dyn Fn() -> Option<RankStatus> + Send + Sync>;

/// Heartbeat settings of a link.
#[derive(Clone)]
pub struct LinkConfig {
    /// How often this side sends a heartbeat (default 500 ms).
    pub heartbeat_interval: Duration,
    /// How long this side waits without hearing anything before it reports the peer gone
    /// (default 2 s). Must exceed the *peer's* interval; both sides normally use the same values.
    pub heartbeat_timeout: Duration,
    /// The status sent with each heartbeat (default: none). Called from the heartbeat thread
    /// every interval: keep it quick and don't let it panic (a panic stops this side's
    /// heartbeats, and the peer then reports the link down).
    pub status: StatusSource,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(2),
            status: Arc::new(|| None),
        }
    }
}

impl fmt::Debug for LinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkConfig")
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("heartbeat_timeout", &self.heartbeat_timeout)
            .finish_non_exhaustive()
    }
}

impl LinkConfig {
    /// This config with heartbeats carrying `status()`.
    pub fn with_status(
        mut self,
        status: impl Fn() -> Option<RankStatus> + Send + Sync + 'static,
    ) -> Self {
        self.status = Arc::new(status);
        self
    }

    /// This config with the given interval and timeout.
    pub fn with_heartbeat(mut self, interval: Duration, timeout: Duration) -> Self {
        self.heartbeat_interval = interval;
        self.heartbeat_timeout = timeout;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval >= self.heartbeat_timeout {
            return Err(Error::Transport(format!(
                "heartbeat interval {:?} must be above zero and below the heartbeat timeout {:?}",
                self.heartbeat_interval, self.heartbeat_timeout
            )));
        }
        Ok(())
    }
}

/// What was last heard from the peer.
#[derive(Clone, Debug)]
pub(crate) struct Heard {
    pub(crate) at: Instant,
    pub(crate) status: Option<RankStatus>,
}

/// Why a link went down (the first reason sticks).
#[derive(Clone, Debug)]
enum Down {
    /// `close` was called on this side (or the transport was dropped).
    Local,
    /// The peer closed, reset, or fell silent.
    PeerGone(String),
    /// The peer sent bytes that are not a valid frame.
    Protocol(String),
}

impl Down {
    fn to_error(&self, peer: &str) -> Error {
        match self {
            Down::Local => Error::Transport(format!("link to {peer} was closed by this side")),
            Down::PeerGone(reason) => Error::PeerGone {
                peer: peer.to_string(),
                reason: reason.clone(),
            },
            Down::Protocol(reason) => Error::Transport(format!("bad frame from {peer}: {reason}")),
        }
    }
}

type Incoming = Result<(Message, Vec<u8>)>;

struct Inner {
    peer: String,
    /// A handle on the socket for `shutdown` (the reader thread owns a clone for reading).
    stream: TcpStream,
    writer: Mutex<BufWriter<TcpStream>>,
    heard: Mutex<Heard>,
    down: Mutex<Option<Down>>,
    closed: AtomicBool,
    stop: Mutex<bool>,
    stop_cv: Condvar,
    timeout: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

impl Inner {
    /// Records `reason` unless the link is already down; returns the reason that stands.
    fn go_down(&self, reason: Down) -> Down {
        let mut down = lock(&self.down);
        let stands = down.get_or_insert(reason).clone();
        drop(down);
        {
            let mut stop = lock(&self.stop);
            *stop = true;
            self.stop_cv.notify_all();
        }
        // Wakes the reader thread (and tells the peer) whatever the reason.
        let _ = self.stream.shutdown(Shutdown::Both);
        stands
    }

    fn current_down(&self) -> Option<Down> {
        lock(&self.down).clone()
    }

    fn classify_read(&self, e: FrameError) -> Down {
        if self.closed.load(Ordering::SeqCst) {
            return Down::Local;
        }
        match e {
            FrameError::Closed => Down::PeerGone("the peer closed the connection".into()),
            e @ FrameError::Truncated { .. } => {
                Down::PeerGone(format!("the connection ended inside a frame ({e})"))
            }
            FrameError::Io(e) => Down::PeerGone(match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                    "nothing heard for {} (the heartbeat timeout): the peer is hung or unreachable",
                    fmt_duration(self.timeout)
                ),
                io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                    "the connection was reset (the peer process died or closed abruptly)".into()
                }
                _ => format!("read failed: {e}"),
            }),
            FrameError::Invalid(s) => Down::Protocol(s),
        }
    }

    fn classify_write(&self, e: FrameError) -> Down {
        if self.closed.load(Ordering::SeqCst) {
            return Down::Local;
        }
        match e {
            FrameError::Io(e) => Down::PeerGone(match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                    "the peer took no data for {} (the heartbeat timeout): it is hung or unreachable",
                    fmt_duration(self.timeout)
                ),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                    "the connection was reset (the peer process died or closed the link)".into()
                }
                _ => format!("write failed: {e}"),
            }),
            other => Down::PeerGone(format!("write failed: {other}")),
        }
    }

    fn send(&self, msg: &Message, body: &[u8]) -> Result<()> {
        if let Some(down) = self.current_down() {
            return Err(down.to_error(&self.peer));
        }
        let mut w = lock(&self.writer);
        // `write_frame` validates (body only on Forward, limits) before writing a byte, so an
        // `Invalid` error leaves the stream intact; any other error may leave half a frame.
        match frame::write_frame(&mut *w, msg, body)
            .and_then(|()| w.flush().map_err(FrameError::Io))
        {
            Ok(()) => Ok(()),
            Err(FrameError::Invalid(s)) => Err(Error::Transport(s)),
            Err(e) => {
                drop(w);
                let down = self.classify_write(e);
                Err(self.go_down(down).to_error(&self.peer))
            }
        }
    }

    fn reader_loop(&self, stream: TcpStream, tx: Sender<Incoming>) {
        let mut r = BufReader::with_capacity(64 << 10, stream);
        loop {
            match frame::read_frame(&mut r) {
                Ok(f) => {
                    let mut heard = lock(&self.heard);
                    heard.at = Instant::now();
                    match f.message {
                        Message::Heartbeat(status) => heard.status = status,
                        msg => {
                            drop(heard);
                            if tx.send(Ok((msg, f.body))).is_err() {
                                return; // the transport is gone
                            }
                        }
                    }
                }
                Err(e) => {
                    let down = self.classify_read(e);
                    let down = self.go_down(down);
                    // The caller hears of it through `recv` and decides how loud to be.
                    match &down {
                        Down::Protocol(_) => {
                            tracing::warn!(peer = %self.peer, "link down: {}", down.to_error(&self.peer))
                        }
                        _ => {
                            tracing::debug!(peer = %self.peer, "link down: {}", down.to_error(&self.peer))
                        }
                    }
                    let _ = tx.send(Err(down.to_error(&self.peer)));
                    return;
                }
            }
        }
    }

    fn heartbeat_loop(&self, interval: Duration, status: &StatusSource) {
        loop {
            if *lock(&self.stop) {
                return;
            }
            if self.send(&Message::Heartbeat(status()), &[]).is_err() {
                return;
            }
            let stop = lock(&self.stop);
            let (stop, _) = self
                .stop_cv
                .wait_timeout_while(stop, interval, |stop| !*stop)
                .unwrap_or_else(PoisonError::into_inner);
            if *stop {
                return;
            }
        }
    }
}

/// A [`Transport`] over one TCP connection, made by [`RankListener::accept`] or
/// [`handshake::dial`] once the handshake has succeeded. Dropping it closes the link.
pub struct TcpTransport {
    inner: Arc<Inner>,
    rx: Mutex<Receiver<Incoming>>,
    local: Option<SocketAddr>,
}

impl fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpTransport")
            .field("peer", &self.inner.peer)
            .field("local", &self.local)
            .field("down", &self.inner.current_down())
            .finish()
    }
}

impl TcpTransport {
    /// Starts the link on a stream whose handshake is done: sets the socket options, and spawns
    /// the reader and heartbeat threads. `first`, if any, is what `recv` returns first (the
    /// handshake answer on the dialer's side).
    pub(crate) fn start(
        stream: TcpStream,
        config: &LinkConfig,
        first: Option<Message>,
        heard: Heard,
    ) -> Result<Arc<Self>> {
        config.validate()?;
        let io_err = |what: &str, e: io::Error| Error::Transport(format!("{what}: {e}"));
        let peer = stream
            .peer_addr()
            .map_err(|e| io_err("peer address", e))?
            .to_string();
        let local = stream.local_addr().ok();
        stream
            .set_nodelay(true)
            .map_err(|e| io_err("TCP_NODELAY", e))?;
        stream
            .set_read_timeout(Some(config.heartbeat_timeout))
            .map_err(|e| io_err("read timeout", e))?;
        stream
            .set_write_timeout(Some(config.heartbeat_timeout))
            .map_err(|e| io_err("write timeout", e))?;
        let reader = stream.try_clone().map_err(|e| io_err("socket clone", e))?;
        let writer = stream.try_clone().map_err(|e| io_err("socket clone", e))?;
        let inner = Arc::new(Inner {
            peer: peer.clone(),
            stream,
            writer: Mutex::new(BufWriter::with_capacity(64 << 10, writer)),
            heard: Mutex::new(heard),
            down: Mutex::new(None),
            closed: AtomicBool::new(false),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            timeout: config.heartbeat_timeout,
        });
        let (tx, rx) = mpsc::channel();
        if let Some(msg) = first {
            let _ = tx.send(Ok((msg, Vec::new())));
        }
        let transport = Arc::new(TcpTransport {
            inner: inner.clone(),
            rx: Mutex::new(rx),
            local,
        });

        let spawn_err = |e: io::Error| Error::Transport(format!("cannot spawn a link thread: {e}"));
        let r_inner = inner.clone();
        thread::Builder::new()
            .name(format!("sluice-rx {peer}"))
            .spawn(move || r_inner.reader_loop(reader, tx))
            .map_err(spawn_err)?;
        let (interval, status) = (config.heartbeat_interval, config.status.clone());
        thread::Builder::new()
            .name(format!("sluice-hb {peer}"))
            .spawn(move || inner.heartbeat_loop(interval, &status))
            .map_err(spawn_err)?;
        Ok(transport)
    }

    /// This side's address of the connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }
}

impl Transport for TcpTransport {
    fn send(&self, msg: &Message, body: &[u8]) -> Result<()> {
        self.inner.send(msg, body)
    }

    fn recv(&self) -> Result<(Message, Vec<u8>)> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Down::Local.to_error(&self.inner.peer));
        }
        let rx = lock(&self.rx);
        match rx.recv() {
            Ok(item) => item,
            // The reader thread has exited after queueing its error, which an earlier call took.
            Err(_) => Err(self
                .inner
                .current_down()
                .unwrap_or(Down::Local)
                .to_error(&self.inner.peer)),
        }
    }

    fn peer_status(&self) -> (Option<RankStatus>, Duration) {
        let heard = lock(&self.inner.heard);
        (heard.status.clone(), heard.at.elapsed())
    }

    fn peer_addr(&self) -> String {
        self.inner.peer.clone()
    }

    fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.go_down(Down::Local);
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.close();
    }
}

/// A listening socket for links from other ranks.
#[derive(Debug)]
pub struct RankListener {
    listener: TcpListener,
    link: LinkConfig,
    handshake_timeout: Duration,
}

impl RankListener {
    /// Listens on `addr` (`host:port`; port 0 picks a free one) with default link settings and a
    /// 10 s handshake timeout.
    pub fn bind(addr: &str) -> Result<Self> {
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| Error::Transport(format!("cannot resolve listen address {addr}: {e}")))?
            .collect();
        let listener = TcpListener::bind(&addrs[..])
            .map_err(|e| Error::Transport(format!("cannot listen on {addr}: {e}")))?;
        Ok(RankListener {
            listener,
            link: LinkConfig::default(),
            handshake_timeout: Duration::from_secs(10),
        })
    }

    /// Uses `link` for the links this listener accepts.
    pub fn with_link_config(mut self, link: LinkConfig) -> Self {
        self.link = link;
        self
    }

    /// How long a connecting peer gets to complete its side of the handshake.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// The address actually bound (with the port chosen when binding port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::Transport(format!("listener address: {e}")))
    }

    /// Waits for the next connection and runs the listener's side of the handshake against
    /// `expect`. On success the link is up and heartbeating: on a data link `Ready{rank}` has
    /// already been sent; on a control link the caller answers `Welcome{..}` (or `Refused`).
    ///
    /// An error concerns that one connection (refused with [`Error::HandshakeRefused`], or a
    /// peer that failed mid-handshake); the listener stays usable, so callers that wait for a
    /// given peer log the error and accept again.
    pub fn accept(&self, expect: &Expected) -> Result<(Arc<TcpTransport>, Hello)> {
        self.link.validate()?;
        let (stream, from) = self
            .listener
            .accept()
            .map_err(|e| Error::Transport(format!("accept failed: {e}")))?;
        let hello =
            handshake::listen_side(&stream, expect, self.handshake_timeout).inspect_err(|e| {
                tracing::warn!(peer = %from, "handshake failed: {e}");
            })?;
        let heard = Heard {
            at: Instant::now(),
            status: None,
        };
        let transport = TcpTransport::start(stream, &self.link, None, heard)?;
        tracing::info!(peer = %from, role = ?hello.role, rank = hello.rank, "rank link accepted");
        Ok((transport, hello))
    }
}
