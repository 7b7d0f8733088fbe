//! The tests every [`Transport`] passes, whatever carries it: each takes a function that makes
//! a connected pair (dialer's side, listener's side) with the given heartbeat settings.
//! `transport_suite!(pair)` turns them into `#[test]`s for one transport (TCP in
//! `transport::tests`, RDMA over the fake fabric in `transport::rdma::tests`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::frame::{f32_to_le_bytes, le_bytes_to_f32};
use super::message::{Message, RankStatus};
use super::tcp::LinkConfig;
use super::tests::{fast, forward, timing, HB, TIMEOUT};
use super::Transport;
use crate::error::Error;

/// Makes a connected pair: (dialer's side with the first config, listener's with the second).
pub type Pair = fn(LinkConfig, LinkConfig) -> (Arc<dyn Transport>, Arc<dyn Transport>);

/// One `#[test]` per suite function, for the transport `$pair` makes.
macro_rules! transport_suite {
    ($pair:path) => {
        #[test]
        fn carries_messages_both_ways() {
            $crate::transport::suite::carries_messages_both_ways($pair)
        }
        #[test]
        fn a_body_on_a_message_without_one_is_rejected_without_breaking_the_link() {
            $crate::transport::suite::a_body_on_a_message_without_one_is_rejected_without_breaking_the_link($pair)
        }
        #[test]
        fn forward_of_1000_by_576_round_trips_bit_exactly() {
            $crate::transport::suite::forward_of_1000_by_576_round_trips_bit_exactly($pair)
        }
        #[test]
        fn messages_stay_in_order_under_concurrent_sends() {
            $crate::transport::suite::messages_stay_in_order_under_concurrent_sends($pair)
        }
        #[test]
        fn heartbeats_keep_an_idle_link_alive() {
            $crate::transport::suite::heartbeats_keep_an_idle_link_alive($pair)
        }
        #[test]
        fn peer_status_reflects_the_peers_heartbeats() {
            $crate::transport::suite::peer_status_reflects_the_peers_heartbeats($pair)
        }
        #[test]
        fn a_closed_peer_is_reported_at_once() {
            $crate::transport::suite::a_closed_peer_is_reported_at_once($pair)
        }
    };
}
pub(crate) use transport_suite;

pub fn carries_messages_both_ways(pair: Pair) {
    let (d, l) = pair(fast(), fast());
    let release = Message::Release {
        seqs: vec![1, 2],
        kv_blocks_used: 0,
    };
    d.send(&release, &[]).unwrap();
    assert_eq!(l.recv().unwrap(), (release, Vec::new()));
    l.send(&Message::Shutdown, &[]).unwrap();
    assert_eq!(d.recv().unwrap().0, Message::Shutdown);
}

pub fn a_body_on_a_message_without_one_is_rejected_without_breaking_the_link(pair: Pair) {
    let (d, l) = pair(fast(), fast());
    assert!(d.send(&Message::Shutdown, &[1, 2, 3, 4]).is_err());
    d.send(&Message::Ready { rank: 1 }, &[]).unwrap();
    assert_eq!(l.recv().unwrap().0, Message::Ready { rank: 1 });
}

pub fn forward_of_1000_by_576_round_trips_bit_exactly(pair: Pair) {
    let (d, l) = pair(fast(), fast());
    let values: Vec<f32> = (0..1000 * 576u32)
        .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) ^ 0x5555_5555))
        .collect();
    let body = f32_to_le_bytes(&values);
    d.send(&forward(1000), &body).unwrap();
    let (m, b) = l.recv().unwrap();
    assert_eq!(m, forward(1000));
    assert_eq!(b.len(), 1000 * 576 * 4);
    assert!(b == body);
    let back = le_bytes_to_f32(&b).unwrap();
    assert!(values
        .iter()
        .zip(&back)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

pub fn messages_stay_in_order_under_concurrent_sends(pair: Pair) {
    let (d, l) = pair(fast(), fast());
    const N: u64 = 300;
    thread::scope(|s| {
        for t in 0..2u64 {
            let d = &d;
            s.spawn(move || {
                for i in 0..N {
                    if i % 10 == 0 {
                        // Large frames interleaved with small ones must still go out whole.
                        let body = f32_to_le_bytes(&vec![(t * N + i) as f32; 576 * 8]);
                        let mut m = forward(8);
                        if let Message::Forward(f) = &mut m {
                            f.batch = t * N + i;
                        }
                        d.send(&m, &body).unwrap();
                    } else {
                        d.send(
                            &Message::Release {
                                seqs: vec![t, i],
                                kv_blocks_used: 0,
                            },
                            &[],
                        )
                        .unwrap();
                    }
                }
            });
        }
        let mut next = [0u64; 2];
        for _ in 0..2 * N {
            match l.recv().unwrap() {
                (Message::Release { seqs, .. }, b) => {
                    assert!(b.is_empty());
                    let (t, i) = (seqs[0] as usize, seqs[1]);
                    assert_eq!(i, next[t], "thread {t} out of order");
                    next[t] += 1;
                }
                (Message::Forward(f), b) => {
                    let (t, i) = ((f.batch / N) as usize, f.batch % N);
                    assert_eq!(i, next[t], "thread {t} out of order");
                    assert!(le_bytes_to_f32(&b)
                        .unwrap()
                        .iter()
                        .all(|&v| v == f.batch as f32));
                    next[t] += 1;
                }
                (m, _) => panic!("unexpected {m:?}"),
            }
        }
        assert_eq!(next, [N, N]);
    });
}

pub fn heartbeats_keep_an_idle_link_alive(pair: Pair) {
    let (d, l) = pair(timing(), timing());
    let start = Instant::now();
    thread::scope(|s| {
        // recv blocks through 4 timeouts' worth of silence on the application level, and returns
        // the message, not a timeout.
        s.spawn(|| {
            thread::sleep(TIMEOUT * 4);
            d.send(&Message::Shutdown, &[]).unwrap();
        });
        assert_eq!(l.recv().unwrap().0, Message::Shutdown);
        assert!(start.elapsed() >= TIMEOUT * 4);
    });
    for t in [&d, &l] {
        let (_, age) = t.peer_status();
        assert!(age < TIMEOUT, "last heard {age:?} ago");
    }
    l.send(&Message::Ready { rank: 9 }, &[]).unwrap();
    assert_eq!(d.recv().unwrap().0, Message::Ready { rank: 9 });
}

pub fn peer_status_reflects_the_peers_heartbeats(pair: Pair) {
    let used = Arc::new(AtomicU64::new(7));
    let u = used.clone();
    let status = fast().with_status(move || {
        Some(RankStatus {
            rank: 1,
            kv_blocks_total: 100,
            kv_blocks_used: u.load(Ordering::SeqCst),
            weight_bytes: 10,
            kv_bytes: 20,
        })
    });
    let (d, l) = pair(status, fast());
    let wait_for = |want: u64| {
        let start = Instant::now();
        loop {
            if let (Some(st), _) = l.peer_status() {
                if st.kv_blocks_used == want {
                    assert_eq!(
                        (st.rank, st.kv_blocks_total, st.weight_bytes, st.kv_bytes),
                        (1, 100, 10, 20)
                    );
                    return;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "status {want} never arrived"
            );
            thread::sleep(Duration::from_millis(10));
        }
    };
    wait_for(7);
    used.store(42, Ordering::SeqCst);
    wait_for(42);
    // The other direction sends no status.
    thread::sleep(HB * 2);
    assert_eq!(d.peer_status().0, None);
}

pub fn a_closed_peer_is_reported_at_once(pair: Pair) {
    // A long timeout, so only the close itself can explain a prompt error.
    let slow =
        LinkConfig::default().with_heartbeat(Duration::from_millis(100), Duration::from_secs(10));
    let (d, l) = pair(slow.clone(), slow.clone());
    d.send(&Message::Shutdown, &[]).unwrap();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(100));
            d.close();
        });
        // What was sent before the close still arrives first.
        assert_eq!(l.recv().unwrap().0, Message::Shutdown);
        let start = Instant::now();
        let e = l.recv().unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "took {:?}",
            start.elapsed()
        );
        assert!(
            matches!(&e, Error::PeerGone { reason, .. } if reason.contains("closed")),
            "{e}"
        );
    });
    assert!(d
        .recv()
        .unwrap_err()
        .to_string()
        .contains("closed by this side"));
    assert!(d.send(&Message::Shutdown, &[]).is_err());

    // A blocked recv on the side that closes returns too.
    let (d, l) = pair(slow.clone(), slow.clone());
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(100));
            l.close();
        });
        let start = Instant::now();
        assert!(l.recv().is_err());
        assert!(d.recv().is_err());
        assert!(start.elapsed() < Duration::from_secs(1));
    });
}
