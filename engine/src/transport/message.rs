//! The messages ranks exchange. Headers are small and self-describing; activations travel as
//! raw little-endian tensors next to them (see `frame`).

use serde::{Deserialize, Serialize};

use super::rdma::QpInfo;
use crate::generate::{Shaping, TokenLogprob};

/// Bumped whenever a message changes meaning; the handshake refuses a mismatch. (2: the hello
/// names the transport, and RDMA links exchange `Rdma` messages.)
pub const PROTOCOL_VERSION: u32 = 2;

/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkRole {
    /// Rank 0 to rank k: set-up, status, heartbeats, and sampled tokens back from the last rank.
    Control,
    /// Rank k to rank k+1: activations and releases, in order.
    Data,
}

/// What carries a data link's messages once the handshake is done. Control links are TCP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkTransport {
    /// The TCP connection itself.
    #[default]
    Tcp,
    /// A reliable-connected RDMA queue pair, set up over the TCP connection (which keeps the
    /// heartbeats and the receive credits).
    Rdma,
}

impl std::fmt::Display for LinkTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Rdma => "rdma",
        })
    }
}

/// The dialer's half of the handshake: who it expects to find at the other end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub role: LinkRole,
    /// Hex sha256 of the GGUF file both sides must serve.
    pub model_sha256: String,
    /// The rank the dialer expects to reach, and the blocks it expects that rank to hold
    /// (`first..=last`).
    pub rank: u32,
    pub layers: [u32; 2],
    /// Ranks in the pipeline.
    pub n_ranks: u32,
    /// What the link runs on after the handshake (data links; control links are TCP).
    #[serde(default)]
    pub transport: LinkTransport,
    /// HMAC-SHA256 over the listener's challenge nonce, keyed by the cluster secret (hex).
    pub proof: String,
}

/// What a rank can hold, reported when it accepts a control link.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub rank: u32,
    pub layers: [u32; 2],
    pub weight_bytes: u64,
    /// KV blocks this rank could allocate under its own memory limit.
    pub kv_blocks_capacity: u64,
}

/// Rank 0's instructions after the handshake.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    /// KV blocks every rank allocates (the minimum of the ranks' capacities).
    pub kv_blocks: u64,
    /// Where the next rank listens, and the blocks it holds; `None` for the last rank.
    pub next: Option<NextRank>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextRank {
    pub addr: String,
    pub rank: u32,
    pub layers: [u32; 2],
}

/// How the last rank picks one sequence's next token. Stateless but for what the last rank
/// keeps per sequence until it is released: the RNG (seeded from `seed`) and, for the
/// penalties, the tokens it sampled and the prompt it was given with the first sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleSpec {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub seed: u64,
    /// Token ids whose logits are masked out for this step (end-of-turn tokens before
    /// `min_tokens`, or always with `ignore_eos`).
    pub suppress: Vec<u32>,
    /// Bias, penalties and min-p.
    #[serde(default)]
    pub shaping: Shaping,
    /// Report the chosen token's log-probability and this many alternatives'.
    #[serde(default)]
    pub logprobs: Option<u32>,
    /// The prompt, for the repetition penalty: sent with a sequence's first sample only.
    #[serde(default)]
    pub prompt: Vec<u32>,
    /// The tokens a grammar allows at this step (structured outputs); `None` allows all.
    #[serde(default)]
    pub allow: Option<TokenMask>,
}

/// A set of token ids, in whichever form is shortest on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenMask {
    /// Only these ids.
    Only(Vec<u32>),
    /// Every id but these (below `vocab`).
    Except { vocab: u32, ids: Vec<u32> },
    /// Bit `i % 64` of word `i / 64` set when id `i` is allowed.
    Bits(Vec<u64>),
}

/// One sequence's rows in a micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeqChunk {
    pub seq: u64,
    /// Rows of the batch (consecutive, in `seqs` order).
    pub len: u32,
    /// Position of the first row.
    pub pos: u32,
    /// The sequence's whole block table (identical on every rank).
    pub blocks: Vec<u32>,
    /// Present when the last row must be sampled (the end of a prefill, or a decode step).
    pub sample: Option<SampleSpec>,
}

/// Activations of one micro-batch on their way down the pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Forward {
    pub batch: u64,
    pub seqs: Vec<SeqChunk>,
    /// Total rows (sum of `len`); the tensor is `rows × d_model`.
    pub rows: u32,
    /// KV blocks in use on rank 0 after this batch was scheduled (so every rank reports the same).
    pub kv_blocks_used: u64,
    /// W3C traceparent of the batch's first request, for the ranks' spans.
    pub traceparent: Option<String>,
}

/// The last rank's answer for a micro-batch: one token per sequence that asked for a sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    pub batch: u64,
    pub tokens: Vec<(u64, u32)>,
    /// The log-probabilities of the sequences that asked for them.
    #[serde(default)]
    pub logprobs: Vec<(u64, TokenLogprob)>,
}

/// A rank's state, sent with each heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankStatus {
    pub rank: u32,
    pub kv_blocks_total: u64,
    pub kv_blocks_used: u64,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
}

/// What the two sides of an RDMA link tell each other over its TCP connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RdmaControl {
    /// This side's queue pair (sent once each way, after the handshake).
    QueuePair(QpInfo),
    /// This side's queue pair is connected to the peer's: the peer may send.
    Connected,
    /// This side consumed and re-posted `slots` receive slots: the peer may send that many more.
    Credit { slots: u32 },
}

/// Every message of the protocol. `Forward` carries a tensor body; no other message does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// Listener → dialer, first: a nonce for the proof.
    Challenge {
        nonce: String,
    },
    Hello(Hello),
    Welcome(Welcome),
    /// Either side: the handshake failed; the text names what differs.
    Refused {
        reason: String,
    },
    Setup(Setup),
    /// A rank finished set-up (its data link to the next rank is up).
    Ready {
        rank: u32,
    },
    Forward(Forward),
    Sampled(Sampled),
    /// Forget these sequences' sampler state; `kv_blocks_used` is rank 0's count after
    /// freeing their blocks (so every rank keeps reporting the same use).
    Release {
        seqs: Vec<u64>,
        kv_blocks_used: u64,
    },
    Heartbeat(Option<RankStatus>),
    /// An RDMA link's set-up and flow control, on its TCP connection.
    Rdma(RdmaControl),
    /// A rank hit an error it cannot recover from.
    Fatal {
        reason: String,
    },
    Shutdown,
}
