//! Links over real TCP on loopback. Heartbeats run at 50 ms with a 300 ms timeout so the suite
//! takes a few seconds.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::frame::{self, f32_to_le_bytes, le_bytes_to_f32, WIRE_VERSION};
use super::handshake::{dial, proof, DialOptions, Expected, HelloFields};
use super::message::{
    Forward, Hello, LinkRole, LinkTransport, Message, SeqChunk, Welcome, PROTOCOL_VERSION,
};
use super::tcp::{LinkConfig, RankListener, TcpTransport};
use super::Transport;
use crate::error::Error;

pub(super) const SHA: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
pub(super) const SECRET: &[u8] = b"cluster-secret";
pub(super) const HB: Duration = Duration::from_millis(50);
pub(super) const TIMEOUT: Duration = Duration::from_millis(300);

/// Most tests: quick heartbeats, with a timeout that a loaded 2-core CI machine can't trip.
pub(super) fn fast() -> LinkConfig {
    LinkConfig::default().with_heartbeat(HB, Duration::from_secs(3))
}

/// The tests about the timeout itself.
pub(super) fn timing() -> LinkConfig {
    LinkConfig::default().with_heartbeat(HB, TIMEOUT)
}

pub(super) fn expected() -> Expected {
    Expected {
        model_sha256: SHA.into(),
        rank: 2,
        layers: [15, 29],
        n_ranks: 3,
        transport: LinkTransport::Tcp,
        secret: SECRET.to_vec(),
    }
}

pub(super) fn fields(role: LinkRole) -> HelloFields {
    HelloFields {
        role,
        model_sha256: SHA.into(),
        rank: 2,
        layers: [15, 29],
        n_ranks: 3,
        transport: LinkTransport::Tcp,
    }
}

pub(super) fn opts(link: LinkConfig) -> DialOptions {
    DialOptions {
        retry_for: Duration::from_secs(5),
        link,
        ..DialOptions::default()
    }
}

pub(super) fn listener_on(ip: &str, link: LinkConfig) -> Option<(RankListener, String)> {
    match RankListener::bind(&format!("{ip}:0")) {
        Ok(l) => {
            let addr = l.local_addr().unwrap().to_string();
            Some((
                l.with_link_config(link)
                    .with_handshake_timeout(Duration::from_secs(2)),
                addr,
            ))
        }
        Err(e) => {
            println!("skipping: cannot bind {ip}: {e}");
            None
        }
    }
}

/// A handshaken link: (dialer's side, listener's side, the Hello the listener saw). On a control
/// link the listener answers Welcome; in both cases the dialer's first recv (the answer) is
/// consumed and checked.
pub(super) fn pair_on(
    ip: &str,
    role: LinkRole,
    dialer: LinkConfig,
    listener: LinkConfig,
) -> Option<(Arc<TcpTransport>, Arc<TcpTransport>, Hello)> {
    pair_over(ip, role, dialer, listener, LinkTransport::Tcp)
}

/// [`pair_on`] with both sides announcing `transport` (the link itself stays TCP: moving it
/// onto RDMA is the caller's next step).
pub(super) fn pair_over(
    ip: &str,
    role: LinkRole,
    dialer: LinkConfig,
    listener: LinkConfig,
    transport: LinkTransport,
) -> Option<(Arc<TcpTransport>, Arc<TcpTransport>, Hello)> {
    let (l, addr) = listener_on(ip, listener)?;
    let expect = Expected {
        transport,
        ..expected()
    };
    let fields = HelloFields {
        transport,
        ..fields(role)
    };
    let welcome = Welcome {
        rank: 2,
        layers: [15, 29],
        weight_bytes: 123,
        kv_blocks_capacity: 456,
    };
    let (d, (t, hello)) = thread::scope(|s| {
        let acc = s.spawn(|| {
            let (t, hello) = l.accept(&expect).unwrap();
            if hello.role == LinkRole::Control {
                t.send(&Message::Welcome(welcome.clone()), &[]).unwrap();
            }
            (t, hello)
        });
        let d = dial(&addr, &fields, SECRET, &opts(dialer)).unwrap();
        (d, acc.join().unwrap())
    });
    let (first, body) = d.recv().unwrap();
    assert!(body.is_empty());
    match role {
        LinkRole::Control => assert_eq!(first, Message::Welcome(welcome)),
        LinkRole::Data => assert_eq!(first, Message::Ready { rank: 2 }),
    }
    Some((d, t, hello))
}

fn pair(role: LinkRole) -> (Arc<TcpTransport>, Arc<TcpTransport>, Hello) {
    pair_on("127.0.0.1", role, fast(), fast()).unwrap()
}

fn tcp_pair(dialer: LinkConfig, listener: LinkConfig) -> (Arc<dyn Transport>, Arc<dyn Transport>) {
    let (d, l, _) = pair_on("127.0.0.1", LinkRole::Data, dialer, listener).unwrap();
    (d, l)
}

mod suite {
    crate::transport::suite::transport_suite!(super::tcp_pair);
}

pub(super) fn forward(rows: u32) -> Message {
    Message::Forward(Forward {
        batch: 1,
        seqs: vec![SeqChunk {
            seq: 5,
            len: rows,
            pos: 0,
            blocks: vec![0, 1, 2],
            sample: None,
        }],
        rows,
        kv_blocks_used: 3,
        traceparent: None,
    })
}

/// A dialer that speaks the handshake by hand, then does whatever the test wants with the stream.
fn raw_handshake(addr: &str, role: LinkRole, hello_version: u32) -> (TcpStream, Message) {
    let s = TcpStream::connect(addr).unwrap();
    let nonce = match frame::read_frame(&mut &s).unwrap().message {
        Message::Challenge { nonce } => nonce,
        m => panic!("expected a challenge, got {m:?}"),
    };
    let hello = Hello {
        transport: LinkTransport::Tcp,
        protocol: hello_version,
        role,
        model_sha256: SHA.into(),
        rank: 2,
        layers: [15, 29],
        n_ranks: 3,
        proof: proof(SECRET, &nonce),
    };
    frame::write_frame_with_version(&mut &s, hello_version as u16, &Message::Hello(hello), &[])
        .unwrap();
    let h = frame::read_header(&mut &s).unwrap();
    let answer = frame::read_payload(&mut &s, &h).unwrap().message;
    (s, answer)
}

fn unused_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn data_link_handshake_succeeds_and_carries_messages_both_ways() {
    let (d, l, hello) = pair(LinkRole::Data);
    assert_eq!(hello.role, LinkRole::Data);
    assert_eq!((hello.rank, hello.layers, hello.n_ranks), (2, [15, 29], 3));
    assert_eq!(hello.protocol, PROTOCOL_VERSION);
    d.send(
        &Message::Release {
            seqs: vec![1, 2],
            kv_blocks_used: 0,
        },
        &[],
    )
    .unwrap();
    assert_eq!(
        l.recv().unwrap().0,
        Message::Release {
            seqs: vec![1, 2],
            kv_blocks_used: 0
        }
    );
    l.send(&Message::Shutdown, &[]).unwrap();
    assert_eq!(d.recv().unwrap().0, Message::Shutdown);
    assert_eq!(d.peer_addr(), l.local_addr().unwrap().to_string());
    assert_eq!(l.peer_addr(), d.local_addr().unwrap().to_string());
}

#[test]
fn control_link_handshake_delivers_welcome_first() {
    let (_d, _l, hello) = pair(LinkRole::Control);
    assert_eq!(hello.role, LinkRole::Control);
}

#[test]
fn distinct_loopback_addresses() {
    for ip in ["127.0.0.2", "127.0.0.3"] {
        let Some((d, l, _)) = pair_on(ip, LinkRole::Data, fast(), fast()) else {
            continue;
        };
        let listener_side: SocketAddr = l.local_addr().unwrap();
        let dialer_side: SocketAddr = d.local_addr().unwrap();
        println!("{ip}: dialer {dialer_side} -> listener {listener_side}");
        assert_eq!(listener_side.ip().to_string(), ip);
        assert!(dialer_side.ip().is_loopback());
        assert_eq!(d.peer_addr(), listener_side.to_string());
        let body = f32_to_le_bytes(&[1.5; 576]);
        d.send(&forward(1), &body).unwrap();
        let (m, b) = l.recv().unwrap();
        assert_eq!((m, b), (forward(1), body));
    }
}

/// Dials with `fields`/`secret` and returns (the dialer's error, the listener's error).
fn refused(fields: HelloFields, secret: &[u8]) -> (Error, Error) {
    let (l, addr) = listener_on("127.0.0.1", fast()).unwrap();
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap_err());
        let start = Instant::now();
        let e = dial(&addr, &fields, secret, &opts(fast())).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "a refusal must not be retried"
        );
        (e, acc.join().unwrap())
    })
}

fn assert_refused(e: (Error, Error), reason: &str) {
    for e in [e.0, e.1] {
        match e {
            Error::HandshakeRefused(r) => assert_eq!(r, reason),
            e => panic!("expected a refusal ({reason}), got {e}"),
        }
    }
}

#[test]
fn model_mismatch_is_refused_with_both_hashes() {
    let mut f = fields(LinkRole::Data);
    f.model_sha256 = "abcdef0123456789".repeat(4);
    assert_refused(
        refused(f, SECRET),
        "model sha256 abcdef012345… differs from this rank's 0f1e2d3c4b5a…",
    );
}

#[test]
fn wrong_secret_is_refused() {
    assert_refused(
        refused(fields(LinkRole::Control), b"not-the-secret"),
        "cluster secret does not match",
    );
}

#[test]
fn rank_and_layer_mismatch_is_refused() {
    let mut f = fields(LinkRole::Data);
    f.layers = [20, 29];
    assert_refused(
        refused(f, SECRET),
        "expected rank 2 holding blocks 20-29, this is rank 2 holding blocks 15-29",
    );
    let mut f = fields(LinkRole::Data);
    f.rank = 1;
    f.n_ranks = 4;
    assert_refused(
        refused(f, SECRET),
        "expected rank 1 of 4 holding blocks 15-29, this is rank 2 of 3 holding blocks 15-29",
    );
}

#[test]
fn other_protocol_version_is_refused_by_version() {
    let (l, addr) = listener_on("127.0.0.1", fast()).unwrap();
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap_err());
        let (_s, answer) = raw_handshake(&addr, LinkRole::Data, PROTOCOL_VERSION + 1);
        let want = format!(
            "protocol version {}, this rank speaks {PROTOCOL_VERSION}",
            PROTOCOL_VERSION + 1
        );
        assert_eq!(
            answer,
            Message::Refused {
                reason: want.clone()
            }
        );
        assert!(matches!(acc.join().unwrap(), Error::HandshakeRefused(r) if r == want));
    });
}

#[test]
fn a_silent_peer_is_reported_within_the_timeout() {
    // Listener side: a dialer that completes the handshake by hand, then says nothing more
    // (a hung process: the socket stays open).
    let (l, addr) = listener_on("127.0.0.1", timing()).unwrap();
    let (t, raw) = thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap().0);
        let (raw, answer) = raw_handshake(&addr, LinkRole::Data, PROTOCOL_VERSION);
        assert_eq!(answer, Message::Ready { rank: 2 });
        (acc.join().unwrap(), raw)
    });
    let start = Instant::now();
    let e = t.recv().unwrap_err();
    let took = start.elapsed();
    assert!(took < TIMEOUT + Duration::from_millis(500), "took {took:?}");
    assert!(
        matches!(&e, Error::PeerGone { reason, .. } if reason.contains("nothing heard for 300 ms")),
        "{e}"
    );
    // The link stays down, with the same reason.
    assert!(t.recv().unwrap_err().to_string().contains("nothing heard"));
    assert!(t.send(&Message::Shutdown, &[]).is_err());
    drop(raw);

    // Dialer side: a listener that answers the handshake by hand, then goes silent.
    let raw_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw_l.local_addr().unwrap().to_string();
    thread::scope(|s| {
        s.spawn(|| {
            let (c, _) = raw_l.accept().unwrap();
            frame::write_frame(&mut &c, &Message::Challenge { nonce: "00".into() }, &[]).unwrap();
            let _hello = frame::read_frame(&mut &c).unwrap();
            frame::write_frame(&mut &c, &Message::Ready { rank: 2 }, &[]).unwrap();
            thread::sleep(TIMEOUT * 3);
        });
        let d = dial(&addr, &fields(LinkRole::Data), SECRET, &opts(timing())).unwrap();
        assert_eq!(d.recv().unwrap().0, Message::Ready { rank: 2 });
        let start = Instant::now();
        let e = d.recv().unwrap_err();
        assert!(
            start.elapsed() < TIMEOUT + Duration::from_millis(500),
            "took {:?}",
            start.elapsed()
        );
        assert!(e.to_string().contains("heartbeat timeout"), "{e}");
    });
}

#[test]
fn a_killed_peer_process_is_reported_at_once() {
    let slow =
        LinkConfig::default().with_heartbeat(Duration::from_millis(100), Duration::from_secs(10));
    // A killed process: its socket closes under it (raw stream dropped without a word).
    let (lst, addr) = listener_on("127.0.0.1", slow).unwrap();
    thread::scope(|s| {
        let acc = s.spawn(|| lst.accept(&expected()).unwrap().0);
        let (raw, _) = raw_handshake(&addr, LinkRole::Data, PROTOCOL_VERSION);
        let t = acc.join().unwrap();
        drop(raw);
        let start = Instant::now();
        let e = t.recv().unwrap_err();
        assert!(matches!(e, Error::PeerGone { .. }), "{e}");
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "took {:?}",
            start.elapsed()
        );
    });
}

#[test]
fn garbage_and_truncated_frames_are_errors() {
    let (l, addr) = listener_on("127.0.0.1", fast()).unwrap();
    // Not our protocol at all, during the handshake: refused, and the listener keeps working.
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap_err());
        let mut c = TcpStream::connect(&addr).unwrap();
        let _challenge = frame::read_frame(&mut &c).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: rank\r\n\r\n")
            .unwrap();
        let e = acc.join().unwrap();
        assert!(e.to_string().contains("bad frame magic"), "{e}");
        // The garbage dialer is told why.
        match frame::read_frame(&mut &c).unwrap().message {
            Message::Refused { reason } => assert!(reason.contains("bad frame magic")),
            m => panic!("{m:?}"),
        }
    });
    // Wrong magic after the handshake.
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap().0);
        let (mut raw, _) = raw_handshake(&addr, LinkRole::Data, PROTOCOL_VERSION);
        let t = acc.join().unwrap();
        raw.write_all(&[0xde; 40]).unwrap();
        let e = t.recv().unwrap_err();
        assert!(
            matches!(&e, Error::Transport(m) if m.contains("bad frame magic")),
            "{e}"
        );
    });
    // A frame cut short, then the connection ends.
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap().0);
        let (mut raw, _) = raw_handshake(&addr, LinkRole::Data, PROTOCOL_VERSION);
        let t = acc.join().unwrap();
        let mut buf = Vec::new();
        frame::write_frame(&mut buf, &forward(1), &f32_to_le_bytes(&[0.0; 576])).unwrap();
        raw.write_all(&buf[..buf.len() / 2]).unwrap();
        // End the stream (FIN) without discarding the heartbeats it never read, which would
        // make the close a reset instead.
        raw.shutdown(Shutdown::Write).unwrap();
        let e = t.recv().unwrap_err();
        assert!(e.to_string().contains("inside a frame"), "{e}");
    });
    // A frame of another version after the handshake.
    thread::scope(|s| {
        let acc = s.spawn(|| l.accept(&expected()).unwrap().0);
        let (raw, _) = raw_handshake(&addr, LinkRole::Data, PROTOCOL_VERSION);
        let t = acc.join().unwrap();
        frame::write_frame_with_version(&mut &raw, WIRE_VERSION + 1, &Message::Shutdown, &[])
            .unwrap();
        let e = t.recv().unwrap_err();
        let want = format!("protocol version {}", WIRE_VERSION + 1);
        assert!(e.to_string().contains(&want), "{e}");
    });
}

#[test]
fn dial_retries_until_the_listener_comes_up_and_reports_the_last_error() {
    // Nobody there: gives up after retry_for, naming the last error.
    let addr = unused_addr();
    let o = DialOptions {
        retry_for: Duration::from_millis(400),
        link: fast(),
        ..DialOptions::default()
    };
    let start = Instant::now();
    let e = dial(&addr, &fields(LinkRole::Data), SECRET, &o)
        .unwrap_err()
        .to_string();
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(
        e.contains("could not reach rank 2") && e.contains("refused"),
        "{e}"
    );

    // The listener binds late: the dialer keeps trying and gets through.
    let addr = unused_addr();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(400));
            let l = RankListener::bind(&addr).unwrap().with_link_config(fast());
            let _t = l.accept(&expected()).unwrap();
            thread::sleep(Duration::from_millis(100));
        });
        let d = dial(&addr, &fields(LinkRole::Data), SECRET, &opts(fast())).unwrap();
        assert_eq!(d.recv().unwrap().0, Message::Ready { rank: 2 });
    });
}

#[test]
fn bad_heartbeat_settings_are_rejected() {
    let bad = LinkConfig::default().with_heartbeat(Duration::from_secs(2), Duration::from_secs(1));
    // Both sides say so before touching the network.
    let e = dial(
        &unused_addr(),
        &fields(LinkRole::Data),
        SECRET,
        &opts(bad.clone()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("heartbeat interval"), "{e}");
    let (l, _) = listener_on("127.0.0.1", bad).unwrap();
    let e = l.accept(&expected()).unwrap_err();
    assert!(e.to_string().contains("heartbeat interval"), "{e}");
}

/// Round-trip time of a small message and throughput of 1000×576 f32 Forward frames over
/// loopback. `cargo test --release -p sluice-engine --lib transport::tests::measure -- --ignored --nocapture`
#[test]
#[ignore]
fn measure_rtt_and_throughput() {
    let (d, l, _) = pair_on(
        "127.0.0.1",
        LinkRole::Data,
        LinkConfig::default(),
        LinkConfig::default(),
    )
    .unwrap();
    thread::scope(|s| {
        // Echo everything back.
        s.spawn(|| {
            while let Ok((m, b)) = l.recv() {
                if m == Message::Shutdown {
                    break;
                }
                match m {
                    Message::Release { .. } => l.send(&m, &b).unwrap(),
                    // Batch 1 stands for "decode it", as a rank would; batch 0 for bytes only.
                    Message::Forward(f) if f.batch == 1 => {
                        assert_eq!(le_bytes_to_f32(&b).unwrap().len(), 1000 * 576)
                    }
                    _ => assert_eq!(b.len(), 1000 * 576 * 4),
                }
            }
        });
        let ping = Message::Release {
            seqs: vec![1],
            kv_blocks_used: 0,
        };
        for _ in 0..200 {
            d.send(&ping, &[]).unwrap();
            d.recv().unwrap();
        }
        let n = 5000;
        let mut rtts = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            d.send(&ping, &[]).unwrap();
            d.recv().unwrap();
            rtts.push(t.elapsed());
        }
        rtts.sort();
        println!(
            "small-message round trip over {n}: median {:?}, p99 {:?}, mean {:?}",
            rtts[n / 2],
            rtts[n * 99 / 100],
            rtts.iter().sum::<Duration>() / n as u32
        );

        let values: Vec<f32> = (0..1000 * 576).map(|i| i as f32).collect();
        let t = Instant::now();
        let mut encoded = Vec::new();
        for _ in 0..100 {
            encoded = f32_to_le_bytes(&values);
        }
        let enc = t.elapsed() / 100;
        let t = Instant::now();
        for _ in 0..100 {
            assert_eq!(le_bytes_to_f32(&encoded).unwrap().len(), values.len());
        }
        println!(
            "f32 -> bytes {enc:?}, bytes -> f32 {:?} per 1000x576 tensor",
            t.elapsed() / 100
        );
        let frames = 400;
        let bytes = (values.len() * 4 * frames) as f64;
        let mut raw_msg = forward(1000);
        if let Message::Forward(f) = &mut raw_msg {
            f.batch = 0;
        }
        for (label, convert) in [
            ("bytes only", false),
            ("with f32<->bytes at both ends", true),
        ] {
            let t = Instant::now();
            for _ in 0..frames {
                if convert {
                    d.send(&forward(1000), &f32_to_le_bytes(&values)).unwrap();
                } else {
                    d.send(&raw_msg, &encoded).unwrap();
                }
            }
            // Ping after the frames: its echo returns once all frames were read.
            d.send(&ping, &[]).unwrap();
            d.recv().unwrap();
            let secs = t.elapsed().as_secs_f64();
            println!(
                "Forward 1000x576 f32 ({:.2} MB each) x {frames}, {label}: {:.0} MB/s, {:.2} ms/frame",
                values.len() as f64 * 4.0 / 1e6,
                bytes / secs / 1e6,
                secs * 1e3 / frames as f64
            );
        }
        d.send(&Message::Shutdown, &[]).unwrap();
    });
}
