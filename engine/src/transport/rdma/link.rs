//! [`RdmaTransport`]: the [`Transport`] over a connected queue pair, with its TCP link beside it.
//!
//! Sending: a message is framed exactly as on TCP (`frame`), then cut into fragments of at most
//! the peer's slot size less an 8-byte fragment header, each posted as one SEND. A fragment goes
//! out only when this side holds a credit (a receive slot the peer has posted and this side
//! has not used) and a free send slot (one whose last send completed): a slow peer makes the
//! sender wait, and its slots are never written twice. A sender that waits longer than the
//! heartbeat timeout for a credit reports the peer hung. Whole messages go out one at a time.
//!
//! Receiving: a poller thread takes completions off the queue: a finished send frees its
//! slot; a received fragment is copied out of its slot, the slot is posted again at once, and
//! the credit goes back to the peer over TCP at the end of each batch of completions (RDMA
//! credits cannot ride the queue pair: each message there takes a receive of its own). The
//! fragments of a message are joined and decoded; `recv` returns the message.
//!
//! Liveness: the TCP link's heartbeats (`peer_status`, and a peer silent past the timeout);
//! a failed work request (the peer's queue pair is gone: retries exhausted) or a closed TCP
//! link takes the whole link down, and every later call fails with the first reason.
//!
//! Fragment header (8 bytes): `seq` u32 LE (counts fragments from 0, wrapping), `flags` u8
//! (bit 0: last fragment of its message), 3 bytes zero.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::verbs::{Completion, QpInfo, Verbs};
use crate::error::{Error, Result};
use crate::transport::frame;
use crate::transport::message::{Message, RankStatus, RdmaControl};
use crate::transport::Transport;

/// Bytes of the fragment header at the start of every slot.
pub const FRAGMENT_HEADER: usize = 8;
const LAST: u8 = 1;
/// The smallest slot either side accepts: a header and some payload.
pub const MIN_SLOT_BYTES: u32 = 64;
/// How long the poller waits for completions before it checks whether the link is closing.
const POLL_WAIT: Duration = Duration::from_millis(20);

type Incoming = Result<(Message, Vec<u8>)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Send slots and credits.
#[derive(Debug)]
struct Window {
    /// Receives the peer has posted that this side may use.
    credits: u32,
    /// Send slots whose last send has completed.
    free: Vec<usize>,
}

struct Inner {
    verbs: Box<dyn Verbs>,
    control: Arc<dyn Transport>,
    peer: String,
    /// The largest send this side may post: the smaller of the peer's slot (what it can
    /// receive) and this side's own (what a send is copied into; ranks started by hand may
    /// be given different `--rdma-slot-bytes`).
    peer_slot_bytes: usize,
    window: Mutex<Window>,
    window_cv: Condvar,
    /// Serializes whole messages (their fragments stay together) and numbers fragments.
    sending: Mutex<u32>,
    down: Mutex<Option<Error>>,
    /// `close` was called here: `recv` fails at once (otherwise what arrived before the link
    /// went down is still returned first).
    closed: AtomicBool,
    timeout: Duration,
}

impl Inner {
    /// Records `reason` unless the link is already down, wakes every waiter, closes the TCP
    /// link (so the peer learns at once); returns the reason that stands.
    fn go_down(&self, reason: Error) -> Error {
        let stands = {
            let mut down = lock(&self.down);
            clone_error(down.get_or_insert(reason))
        };
        self.window_cv.notify_all();
        self.control.close();
        stands
    }

    fn current_down(&self) -> Option<Error> {
        lock(&self.down).as_ref().map(clone_error)
    }

    fn send(&self, msg: &Message, body: &[u8]) -> Result<()> {
        if let Some(e) = self.current_down() {
            return Err(e);
        }
        let mut bytes = Vec::with_capacity(256 + body.len());
        frame::write_frame(&mut bytes, msg, body).map_err(|e| Error::Transport(e.to_string()))?;
        let mut seq = lock(&self.sending);
        let per = self.peer_slot_bytes - FRAGMENT_HEADER;
        let n = bytes.len().div_ceil(per);
        for (i, chunk) in bytes.chunks(per).enumerate() {
            let slot = self.take_slot()?;
            let mut header = [0u8; FRAGMENT_HEADER];
            header[..4].copy_from_slice(&seq.to_le_bytes());
            header[4] = if i + 1 == n { LAST } else { 0 };
            if let Err(e) = self.verbs.post_send(slot, &[&header, chunk]) {
                return Err(self.go_down(e));
            }
            *seq = seq.wrapping_add(1);
        }
        Ok(())
    }

    /// A credit and a free send slot, waiting at most the heartbeat timeout for them.
    fn take_slot(&self) -> Result<usize> {
        let deadline = Instant::now() + self.timeout;
        let mut w = lock(&self.window);
        loop {
            if let Some(e) = self.current_down() {
                return Err(e);
            }
            if w.credits > 0 {
                if let Some(slot) = w.free.pop() {
                    w.credits -= 1;
                    return Ok(slot);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let why = if w.credits == 0 {
                    "granted no receive credit"
                } else {
                    "completed none of this side's sends"
                };
                drop(w);
                let e = Error::PeerGone {
                    peer: self.peer.clone(),
                    reason: format!(
                        "the peer {why} for {} ms (the heartbeat timeout): it is hung",
                        self.timeout.as_millis()
                    ),
                };
                return Err(self.go_down(e));
            }
            w = self
                .window_cv
                .wait_timeout(w, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Takes completions until the link goes down: frees send slots, joins fragments into
    /// messages, re-posts receives and returns their credits.
    fn poll_loop(&self, tx: &Sender<Incoming>) {
        let mut done = Vec::new();
        let mut message = Vec::new();
        let mut expect_seq = 0u32;
        loop {
            if self.current_down().is_some() {
                return;
            }
            done.clear();
            if let Err(e) = self.verbs.poll(&mut done, POLL_WAIT) {
                let _ = tx.send(Err(self.go_down(e)));
                return;
            }
            let mut credits = 0u32;
            for c in done.drain(..) {
                let step = match c {
                    Completion::Sent { slot } => {
                        lock(&self.window).free.push(slot);
                        self.window_cv.notify_all();
                        Ok(None)
                    }
                    Completion::Received { slot, len } => {
                        credits += 1;
                        self.take_fragment(slot, len, &mut expect_seq, &mut message)
                    }
                    Completion::Failed { reason } => Err(Error::PeerGone {
                        peer: self.peer.clone(),
                        reason: format!("an RDMA work request failed: {reason}"),
                    }),
                };
                match step {
                    Ok(Some(item)) => {
                        if tx.send(Ok(item)).is_err() {
                            return; // the transport is gone
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(Err(self.go_down(e)));
                        return;
                    }
                }
            }
            if credits > 0 {
                let grant = Message::Rdma(RdmaControl::Credit { slots: credits });
                if let Err(e) = self.control.send(&grant, &[]) {
                    let _ = tx.send(Err(self.go_down(e)));
                    return;
                }
            }
        }
    }

    /// Copies one fragment out of receive slot `slot`, posts the slot again, and returns the
    /// message it completes, if it is the last of one.
    fn take_fragment(
        &self,
        slot: usize,
        len: usize,
        expect_seq: &mut u32,
        message: &mut Vec<u8>,
    ) -> Result<Option<(Message, Vec<u8>)>> {
        let mut fragment = Vec::with_capacity(len);
        self.verbs.read_recv(slot, len, &mut fragment);
        self.verbs.post_recv(slot)?;
        let protocol =
            |what: String| Error::Transport(format!("bad fragment from {}: {what}", self.peer));
        let Some((header, payload)) = fragment.split_first_chunk::<FRAGMENT_HEADER>() else {
            return Err(protocol(format!("{len} bytes, shorter than its header")));
        };
        let seq = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if seq != *expect_seq {
            return Err(protocol(format!(
                "fragment {seq} where {} was due",
                *expect_seq
            )));
        }
        *expect_seq = seq.wrapping_add(1);
        message.extend_from_slice(payload);
        // Bounded by the frame it begins (its limits checked as soon as its fixed header is
        // in): a peer that never sets LAST grew this without end.
        if let Some(total) = frame::announced_len(message).map_err(|e| protocol(e.to_string()))? {
            if message.len() > total {
                return Err(protocol(format!(
                    "{} bytes of a {total}-byte frame",
                    message.len()
                )));
            }
        }
        if header[4] & LAST == 0 {
            return Ok(None);
        }
        let mut bytes = &message[..];
        let decoded = frame::read_frame(&mut bytes).map_err(|e| protocol(e.to_string()));
        let trailing = bytes.len();
        message.clear();
        let f = decoded?;
        if trailing > 0 {
            return Err(protocol(format!("{trailing} bytes after the frame")));
        }
        Ok(Some((f.message, f.body)))
    }

    /// Reads the TCP link: credits from the peer; anything else, or the link's end, takes the
    /// link down.
    fn control_loop(&self, tx: &Sender<Incoming>) {
        loop {
            let e = match self.control.recv() {
                Ok((Message::Rdma(RdmaControl::Credit { slots }), _)) => {
                    let mut w = lock(&self.window);
                    w.credits = w.credits.saturating_add(slots);
                    drop(w);
                    self.window_cv.notify_all();
                    continue;
                }
                Ok((other, _)) => Error::Transport(format!(
                    "bad message from {}: {} on the TCP side of an RDMA link",
                    self.peer,
                    frame::kind_name(frame::kind_of(&other))
                )),
                Err(e) => e,
            };
            let _ = tx.send(Err(self.go_down(e)));
            return;
        }
    }
}

/// `Error` is not `Clone` (it holds `io::Error`s); a link's stored reason is always one of
/// these text variants, and anything else keeps its text.
fn clone_error(e: &Error) -> Error {
    match e {
        Error::PeerGone { peer, reason } => Error::PeerGone {
            peer: peer.clone(),
            reason: reason.clone(),
        },
        Error::Transport(s) => Error::Transport(s.clone()),
        other => Error::Transport(other.to_string()),
    }
}

/// A [`Transport`] over an RDMA queue pair, made by [`upgrade`]. Dropping it closes the link.
pub struct RdmaTransport {
    inner: Arc<Inner>,
    rx: Mutex<Receiver<Incoming>>,
}

impl fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("peer", &self.inner.peer)
            .field("local", &self.inner.verbs.local())
            .field("down", &self.inner.current_down())
            .finish()
    }
}

/// Turns `control`, a data link whose handshake is done, into an RDMA link over `verbs`:
/// posts every receive slot, exchanges queue pairs over `control`, connects, and waits for the
/// peer to have connected too. Both sides call it. `timeout` is the heartbeat timeout (how
/// long a send may wait for the peer's credit).
///
/// # Errors
///
/// The peer answered something else, its queue pair is unusable (no slots, slots too small),
/// or a verb failed; `control` is closed.
pub fn upgrade(
    control: Arc<dyn Transport>,
    verbs: Box<dyn Verbs>,
    timeout: Duration,
) -> Result<Arc<RdmaTransport>> {
    let result = connect(&*control, &*verbs);
    let remote = match result {
        Ok(r) => r,
        Err(e) => {
            control.close();
            return Err(e);
        }
    };
    let local = verbs.local();
    let peer = control.peer_addr();
    let inner = Arc::new(Inner {
        verbs,
        control,
        peer: peer.clone(),
        peer_slot_bytes: (remote.slot_bytes as usize).min(local.slot_bytes as usize),
        window: Mutex::new(Window {
            credits: remote.slots,
            free: (0..local.slots as usize).rev().collect(),
        }),
        window_cv: Condvar::new(),
        sending: Mutex::new(0),
        down: Mutex::new(None),
        closed: AtomicBool::new(false),
        timeout,
    });
    let (tx, rx) = mpsc::channel();
    let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
        thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(|e| Error::Transport(format!("cannot spawn an RDMA link thread: {e}")))
    };
    let (poller, tx_poll) = (inner.clone(), tx.clone());
    spawn(
        format!("sluice-rdma {peer}"),
        Box::new(move || poller.poll_loop(&tx_poll)),
    )?;
    let reader = inner.clone();
    spawn(
        format!("sluice-rdma-tcp {peer}"),
        Box::new(move || reader.control_loop(&tx)),
    )?;
    tracing::info!(peer = %peer, qpn = local.qpn, remote_qpn = remote.qpn, "RDMA link up");
    Ok(Arc::new(RdmaTransport {
        inner,
        rx: Mutex::new(rx),
    }))
}

/// The queue-pair exchange: post receives, send ours, read theirs, connect, and agree that
/// both are connected. Returns the peer's queue pair.
fn connect(control: &dyn Transport, verbs: &dyn Verbs) -> Result<QpInfo> {
    let local = verbs.local();
    for slot in 0..local.slots as usize {
        verbs.post_recv(slot)?;
    }
    control.send(&Message::Rdma(RdmaControl::QueuePair(local)), &[])?;
    let peer = control.peer_addr();
    let unexpected = |what: &str, got: &Message| {
        Error::Transport(format!(
            "RDMA set-up with {peer}: expected {what}, got {}",
            frame::kind_name(frame::kind_of(got))
        ))
    };
    let remote = match control.recv()? {
        (Message::Rdma(RdmaControl::QueuePair(q)), _) => q,
        (Message::Refused { reason } | Message::Fatal { reason }, _) => {
            return Err(Error::HandshakeRefused(reason))
        }
        (other, _) => return Err(unexpected("its queue pair", &other)),
    };
    if remote.slots == 0 || remote.slot_bytes < MIN_SLOT_BYTES {
        let reason = format!(
            "the peer's queue pair has {} slots of {} bytes (at least 1 of {MIN_SLOT_BYTES} needed)",
            remote.slots, remote.slot_bytes
        );
        let _ = control.send(
            &Message::Refused {
                reason: reason.clone(),
            },
            &[],
        );
        // Wait for the peer's next word (its `Connected`) before closing: a close with that
        // still to arrive resets the connection, and the peer would lose the refusal.
        let _ = control.recv();
        return Err(Error::Transport(reason));
    }
    verbs.connect(&remote)?;
    control.send(&Message::Rdma(RdmaControl::Connected), &[])?;
    match control.recv()? {
        (Message::Rdma(RdmaControl::Connected), _) => Ok(remote),
        (Message::Refused { reason } | Message::Fatal { reason }, _) => {
            Err(Error::HandshakeRefused(reason))
        }
        (other, _) => Err(unexpected("Connected", &other)),
    }
}

impl Transport for RdmaTransport {
    fn send(&self, msg: &Message, body: &[u8]) -> Result<()> {
        self.inner.send(msg, body)
    }

    fn recv(&self) -> Result<(Message, Vec<u8>)> {
        if self.inner.closed.load(Ordering::SeqCst) {
            if let Some(e) = self.inner.current_down() {
                return Err(e);
            }
        }
        let rx = lock(&self.rx);
        match rx.recv() {
            Ok(item) => item,
            Err(_) => Err(self
                .inner
                .current_down()
                .unwrap_or_else(|| Error::Transport("the RDMA link's threads stopped".into()))),
        }
    }

    fn peer_status(&self) -> (Option<RankStatus>, Duration) {
        self.inner.control.peer_status()
    }

    fn peer_addr(&self) -> String {
        self.inner.peer.clone()
    }

    fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let peer = self.inner.peer.clone();
        self.inner.go_down(Error::Transport(format!(
            "link to {peer} was closed by this side"
        )));
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.close();
    }
}
