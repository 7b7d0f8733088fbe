//! The handshake that opens every link, on both sides.
//!
//! 1. The listener sends `Challenge{nonce}`: 16 fresh bytes, hex.
//! 2. The dialer sends `Hello{protocol, role, model_sha256, rank, layers, n_ranks, proof}` where
//!    `proof = hex(HMAC-SHA256(key = cluster secret, message = the nonce's hex text))`.
//! 3. The listener checks, in this order, the protocol version, the model's sha256, the proof
//!    (in constant time), the rank, blocks and pipeline size the dialer expects, and (data links)
//!    the transport. The first
//!    difference is answered with `Refused{reason}` naming it, and the connection is closed.
//!    Otherwise a data link is answered `Ready{rank}` at once, and on a control link the
//!    listener's caller answers `Welcome{..}`.
//!
//! Handshake frames are read whatever version their header claims, so that a rank of another
//! protocol version gets a refusal that says so instead of a framing error; after the handshake
//! only this build's version is accepted.
//!
//! The proof shows the listener that the dialer knows the cluster secret; it does not prove the
//! listener to the dialer, and nothing on the link is encrypted: run ranks on a trusted network.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::frame::{self, FrameError, WIRE_VERSION};
use super::message::{Hello, LinkRole, LinkTransport, Message, PROTOCOL_VERSION};
use super::tcp::{Heard, LinkConfig, TcpTransport};
use crate::error::{Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// What a dialer asks for: everything in `Hello` but the protocol version and the proof.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloFields {
    pub role: LinkRole,
    /// Hex sha256 of the GGUF file.
    pub model_sha256: String,
    /// The rank the dialer expects to reach, and the blocks (`first..=last`) it expects it to hold.
    pub rank: u32,
    pub layers: [u32; 2],
    /// Ranks in the pipeline.
    pub n_ranks: u32,
    /// What a data link runs on after the handshake (control links: always TCP).
    pub transport: LinkTransport,
}

/// What a listening rank is, which a dialer's `Hello` must match.
#[derive(Clone, PartialEq, Eq)]
pub struct Expected {
    /// Hex sha256 of the GGUF file this rank serves.
    pub model_sha256: String,
    /// This rank, and the blocks (`first..=last`) it holds.
    pub rank: u32,
    pub layers: [u32; 2],
    /// Ranks in the pipeline.
    pub n_ranks: u32,
    /// What this rank's incoming data link runs on.
    pub transport: LinkTransport,
    /// The cluster secret every rank shares.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expected")
            .field("model_sha256", &self.model_sha256)
            .field("rank", &self.rank)
            .field("layers", &self.layers)
            .field("n_ranks", &self.n_ranks)
            .field("transport", &self.transport)
            .field(
                "secret",
                &format_args!("<{} bytes, redacted>", self.secret.len()),
            )
            .finish()
    }
}

/// How [`dial`] connects.
#[derive(Clone, Debug)]
pub struct DialOptions {
    /// How long to keep retrying a peer that is not up yet (connection refused, unreachable, a
    /// connection dropped mid-handshake). Default 30 s. Refusals are never retried.
    pub retry_for: Duration,
    /// The limit on one connection attempt. Default 2 s.
    pub connect_timeout: Duration,
    /// The limit on the handshake once the listener has sent its challenge (the wait for the
    /// challenge itself may take the rest of `retry_for`: a listener may still be loading its
    /// model before it accepts). Default 10 s.
    pub handshake_timeout: Duration,
    /// Heartbeat settings of the link.
    pub link: LinkConfig,
}

impl Default for DialOptions {
    fn default() -> Self {
        DialOptions {
            retry_for: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(10),
            link: LinkConfig::default(),
        }
    }
}

/// A fresh challenge nonce: 16 bytes as 32 hex digits. Mixes the OS's random bytes (when
/// `/dev/urandom` can be read), the clock, the process id, a counter and std's randomly keyed
/// hasher through sha256, so nonces never repeat even without an OS RNG.
pub fn new_nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = Sha256::new();
    let mut os = [0u8; 32];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut os))
        .is_ok()
    {
        h.update(os);
    }
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    h.update(now.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let keyed = {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one(now)
    };
    h.update(keyed.to_le_bytes());
    hex(&h.finalize()[..16])
}

/// `hex(HMAC-SHA256(secret, nonce))`: the proof a dialer sends for a challenge.
pub fn proof(secret: &[u8], nonce: &str) -> String {
    hex(&mac(secret, nonce).finalize().into_bytes())
}

fn mac(secret: &[u8], nonce: &str) -> HmacSha256 {
    // HMAC takes keys of any length, so this cannot fail; fall back to an empty-key MAC anyway
    // rather than panic (a proof made with it will not verify against a real secret).
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret)
        .unwrap_or_else(|_| <HmacSha256 as hmac::digest::KeyInit>::new(&Default::default()));
    mac.update(nonce.as_bytes());
    mac
}

/// Whether `proof_hex` is the proof for `nonce` under `secret`, compared in constant time.
fn verify_proof(secret: &[u8], nonce: &str, proof_hex: &str) -> bool {
    match unhex(proof_hex) {
        Some(bytes) => mac(secret, nonce).verify_slice(&bytes).is_ok(),
        None => false,
    }
}

/// Checks a dialer's `Hello` against this rank, in the documented order; `Err` is the refusal
/// reason, naming the first thing that differs.
pub fn check_hello(
    hello: &Hello,
    nonce: &str,
    expect: &Expected,
) -> std::result::Result<(), String> {
    if hello.protocol != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {}, this rank speaks {PROTOCOL_VERSION}",
            hello.protocol
        ));
    }
    if !hello
        .model_sha256
        .eq_ignore_ascii_case(&expect.model_sha256)
    {
        let (theirs, ours) = shorten_pair(&hello.model_sha256, &expect.model_sha256);
        return Err(format!(
            "model sha256 {theirs} differs from this rank's {ours}"
        ));
    }
    if !verify_proof(&expect.secret, nonce, &hello.proof) {
        return Err("cluster secret does not match".into());
    }
    if hello.rank != expect.rank || hello.layers != expect.layers || hello.n_ranks != expect.n_ranks
    {
        let with_n = hello.n_ranks != expect.n_ranks;
        return Err(format!(
            "expected {}, this is {}",
            describe(hello.rank, hello.layers, hello.n_ranks, with_n),
            describe(expect.rank, expect.layers, expect.n_ranks, with_n)
        ));
    }
    if hello.role == LinkRole::Data && hello.transport != expect.transport {
        return Err(format!(
            "transport {}, this rank's data link runs on {} (--transport)",
            hello.transport, expect.transport
        ));
    }
    Ok(())
}

fn describe(rank: u32, layers: [u32; 2], n_ranks: u32, with_n: bool) -> String {
    let of = if with_n {
        format!(" of {n_ranks}")
    } else {
        String::new()
    };
    format!("rank {rank}{of} holding blocks {}-{}", layers[0], layers[1])
}

/// Two hashes for a message: 12-character prefixes when those differ, else the whole strings
/// (cut to 80 characters, since one of them comes from the peer).
fn shorten_pair(a: &str, b: &str) -> (String, String) {
    let cut = |s: &str, n: usize| -> String {
        if s.chars().count() > n {
            s.chars().take(n).chain(['…']).collect()
        } else {
            s.to_string()
        }
    };
    let (sa, sb) = (cut(a, 12), cut(b, 12));
    if !sa.eq_ignore_ascii_case(&sb) {
        (sa, sb)
    } else {
        (cut(a, 80), cut(b, 80))
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let (pairs, rest) = s.as_bytes().as_chunks::<2>();
    if !rest.is_empty() {
        return None;
    }
    pairs
        .iter()
        .map(|[hi, lo]| Some(digit(*hi)? << 4 | digit(*lo)?))
        .collect()
}

/// Writes one frame in a single `write` (handshake frames are small; one segment, no Nagle wait).
fn send_raw(mut stream: &TcpStream, msg: &Message) -> Result<(), FrameError> {
    let mut buf = Vec::with_capacity(256);
    frame::write_frame(&mut buf, msg, &[])?;
    stream.write_all(&buf)?;
    stream.flush()?;
    Ok(())
}

/// Reads one handshake frame whatever its version. On a parse failure of a frame from another
/// version, the error says which version the peer speaks.
fn read_any_version(mut stream: &TcpStream) -> Result<frame::Frame, FrameError> {
    let header = frame::read_header(&mut stream)?;
    frame::read_payload(&mut stream, &header).map_err(|e| match e {
        FrameError::Invalid(_) if header.version != WIRE_VERSION => FrameError::Invalid(format!(
            "protocol version {}, this rank speaks {WIRE_VERSION}",
            header.version
        )),
        e => e,
    })
}

fn message_name(msg: &Message) -> &'static str {
    frame::kind_name(frame::kind_of(msg))
}

/// The listener's side, on a freshly accepted stream: challenge, read and check the `Hello`,
/// refuse or (data link) acknowledge. Returns the dialer's `Hello`.
pub(crate) fn listen_side(
    stream: &TcpStream,
    expect: &Expected,
    timeout: Duration,
) -> Result<Hello> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let io_fail = |e: FrameError| Error::Transport(format!("handshake with {peer} failed: {e}"));
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| io_fail(e.into()))?;

    let nonce = new_nonce();
    send_raw(
        stream,
        &Message::Challenge {
            nonce: nonce.clone(),
        },
    )
    .map_err(io_fail)?;
    let hello = match read_any_version(stream) {
        Ok(f) => match f.message {
            Message::Hello(h) => h,
            other => {
                return Err(refuse(
                    stream,
                    format!("expected Hello, got {}", message_name(&other)),
                ))
            }
        },
        Err(FrameError::Invalid(reason)) => return Err(refuse(stream, reason)),
        Err(e) => return Err(io_fail(e)),
    };
    if let Err(reason) = check_hello(&hello, &nonce, expect) {
        return Err(refuse(stream, reason));
    }
    if hello.role == LinkRole::Data {
        send_raw(stream, &Message::Ready { rank: expect.rank }).map_err(io_fail)?;
    }
    Ok(hello)
}

/// Sends `Refused{reason}` (best effort), ends the stream, and makes the error for the caller.
fn refuse(stream: &TcpStream, reason: String) -> Error {
    let _ = send_raw(
        stream,
        &Message::Refused {
            reason: reason.clone(),
        },
    );
    let _ = stream.shutdown(Shutdown::Write);
    Error::HandshakeRefused(reason)
}

/// One failed attempt: worth retrying (the peer may not be up yet) or final.
enum Attempt {
    Retry(String),
    Final(Error),
}

/// Connects to the rank listening at `addr` and runs the dialer's side of the handshake, retrying
/// for `opts.retry_for` while the peer is not up. Returns once the listener has answered; that
/// answer (`Welcome` on a control link, `Ready` on a data link) is the first message `recv`
/// returns. A refusal is [`Error::HandshakeRefused`] with the listener's reason, at once.
pub fn dial(
    addr: &str,
    hello: &HelloFields,
    secret: &[u8],
    opts: &DialOptions,
) -> Result<Arc<TcpTransport>> {
    opts.link.validate()?;
    let start = Instant::now();
    let deadline = start + opts.retry_for;
    let mut backoff = Duration::from_millis(50);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let last = match dial_once(addr, hello, secret, opts, deadline) {
            Ok(t) => return Ok(t),
            Err(Attempt::Final(e)) => return Err(e),
            Err(Attempt::Retry(reason)) => reason,
        };
        let now = Instant::now();
        if now + backoff >= deadline {
            return Err(Error::Transport(format!(
                "could not reach rank {} at {addr} within {:.1} s ({attempts} attempts); last error: {last}",
                hello.rank,
                (now - start).as_secs_f64()
            )));
        }
        tracing::debug!(%addr, attempt = attempts, "rank not reachable yet: {last}");
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn dial_once(
    addr: &str,
    fields: &HelloFields,
    secret: &[u8],
    opts: &DialOptions,
    deadline: Instant,
) -> std::result::Result<Arc<TcpTransport>, Attempt> {
    let stream = connect(addr, opts.connect_timeout, deadline)?;
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| addr.to_string());
    let _ = stream.set_nodelay(true);
    let io_retry = |e: FrameError| match e {
        FrameError::Invalid(reason) => Attempt::Final(Error::Transport(format!(
            "handshake with {peer}: bad frame: {reason}"
        ))),
        e => Attempt::Retry(format!("handshake with {peer}: {e}")),
    };
    let set_deadline = |until: Instant| -> std::result::Result<(), Attempt> {
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        stream
            .set_read_timeout(Some(left))
            .and_then(|()| stream.set_write_timeout(Some(left)))
            .map_err(|e| Attempt::Retry(format!("socket options: {e}")))
    };
    let unexpected = |what: &str, msg: &Message| {
        Attempt::Final(Error::Transport(format!(
            "handshake with {peer}: expected {what}, got {}",
            message_name(msg)
        )))
    };

    // The challenge may wait for the listener to get round to accepting.
    set_deadline(deadline.max(Instant::now() + opts.handshake_timeout))?;
    let nonce = match read_any_version(&stream).map_err(io_retry)?.message {
        Message::Challenge { nonce } => nonce,
        Message::Refused { reason } => return Err(Attempt::Final(Error::HandshakeRefused(reason))),
        other => return Err(unexpected("Challenge", &other)),
    };

    let until = Instant::now() + opts.handshake_timeout;
    set_deadline(until)?;
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        role: fields.role,
        model_sha256: fields.model_sha256.clone(),
        rank: fields.rank,
        layers: fields.layers,
        n_ranks: fields.n_ranks,
        transport: fields.transport,
        proof: proof(secret, &nonce),
    };
    send_raw(&stream, &Message::Hello(hello)).map_err(io_retry)?;

    let mut heard = Heard {
        at: Instant::now(),
        status: None,
    };
    let answer = loop {
        set_deadline(until)?;
        let frame = match read_any_version(&stream) {
            Ok(f) => f,
            // A timeout here means the listener accepted but never answered: not worth a retry
            // that would only find the same listener.
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Attempt::Final(Error::Transport(format!(
                    "handshake with {peer}: no answer to Hello within {:?}",
                    opts.handshake_timeout
                ))))
            }
            Err(e) => return Err(io_retry(e)),
        };
        heard.at = Instant::now();
        match frame.message {
            Message::Heartbeat(status) => heard.status = status,
            m @ (Message::Welcome(_) | Message::Ready { .. }) => break m,
            Message::Refused { reason } => {
                return Err(Attempt::Final(Error::HandshakeRefused(reason)))
            }
            Message::Fatal { reason } => {
                return Err(Attempt::Final(Error::Transport(format!(
                    "rank at {peer} reported a fatal error during the handshake: {reason}"
                ))))
            }
            other => return Err(unexpected("Welcome or Ready", &other)),
        }
    };
    TcpTransport::start(stream, &opts.link, Some(answer), heard).map_err(Attempt::Final)
}

/// One connection attempt to each address `addr` resolves to, within the deadline.
fn connect(
    addr: &str,
    timeout: Duration,
    deadline: Instant,
) -> std::result::Result<TcpStream, Attempt> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Attempt::Retry(format!("cannot resolve {addr}: {e}")))?
        .collect();
    let mut last = format!("{addr} resolves to no address");
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = timeout.min(left).max(Duration::from_millis(10));
        match TcpStream::connect_timeout(&a, limit) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("connect to {a}: {e}"),
        }
    }
    Err(Attempt::Retry(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> Expected {
        Expected {
            model_sha256: "def0123456789abcdef".into(),
            rank: 2,
            layers: [15, 29],
            n_ranks: 3,
            transport: LinkTransport::Tcp,
            secret: b"s3cret".to_vec(),
        }
    }

    fn hello_for(nonce: &str, secret: &[u8]) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            role: LinkRole::Data,
            model_sha256: "DEF0123456789ABCDEF".into(),
            rank: 2,
            layers: [15, 29],
            n_ranks: 3,
            transport: LinkTransport::Tcp,
            proof: proof(secret, nonce),
        }
    }

    #[test]
    fn checks_in_order_and_names_the_difference() {
        let e = expected();
        let n = new_nonce();
        assert_eq!(check_hello(&hello_for(&n, b"s3cret"), &n, &e), Ok(()));

        let mut h = hello_for(&n, b"wrong");
        h.protocol = PROTOCOL_VERSION + 1;
        h.model_sha256 = "abc".into();
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            format!(
                "protocol version {}, this rank speaks {PROTOCOL_VERSION}",
                PROTOCOL_VERSION + 1
            )
        );
        h.protocol = PROTOCOL_VERSION;
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            "model sha256 abc differs from this rank's def012345678…"
        );
        h.model_sha256 = e.model_sha256.clone();
        h.rank = 9;
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            "cluster secret does not match"
        );
        h.proof = proof(b"s3cret", &n);
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            "expected rank 9 holding blocks 15-29, this is rank 2 holding blocks 15-29"
        );
        h.rank = 2;
        h.layers = [20, 29];
        h.n_ranks = 4;
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            "expected rank 2 of 4 holding blocks 20-29, this is rank 2 of 3 holding blocks 15-29"
        );
        // A proof for another nonce, or not hex at all, does not verify.
        let mut h = hello_for(&new_nonce(), b"s3cret");
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            "cluster secret does not match"
        );
        h.proof = "zz".into();
        assert_eq!(
            check_hello(&h, &n, &e).unwrap_err(),
            "cluster secret does not match"
        );
    }

    #[test]
    fn long_hashes_are_shortened_unless_prefixes_match() {
        let a = "a".repeat(64);
        let b = format!("{}b", "a".repeat(63));
        assert_eq!(shorten_pair(&a, &b), (a.clone(), b.clone()));
        let (x, y) = shorten_pair("0123456789abcdef", "fedcba9876543210");
        assert_eq!((x.as_str(), y.as_str()), ("0123456789ab…", "fedcba987654…"));
        // Non-ASCII from a peer never panics.
        let _ = shorten_pair(&"é".repeat(100), "x");
    }

    #[test]
    fn nonces_are_fresh_and_hex() {
        let a = new_nonce();
        let b = new_nonce();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(unhex(&a).is_some());
        assert_eq!(unhex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(unhex("0"), None);
        assert_eq!(hex(&[0, 255, 16]), "00ff10");
        // RFC 4231 test case 2.
        assert_eq!(
            proof(b"Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
