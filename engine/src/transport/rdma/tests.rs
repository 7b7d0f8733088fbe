//! The RDMA link over the fake fabric (`loopback`): the suite every transport passes, then
//! what only RDMA has: fragments, credits, the queue-pair exchange, a failed queue pair, and
//! the handshake refusing a peer on the other transport.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::loopback::Loopback;
use super::verbs::{QpInfo, RdmaConfig, Verbs};
use super::{upgrade, RdmaTransport};
use crate::error::{Error, Result};
use crate::transport::message::{LinkRole, LinkTransport, Message, RdmaControl, Welcome};
use crate::transport::tests::{
    expected, fast, fields, forward, listener_on, opts, pair_over, SECRET,
};
use crate::transport::{dial, Expected, HelloFields, LinkConfig, TcpTransport, Transport};

/// Small slots, so that the suite's messages take several fragments and the window fills.
fn small() -> RdmaConfig {
    RdmaConfig {
        slots: 4,
        slot_bytes: 4096,
        ..RdmaConfig::default()
    }
}

/// A TCP data link announcing RDMA (with these heartbeat settings), then each side upgraded
/// over its verbs, at once: (dialer's side, listener's side, the dialer's TCP link).
fn try_upgraded(
    dialer: LinkConfig,
    listener: LinkConfig,
    dv: Box<dyn Verbs>,
    lv: Box<dyn Verbs>,
) -> (
    Result<Arc<RdmaTransport>>,
    Result<Arc<RdmaTransport>>,
    Arc<TcpTransport>,
) {
    let (timeout_d, timeout_l) = (dialer.heartbeat_timeout, listener.heartbeat_timeout);
    let (d, l, hello) = pair_over(
        "127.0.0.1",
        LinkRole::Data,
        dialer,
        listener,
        LinkTransport::Rdma,
    )
    .unwrap();
    assert_eq!(hello.transport, LinkTransport::Rdma);
    let tcp = d.clone();
    thread::scope(|s| {
        let acc = s.spawn(|| upgrade(l, lv, timeout_l));
        let d = upgrade(d, dv, timeout_d);
        (d, acc.join().unwrap(), tcp)
    })
}

fn upgraded(
    dialer: LinkConfig,
    listener: LinkConfig,
    dv: Loopback,
    lv: Loopback,
) -> (Arc<RdmaTransport>, Arc<RdmaTransport>) {
    let (d, l, _) = try_upgraded(dialer, listener, Box::new(dv), Box::new(lv));
    (d.unwrap(), l.unwrap())
}

fn rdma_pair(dialer: LinkConfig, listener: LinkConfig) -> (Arc<dyn Transport>, Arc<dyn Transport>) {
    let (d, l) = upgraded(
        dialer,
        listener,
        Loopback::new(&small()),
        Loopback::new(&small()),
    );
    (d, l)
}

mod suite {
    crate::transport::suite::transport_suite!(super::rdma_pair);
}

#[test]
fn a_message_larger_than_many_slots_arrives_whole() {
    let (d, l) = rdma_pair(fast(), fast());
    // 64 rows × 576 f32 = 147 KB: 37 fragments through a 4-slot window.
    let body: Vec<u8> = (0..64 * 576 * 4).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..3 {
        d.send(&forward(64), &body).unwrap();
    }
    for _ in 0..3 {
        let (m, b) = l.recv().unwrap();
        assert_eq!(m, forward(64));
        assert!(b == body);
    }
}

#[test]
fn a_paused_receiver_holds_the_sender_back_and_loses_nothing() {
    let lv = Loopback::new(&small());
    let pause = lv.pause_switch();
    let (d, l) = upgraded(fast(), fast(), Loopback::new(&small()), lv);
    pause.store(true, Ordering::SeqCst);
    let sent = Arc::new(AtomicBool::new(false));
    thread::scope(|s| {
        let done = sent.clone();
        let d = &d;
        s.spawn(move || {
            for i in 0..40u64 {
                let release = Message::Release {
                    seqs: vec![i],
                    kv_blocks_used: 0,
                };
                d.send(&release, &[]).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        });
        // Four credits: four sends land, then the sender waits for the receiver.
        thread::sleep(Duration::from_millis(300));
        assert!(!sent.load(Ordering::SeqCst), "sent past the window");
        pause.store(false, Ordering::SeqCst);
        for i in 0..40u64 {
            match l.recv().unwrap() {
                (Message::Release { seqs, .. }, _) => assert_eq!(seqs, vec![i]),
                (m, _) => panic!("unexpected {m:?}"),
            }
        }
    });
    assert!(sent.load(Ordering::SeqCst));
}

#[test]
fn a_receiver_that_grants_no_credit_is_reported_hung() {
    let hb =
        LinkConfig::default().with_heartbeat(Duration::from_millis(50), Duration::from_millis(400));
    let lv = Loopback::new(&small());
    let pause = lv.pause_switch();
    let (d, _l) = upgraded(hb.clone(), hb, Loopback::new(&small()), lv);
    pause.store(true, Ordering::SeqCst);
    let release = Message::Release {
        seqs: vec![1],
        kv_blocks_used: 0,
    };
    for _ in 0..4 {
        d.send(&release, &[]).unwrap();
    }
    let start = Instant::now();
    let e = d.send(&release, &[]).unwrap_err();
    assert!(start.elapsed() >= Duration::from_millis(400));
    assert!(
        matches!(&e, Error::PeerGone { reason, .. } if reason.contains("granted no receive credit")),
        "{e}"
    );
    assert!(d.recv().is_err(), "the link stays down");
}

#[test]
fn a_peer_that_goes_away_fails_the_next_send() {
    let slow =
        LinkConfig::default().with_heartbeat(Duration::from_millis(100), Duration::from_secs(10));
    let (d, l) = rdma_pair(slow.clone(), slow);
    // The listener's side goes: its queue pair leaves the fabric, its TCP link closes.
    drop(l);
    let release = Message::Release {
        seqs: vec![1],
        kv_blocks_used: 0,
    };
    let start = Instant::now();
    let e = loop {
        if let Err(e) = d.send(&release, &[]) {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "sends kept succeeding"
        );
        thread::sleep(Duration::from_millis(10));
    };
    assert!(matches!(e, Error::PeerGone { .. }), "{e}");
    assert!(d.recv().is_err());
}

/// Verbs that announce a queue pair other than their own: the peer's connect must fail.
struct Misaddressed(Loopback);

impl Verbs for Misaddressed {
    fn local(&self) -> QpInfo {
        QpInfo {
            psn: self.0.local().psn ^ 1,
            ..self.0.local()
        }
    }
    fn connect(&self, remote: &QpInfo) -> crate::error::Result<()> {
        self.0.connect(remote)
    }
    fn post_recv(&self, slot: usize) -> crate::error::Result<()> {
        self.0.post_recv(slot)
    }
    fn post_send(&self, slot: usize, parts: &[&[u8]]) -> crate::error::Result<()> {
        self.0.post_send(slot, parts)
    }
    fn read_recv(&self, slot: usize, len: usize, out: &mut Vec<u8>) {
        self.0.read_recv(slot, len, out);
    }
    fn poll(&self, out: &mut Vec<super::Completion>, wait: Duration) -> crate::error::Result<()> {
        self.0.poll(out, wait)
    }
}

#[test]
fn the_queue_pair_exchange_carries_what_connect_needs() {
    // The right details connect (the suite); a wrong PSN does not, and both sides say why.
    let (dr, lr, _) = try_upgraded(
        fast(),
        fast(),
        Box::new(Misaddressed(Loopback::new(&small()))),
        Box::new(Loopback::new(&small())),
    );
    let lr = lr.unwrap_err();
    assert!(lr.to_string().contains("psn"), "{lr}");
    assert!(dr.is_err());
}

#[test]
fn a_peer_with_unusable_slots_is_refused() {
    let tiny = RdmaConfig {
        slots: 4,
        slot_bytes: 16,
        ..RdmaConfig::default()
    };
    let (dr, lr, _) = try_upgraded(
        fast(),
        fast(),
        Box::new(Loopback::new(&tiny)),
        Box::new(Loopback::new(&small())),
    );
    let lr = lr.unwrap_err().to_string();
    assert!(lr.contains("4 slots of 16 bytes"), "{lr}");
    let dr = dr.unwrap_err().to_string();
    assert!(dr.contains("4 slots of 16 bytes"), "{dr}");
}

#[test]
fn a_message_on_the_tcp_side_after_set_up_takes_the_link_down() {
    let (_dr, lr, raw_d) = try_upgraded(
        fast(),
        fast(),
        Box::new(Loopback::new(&small())),
        Box::new(Loopback::new(&small())),
    );
    let lr = lr.unwrap();
    // The dialer's TCP link sends what only the queue pair may carry.
    raw_d.send(&Message::Shutdown, &[]).unwrap();
    let e = lr.recv().unwrap_err().to_string();
    assert!(
        e.contains("Shutdown on the TCP side of an RDMA link"),
        "{e}"
    );
    // Credits are what the TCP side is for: a stray one is harmless.
    let _ = raw_d.send(&Message::Rdma(RdmaControl::Credit { slots: 1 }), &[]);
}

fn welcome() -> Welcome {
    Welcome {
        rank: 2,
        layers: [15, 29],
        weight_bytes: 1,
        kv_blocks_capacity: 1,
    }
}

#[test]
fn the_handshake_refuses_a_peer_on_the_other_transport() {
    let (l, addr) = listener_on("127.0.0.1", fast()).unwrap();
    let want = "transport rdma, this rank's data link runs on tcp (--transport)";
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap_err());
        let hello = HelloFields {
            transport: LinkTransport::Rdma,
            ..fields(LinkRole::Data)
        };
        let e = dial(&addr, &hello, SECRET, &opts(fast())).unwrap_err();
        assert!(matches!(&e, Error::HandshakeRefused(r) if r == want), "{e}");
        assert!(matches!(acc.join().unwrap(), Error::HandshakeRefused(r) if r == want));
    });
    // Control links are TCP whatever the data links run on.
    let (l, addr) = listener_on("127.0.0.1", fast()).unwrap();
    let rdma_rank = Expected {
        transport: LinkTransport::Rdma,
        ..expected()
    };
    thread::scope(|s| {
        let acc = s.spawn(|| {
            let (t, hello) = l.accept(&rdma_rank).unwrap();
            t.send(&Message::Welcome(welcome()), &[]).unwrap();
            hello.role
        });
        let d = dial(&addr, &fields(LinkRole::Control), SECRET, &opts(fast())).unwrap();
        assert_eq!(d.recv().unwrap().0, Message::Welcome(welcome()));
        assert_eq!(acc.join().unwrap(), LinkRole::Control);
    });
}

#[test]
fn without_a_device_rdma_says_so_in_one_line() {
    // Without the feature: not compiled in. With it, on a machine without a device (CI): no
    // device found. Either way one line that names `--transport tcp`.
    match super::check_device(&RdmaConfig::default()) {
        Ok(name) => println!("RDMA device present: {name}"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.ends_with("--transport tcp works"), "{text}");
            assert!(!text.contains('\n'), "{text}");
        }
    }
}

#[test]
fn ranks_given_different_slot_sizes_send_in_the_smaller() {
    // The dialer's slots are a quarter of the listener's: fragments cut to the listener's slot
    // did not fit the dialer's own send slots, and its first large message took the link down.
    let bigger = RdmaConfig {
        slots: 4,
        slot_bytes: 16384,
        ..RdmaConfig::default()
    };
    let (d, l) = upgraded(
        fast(),
        fast(),
        Loopback::new(&small()),
        Loopback::new(&bigger),
    );
    let body: Vec<u8> = (0..20_000).map(|i| (i % 251) as u8).collect();
    for (from, to) in [(&d, &l), (&l, &d)] {
        from.send(&forward(8), &body).unwrap();
        let (m, got) = to.recv().unwrap();
        assert_eq!(m, forward(8));
        assert_eq!(got, body);
    }
}
