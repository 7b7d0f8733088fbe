//! A fake fabric for the RDMA link's tests: in-process queue pairs with the rules of a
//! reliable-connected one. A send lands whole in the oldest receive the peer has posted, in
//! order; a send with no receive posted fails the sender's queue pair (an exhausted RNR retry),
//! as does a send to a queue pair that is gone (an exhausted transport retry); a connect must
//! name the LID, GID and PSN its queue pair announced (if that queue pair still exists). Nothing can land in a
//! slot that is not posted, so a link whose flow control is wrong fails here, loudly.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::verbs::{gather, gathered_len, Completion, QpInfo, RdmaConfig, Verbs};
use crate::error::{Error, Result};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every live queue pair, by number.
fn fabric() -> &'static Mutex<HashMap<u32, Weak<Qp>>> {
    static FABRIC: OnceLock<Mutex<HashMap<u32, Weak<Qp>>>> = OnceLock::new();
    FABRIC.get_or_init(Mutex::default)
}

#[derive(Debug, Default)]
struct State {
    posted: VecDeque<usize>,
    completions: VecDeque<Completion>,
    peer: Option<Weak<Qp>>,
    failed: bool,
}

#[derive(Debug)]
struct Qp {
    info: QpInfo,
    send: Mutex<Vec<u8>>,
    recv: Mutex<Vec<u8>>,
    state: Mutex<State>,
    cv: Condvar,
}

impl Qp {
    fn complete(&self, c: Completion) {
        let mut st = lock(&self.state);
        if matches!(c, Completion::Failed { .. }) {
            st.failed = true;
        }
        st.completions.push_back(c);
        drop(st);
        self.cv.notify_all();
    }
}

/// One side's queue pair on the fake fabric.
#[derive(Debug)]
pub struct Loopback {
    qp: Arc<Qp>,
    /// While set, `poll` finds nothing: a rank too busy (or hung) to take its completions.
    paused: Arc<AtomicBool>,
}

impl Loopback {
    pub fn new(cfg: &RdmaConfig) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0x100);
        let qpn = NEXT.fetch_add(1, Ordering::Relaxed);
        let bytes = cfg.slots as usize * cfg.slot_bytes as usize;
        let qp = Arc::new(Qp {
            info: QpInfo {
                lid: 7,
                gid: Some(format!("fe80000000000000{qpn:016x}")),
                qpn,
                psn: qpn.wrapping_mul(2_654_435_761) & 0xff_ffff,
                slots: cfg.slots,
                slot_bytes: cfg.slot_bytes,
            },
            send: Mutex::new(vec![0; bytes]),
            recv: Mutex::new(vec![0; bytes]),
            state: Mutex::default(),
            cv: Condvar::new(),
        });
        lock(fabric()).insert(qpn, Arc::downgrade(&qp));
        Self {
            qp,
            paused: Arc::default(),
        }
    }

    /// A switch that stops (true) and restarts (false) this side's completions.
    pub fn pause_switch(&self) -> Arc<AtomicBool> {
        self.paused.clone()
    }

    fn range(&self, slot: usize, len: usize) -> Result<std::ops::Range<usize>> {
        let sb = self.qp.info.slot_bytes as usize;
        if slot >= self.qp.info.slots as usize || len > sb {
            return Err(Error::Transport(format!(
                "fake verbs: slot {slot} / {len} bytes outside {} slots of {sb}",
                self.qp.info.slots
            )));
        }
        Ok(slot * sb..slot * sb + len)
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        lock(fabric()).remove(&self.qp.info.qpn);
    }
}

impl Verbs for Loopback {
    fn local(&self) -> QpInfo {
        self.qp.info.clone()
    }

    fn connect(&self, remote: &QpInfo) -> Result<()> {
        let peer = lock(fabric()).get(&remote.qpn).and_then(Weak::upgrade);
        let Some(peer) = peer else {
            // As on hardware, connecting needs nothing from the peer: sends fail later.
            lock(&self.qp.state).peer = Some(Weak::new());
            return Ok(());
        };
        let i = &peer.info;
        if (i.lid, &i.gid, i.psn) != (remote.lid, &remote.gid, remote.psn) {
            return Err(Error::Transport(format!(
                "fake verbs: queue pair {} is at lid {} gid {:?} psn {}, not {remote:?}",
                i.qpn, i.lid, i.gid, i.psn
            )));
        }
        lock(&self.qp.state).peer = Some(Arc::downgrade(&peer));
        Ok(())
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        self.range(slot, 0)?;
        let mut st = lock(&self.qp.state);
        if st.posted.contains(&slot) {
            return Err(Error::Transport(format!(
                "fake verbs: receive slot {slot} posted twice"
            )));
        }
        st.posted.push_back(slot);
        Ok(())
    }

    fn post_send(&self, slot: usize, parts: &[&[u8]]) -> Result<()> {
        let len = gathered_len(parts);
        let range = self.range(slot, len)?;
        gather(&mut lock(&self.qp.send)[range.clone()], parts);
        let peer = {
            let st = lock(&self.qp.state);
            if st.failed {
                return Err(Error::Transport("fake verbs: queue pair in error".into()));
            }
            match &st.peer {
                Some(p) => p.upgrade(),
                None => {
                    return Err(Error::Transport(
                        "fake verbs: send on a queue pair that is not connected".into(),
                    ))
                }
            }
        };
        let Some(peer) = peer else {
            self.qp.complete(Completion::Failed {
                reason: "transport retry counter exceeded (the peer's queue pair is gone)".into(),
            });
            return Ok(());
        };
        let landed = {
            let mut st = lock(&peer.state);
            st.posted.pop_front()
        };
        let Some(to) = landed else {
            self.qp.complete(Completion::Failed {
                reason: "RNR retry counter exceeded (the peer had no receive posted)".into(),
            });
            return Ok(());
        };
        let sb = peer.info.slot_bytes as usize;
        if len > sb {
            self.qp.complete(Completion::Failed {
                reason: format!("remote length error: {len} bytes into a {sb}-byte slot"),
            });
            return Ok(());
        }
        // The send buffer, not the caller's slice: what was posted is what lands.
        let sent = lock(&self.qp.send)[range].to_vec();
        lock(&peer.recv)[to * sb..to * sb + sent.len()].copy_from_slice(&sent);
        peer.complete(Completion::Received {
            slot: to,
            len: sent.len(),
        });
        self.qp.complete(Completion::Sent { slot });
        Ok(())
    }

    fn read_recv(&self, slot: usize, len: usize, out: &mut Vec<u8>) {
        if let Ok(range) = self.range(slot, len) {
            out.extend_from_slice(&lock(&self.qp.recv)[range]);
        }
    }

    fn poll(&self, out: &mut Vec<Completion>, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        let mut st = lock(&self.qp.state);
        loop {
            if !self.paused.load(Ordering::SeqCst) && !st.completions.is_empty() {
                out.extend(st.completions.drain(..));
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            st = self
                .qp
                .cv
                .wait_timeout(st, left.min(Duration::from_millis(5)))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
