//! The wire format between ranks.
//!
//! Every message travels as one frame:
//!
//! ```text
//! offset  size  field
//!      0     4  magic  b"SLCE"
//!      4     2  version        u16 LE  (= PROTOCOL_VERSION)
//!      6     2  kind           u16 LE  (which Message variant; see `kind_of`)
//!      8     4  header length  u32 LE  (bytes of JSON that follow, 1 ..= 1 MiB)
//!     12     8  body length    u64 LE  (raw bytes after the JSON, 0 ..= 1 GiB)
//!     20     …  the Message as JSON (serde_json)
//!      …     …  the body: for `Forward`, the activations as little-endian f32, rows × d_model
//! ```
//!
//! Only `Forward` carries a body; any other kind with a non-empty body is rejected. Reading
//! never panics on bad input: a wrong magic, another version, an over-limit length, JSON that
//! doesn't parse, a kind that doesn't match its JSON, and a stream that ends inside a frame are
//! all errors. A stream that ends cleanly *between* frames is [`FrameError::Closed`].

use std::io::{self, Read, Write};

use super::message::{Message, PROTOCOL_VERSION};
use crate::error::{Error, Result};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"SLCE";
/// Bytes of the fixed header before the JSON.
pub const FIXED_HEADER_LEN: usize = 20;
/// The version every frame this build writes carries, and the only one [`read_frame`] accepts.
pub const WIRE_VERSION: u16 = PROTOCOL_VERSION as u16;
const _: () = assert!(
    PROTOCOL_VERSION <= u16::MAX as u32,
    "protocol version must fit in u16"
);
/// Largest JSON message header accepted (1 MiB).
pub const MAX_HEADER_BYTES: u32 = 1 << 20;
/// Largest body accepted (1 GiB).
pub const MAX_BODY_BYTES: u64 = 1 << 30;

/// Bodies are read in pieces of at most this many bytes, so a header that announces a large body
/// the peer never sends cannot make the reader allocate more than it has received plus this.
const BODY_READ_CHUNK: usize = 16 << 20;

/// Frame kinds, one per [`Message`] variant. Numbers are part of the wire format: never reuse one.
pub mod kind {
    pub const CHALLENGE: u16 = 1;
    pub const HELLO: u16 = 2;
    pub const WELCOME: u16 = 3;
    pub const REFUSED: u16 = 4;
    pub const SETUP: u16 = 5;
    pub const READY: u16 = 6;
    pub const FORWARD: u16 = 7;
    pub const SAMPLED: u16 = 8;
    pub const RELEASE: u16 = 9;
    pub const HEARTBEAT: u16 = 10;
    pub const FATAL: u16 = 11;
    pub const SHUTDOWN: u16 = 12;
    pub const RDMA: u16 = 13;
}

/// The frame kind of a message.
pub fn kind_of(msg: &Message) -> u16 {
    match msg {
        Message::Challenge { .. } => kind::CHALLENGE,
        Message::Hello(_) => kind::HELLO,
        Message::Welcome(_) => kind::WELCOME,
        Message::Refused { .. } => kind::REFUSED,
        Message::Setup(_) => kind::SETUP,
        Message::Ready { .. } => kind::READY,
        Message::Forward(_) => kind::FORWARD,
        Message::Sampled(_) => kind::SAMPLED,
        Message::Release { .. } => kind::RELEASE,
        Message::Heartbeat(_) => kind::HEARTBEAT,
        Message::Fatal { .. } => kind::FATAL,
        Message::Shutdown => kind::SHUTDOWN,
        Message::Rdma(_) => kind::RDMA,
    }
}

/// A readable name for a frame kind, for error messages.
pub fn kind_name(kind: u16) -> &'static str {
    match kind {
        kind::CHALLENGE => "Challenge",
        kind::HELLO => "Hello",
        kind::WELCOME => "Welcome",
        kind::REFUSED => "Refused",
        kind::SETUP => "Setup",
        kind::READY => "Ready",
        kind::FORWARD => "Forward",
        kind::SAMPLED => "Sampled",
        kind::RELEASE => "Release",
        kind::HEARTBEAT => "Heartbeat",
        kind::FATAL => "Fatal",
        kind::SHUTDOWN => "Shutdown",
        kind::RDMA => "Rdma",
        _ => "unknown",
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended cleanly at a frame boundary (the peer closed the connection).
    #[error("connection closed")]
    Closed,
    /// The stream ended inside a frame.
    #[error("truncated frame: the stream ended after {got} of {want} bytes of the {part}")]
    Truncated {
        part: &'static str,
        got: u64,
        want: u64,
    },
    /// The underlying stream failed (this includes read and write timeouts).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Bytes that are not a valid frame, or a message that may not be framed as given.
    #[error("{0}")]
    Invalid(String),
}

impl From<FrameError> for Error {
    fn from(e: FrameError) -> Self {
        Error::Transport(e.to_string())
    }
}

/// The fixed part of a frame, validated for magic and length limits but not for version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u16,
    pub kind: u16,
    pub header_len: u32,
    pub body_len: u64,
}

impl FrameHeader {
    fn encode(&self) -> [u8; FIXED_HEADER_LEN] {
        let mut out = [0u8; FIXED_HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&self.kind.to_le_bytes());
        out[8..12].copy_from_slice(&self.header_len.to_le_bytes());
        out[12..20].copy_from_slice(&self.body_len.to_le_bytes());
        out
    }

    fn decode(b: &[u8; FIXED_HEADER_LEN]) -> Result<Self, FrameError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(FrameError::Invalid(format!(
                "bad frame magic {:?} (bytes {magic:02x?}), expected \"SLCE\": \
                 the peer does not speak the sluice rank protocol",
                String::from_utf8_lossy(&magic)
            )));
        }
        let header = FrameHeader {
            version: u16::from_le_bytes([b[4], b[5]]),
            kind: u16::from_le_bytes([b[6], b[7]]),
            header_len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            body_len: u64::from_le_bytes([b[12], b[13], b[14], b[15], b[16], b[17], b[18], b[19]]),
        };
        if header.header_len == 0 {
            return Err(FrameError::Invalid(
                "frame with an empty message header".into(),
            ));
        }
        if header.header_len > MAX_HEADER_BYTES {
            return Err(FrameError::Invalid(format!(
                "message header of {} bytes exceeds the {MAX_HEADER_BYTES}-byte limit",
                header.header_len
            )));
        }
        if header.body_len > MAX_BODY_BYTES {
            return Err(FrameError::Invalid(format!(
                "frame body of {} bytes exceeds the {MAX_BODY_BYTES}-byte limit",
                header.body_len
            )));
        }
        Ok(header)
    }
}

/// The whole length (fixed header, JSON and body) of the frame that `prefix` begins, once its
/// fixed header is in (`None` before): a reader that gathers a frame in pieces (the RDMA link's
/// fragments) bounds what it keeps by it. Errors as [`read_frame`] on a bad magic or an
/// over-limit length.
pub fn announced_len(prefix: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(fixed) = prefix.first_chunk::<FIXED_HEADER_LEN>() else {
        return Ok(None);
    };
    let h = FrameHeader::decode(fixed)?;
    // Within the limits: at most 20 + 1 MiB + 1 GiB, which fits a 64-bit usize.
    Ok(Some(
        FIXED_HEADER_LEN + h.header_len as usize + h.body_len as usize,
    ))
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// The version the frame was written with (always [`WIRE_VERSION`] from [`read_frame`]).
    pub version: u16,
    pub message: Message,
    pub body: Vec<u8>,
}

/// Writes one frame with this build's version. Does not flush.
pub fn write_frame<W: Write + ?Sized>(
    w: &mut W,
    msg: &Message,
    body: &[u8],
) -> Result<(), FrameError> {
    write_frame_with_version(w, WIRE_VERSION, msg, body)
}

/// Writes one frame claiming `version` (tests and compatibility checks use other versions).
pub fn write_frame_with_version<W: Write + ?Sized>(
    w: &mut W,
    version: u16,
    msg: &Message,
    body: &[u8],
) -> Result<(), FrameError> {
    let kind = kind_of(msg);
    if kind != kind::FORWARD && !body.is_empty() {
        return Err(FrameError::Invalid(format!(
            "a {} message cannot carry a body ({} bytes given); only Forward does",
            kind_name(kind),
            body.len()
        )));
    }
    let body_len = body.len() as u64;
    if body_len > MAX_BODY_BYTES {
        return Err(FrameError::Invalid(format!(
            "frame body of {body_len} bytes exceeds the {MAX_BODY_BYTES}-byte limit"
        )));
    }
    let json = serde_json::to_vec(msg).map_err(|e| {
        FrameError::Invalid(format!("cannot encode {} message: {e}", kind_name(kind)))
    })?;
    let header_len = u32::try_from(json.len())
        .ok()
        .filter(|&n| n <= MAX_HEADER_BYTES)
        .ok_or_else(|| {
            FrameError::Invalid(format!(
                "{} message header of {} bytes exceeds the {MAX_HEADER_BYTES}-byte limit",
                kind_name(kind),
                json.len()
            ))
        })?;
    let fixed = FrameHeader {
        version,
        kind,
        header_len,
        body_len,
    }
    .encode();
    w.write_all(&fixed)?;
    w.write_all(&json)?;
    if !body.is_empty() {
        w.write_all(body)?;
    }
    Ok(())
}

/// Reads the fixed header of the next frame, checking magic and limits (not the version).
/// A stream that ends before the first byte is [`FrameError::Closed`].
pub fn read_header<R: Read + ?Sized>(r: &mut R) -> Result<FrameHeader, FrameError> {
    let mut fixed = [0u8; FIXED_HEADER_LEN];
    let got = read_full(r, &mut fixed)?;
    if got == 0 {
        return Err(FrameError::Closed);
    }
    if got < FIXED_HEADER_LEN {
        return Err(FrameError::Truncated {
            part: "frame header",
            got: got as u64,
            want: FIXED_HEADER_LEN as u64,
        });
    }
    FrameHeader::decode(&fixed)
}

/// Reads the JSON message and body that follow `header`, whatever its version, checking that the
/// message matches the frame kind and that only `Forward` carries a body.
pub fn read_payload<R: Read + ?Sized>(
    r: &mut R,
    header: &FrameHeader,
) -> Result<Frame, FrameError> {
    // header_len <= MAX_HEADER_BYTES (1 MiB) was checked by `read_header`.
    let mut json = vec![0u8; header.header_len as usize];
    let got = read_full(r, &mut json)?;
    if got < json.len() {
        return Err(FrameError::Truncated {
            part: "message header",
            got: got as u64,
            want: json.len() as u64,
        });
    }
    let message: Message = serde_json::from_slice(&json).map_err(|e| {
        FrameError::Invalid(format!(
            "{} frame (version {}) carries a message that does not parse: {e}",
            kind_name(header.kind),
            header.version
        ))
    })?;
    let actual = kind_of(&message);
    if actual != header.kind {
        return Err(FrameError::Invalid(format!(
            "frame kind {} ({}) carries a {} message",
            header.kind,
            kind_name(header.kind),
            kind_name(actual)
        )));
    }
    if actual != kind::FORWARD && header.body_len != 0 {
        return Err(FrameError::Invalid(format!(
            "a {} frame announces a {}-byte body; only Forward carries one",
            kind_name(actual),
            header.body_len
        )));
    }
    let body = read_body(r, header.body_len)?;
    Ok(Frame {
        version: header.version,
        message,
        body,
    })
}

/// Reads one frame, rejecting any version but [`WIRE_VERSION`].
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<Frame, FrameError> {
    let header = read_header(r)?;
    if header.version != WIRE_VERSION {
        return Err(FrameError::Invalid(format!(
            "frame of protocol version {}, this rank speaks {WIRE_VERSION}",
            header.version
        )));
    }
    read_payload(r, &header)
}

/// Reads a body of `len` bytes (at most [`MAX_BODY_BYTES`], checked by the caller), growing the
/// buffer as bytes arrive rather than trusting the announced length up front.
fn read_body<R: Read + ?Sized>(r: &mut R, len: u64) -> Result<Vec<u8>, FrameError> {
    let want = usize::try_from(len)
        .map_err(|_| FrameError::Invalid(format!("frame body of {len} bytes is too large")))?;
    let mut body = Vec::new();
    while body.len() < want {
        let start = body.len();
        let end = start + (want - start).min(BODY_READ_CHUNK);
        body.resize(end, 0);
        let got = read_full(r, &mut body[start..end])?;
        if got < end - start {
            return Err(FrameError::Truncated {
                part: "body",
                got: (start + got) as u64,
                want: len,
            });
        }
    }
    Ok(body)
}

/// Fills `buf` as far as the stream allows; returns how many bytes were read (less than
/// `buf.len()` only at end of stream). Retries on `Interrupted`.
fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Encodes f32 values as little-endian bytes (the `Forward` body format).
pub fn f32_to_le_bytes(values: &[f32]) -> Vec<u8> {
    // Exact-size (flattening fixed-size arrays), so `collect` allocates once and writes without
    // zeroing first or checking capacity per element.
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Decodes little-endian f32 values (the `Forward` body format). Fails when the length is not a
/// multiple of four.
pub fn le_bytes_to_f32(bytes: &[u8]) -> Result<Vec<f32>> {
    let (chunks, rest) = bytes.as_chunks::<4>();
    if !rest.is_empty() {
        return Err(odd_length(bytes.len()));
    }
    Ok(chunks.iter().map(|c| f32::from_le_bytes(*c)).collect())
}

/// Decodes little-endian f32 values into an existing buffer of exactly `bytes.len() / 4` values.
pub fn le_bytes_into_f32(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let (chunks, rest) = bytes.as_chunks::<4>();
    if !rest.is_empty() {
        return Err(odd_length(bytes.len()));
    }
    if chunks.len() != out.len() {
        return Err(Error::Transport(format!(
            "tensor body holds {} f32 values, expected {}",
            chunks.len(),
            out.len()
        )));
    }
    for (dst, c) in out.iter_mut().zip(chunks) {
        *dst = f32::from_le_bytes(*c);
    }
    Ok(())
}

fn odd_length(len: usize) -> Error {
    Error::Transport(format!(
        "tensor body of {len} bytes is not a whole number of f32 values"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::message::{Forward, RankStatus, SeqChunk};
    use std::io::Cursor;

    fn forward(rows: u32) -> Message {
        Message::Forward(Forward {
            batch: 7,
            seqs: vec![SeqChunk {
                seq: 1,
                len: rows,
                pos: 0,
                blocks: vec![3, 4],
                sample: None,
            }],
            rows,
            kv_blocks_used: 2,
            traceparent: Some("00-abc-def-01".into()),
        })
    }

    fn encode(msg: &Message, body: &[u8]) -> Vec<u8> {
        let mut buf = Vec::new();
        write_frame(&mut buf, msg, body).unwrap();
        buf
    }

    #[test]
    fn round_trips_every_kind() {
        let msgs = vec![
            Message::Challenge { nonce: "ab".into() },
            Message::Refused {
                reason: "no".into(),
            },
            Message::Ready { rank: 3 },
            Message::Release {
                seqs: vec![1, 2],
                kv_blocks_used: 3,
            },
            Message::Heartbeat(Some(RankStatus {
                rank: 1,
                kv_blocks_total: 10,
                kv_blocks_used: 2,
                weight_bytes: 3,
                kv_bytes: 4,
            })),
            Message::Heartbeat(None),
            Message::Fatal { reason: "x".into() },
            Message::Shutdown,
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_frame(&mut buf, m, &[]).unwrap();
        }
        let body = f32_to_le_bytes(&[1.0, -2.5, f32::MIN_POSITIVE]);
        write_frame(&mut buf, &forward(1), &body).unwrap();
        let mut r = Cursor::new(buf);
        for m in &msgs {
            let f = read_frame(&mut r).unwrap();
            assert_eq!(&f.message, m);
            assert!(f.body.is_empty());
        }
        let f = read_frame(&mut r).unwrap();
        assert_eq!(f.message, forward(1));
        assert_eq!(f.body, body);
        assert!(matches!(read_frame(&mut r), Err(FrameError::Closed)));
    }

    #[test]
    fn header_layout_is_little_endian() {
        let buf = encode(&Message::Shutdown, &[]);
        assert_eq!(&buf[0..4], b"SLCE");
        assert_eq!(u16::from_le_bytes([buf[4], buf[5]]), WIRE_VERSION);
        assert_eq!(u16::from_le_bytes([buf[6], buf[7]]), kind::SHUTDOWN);
        let hl = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]) as usize;
        assert_eq!(&buf[20..20 + hl], b"\"Shutdown\"");
        assert_eq!(buf.len(), 20 + hl);
    }

    #[test]
    fn wrong_magic_is_an_error() {
        let mut r = Cursor::new(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec());
        let e = read_frame(&mut r).unwrap_err().to_string();
        assert!(e.contains("bad frame magic") && e.contains("GET "), "{e}");
    }

    #[test]
    fn wrong_version_is_an_error_but_readable_leniently() {
        let mut buf = Vec::new();
        write_frame_with_version(&mut buf, WIRE_VERSION + 1, &Message::Shutdown, &[]).unwrap();
        let e = read_frame(&mut Cursor::new(buf.clone()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("protocol version {}", WIRE_VERSION + 1)),
            "{e}"
        );
        let mut r = Cursor::new(buf);
        let h = read_header(&mut r).unwrap();
        assert_eq!(h.version, WIRE_VERSION + 1);
        assert_eq!(read_payload(&mut r, &h).unwrap().message, Message::Shutdown);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let body = f32_to_le_bytes(&[1.0; 64]);
        let full = encode(&forward(1), &body);
        for cut in 1..full.len() {
            let r = read_frame(&mut Cursor::new(&full[..cut]));
            assert!(
                matches!(r, Err(FrameError::Truncated { .. })),
                "cut at {cut}: {r:?}"
            );
        }
        assert!(matches!(
            read_frame(&mut Cursor::new(&full[..0])),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn limits_and_inconsistencies_are_errors() {
        let mut good = encode(&Message::Shutdown, &[]);
        // Header too long.
        let mut b = good.clone();
        b[8..12].copy_from_slice(&(MAX_HEADER_BYTES + 1).to_le_bytes());
        assert!(read_frame(&mut Cursor::new(b))
            .unwrap_err()
            .to_string()
            .contains("limit"));
        // Body too long.
        let mut b = good.clone();
        b[12..20].copy_from_slice(&(MAX_BODY_BYTES + 1).to_le_bytes());
        assert!(read_frame(&mut Cursor::new(b))
            .unwrap_err()
            .to_string()
            .contains("limit"));
        // Body on a kind that has none.
        let mut b = good.clone();
        b[12..20].copy_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        assert!(read_frame(&mut Cursor::new(b))
            .unwrap_err()
            .to_string()
            .contains("only Forward"));
        // Kind that doesn't match the JSON.
        let mut b = good.clone();
        b[6..8].copy_from_slice(&kind::READY.to_le_bytes());
        assert!(read_frame(&mut Cursor::new(b))
            .unwrap_err()
            .to_string()
            .contains("carries a Shutdown"));
        // JSON that doesn't parse.
        let n = good.len();
        good[n - 1] = b'{';
        assert!(read_frame(&mut Cursor::new(good))
            .unwrap_err()
            .to_string()
            .contains("does not parse"));
        // Empty header.
        let mut b = encode(&Message::Shutdown, &[]);
        b[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(read_frame(&mut Cursor::new(b)).is_err());
        // Writing a body on a message that has none.
        assert!(write_frame(&mut Vec::new(), &Message::Shutdown, &[1]).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        // A cheap deterministic fuzz: random bytes, and valid frames with random bytes flipped.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = encode(&forward(2), &f32_to_le_bytes(&[0.5; 8]));
        for _ in 0..2000 {
            let mut b = valid.clone();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % b.len();
                b[i] = next() as u8;
            }
            let _ = read_frame(&mut Cursor::new(b));
            let len = (next() % 64) as usize;
            let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = read_frame(&mut Cursor::new(junk));
        }
    }

    #[test]
    fn f32_helpers_are_bit_exact() {
        let v: Vec<f32> = (0..1000)
            .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761)))
            .chain([f32::NAN, -0.0, f32::INFINITY, f32::MIN, f32::MAX])
            .collect();
        let b = f32_to_le_bytes(&v);
        assert_eq!(b.len(), v.len() * 4);
        assert_eq!(&b[0..4], &v[0].to_le_bytes());
        let back = le_bytes_to_f32(&b).unwrap();
        assert!(v.iter().zip(&back).all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut out = vec![0.0; v.len()];
        le_bytes_into_f32(&b, &mut out).unwrap();
        assert!(v.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(le_bytes_to_f32(&b[..5]).is_err());
        assert!(le_bytes_into_f32(&b, &mut out[1..]).is_err());
    }

    #[test]
    fn a_frame_s_announced_length_is_known_from_its_fixed_header() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &forward(2), &[0u8; 8]).unwrap();
        assert_eq!(announced_len(&buf[..FIXED_HEADER_LEN - 1]).unwrap(), None);
        assert_eq!(
            announced_len(&buf[..FIXED_HEADER_LEN]).unwrap(),
            Some(buf.len())
        );
        assert_eq!(announced_len(&buf).unwrap(), Some(buf.len()));
        // A body over the limit is refused from the fixed header alone.
        let over = FrameHeader {
            version: WIRE_VERSION,
            kind: kind::FORWARD,
            header_len: 10,
            body_len: MAX_BODY_BYTES + 1,
        };
        assert!(announced_len(&over.encode()).is_err());
        assert!(announced_len(b"HTTP/1.1 200 OK\r\n\r\n....").is_err());
    }
}
