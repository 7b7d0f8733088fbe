//! The Llama forward pass, written once against [`Backend`].
//!
//! A [`Llama`] holds one [`ModelPart`]: a range of blocks, plus the token embeddings if it is
//! the first part and the final norm and output head if it is the last. The whole model is
//! the part with everything; a pipeline rank holds a slice.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use super::config::LlamaConfig;
use super::gguf::GgufFile;
use crate::backend::{AttnShape, Backend, WeightSource};
use crate::error::{Error, Result};
use crate::kv::{KvSpec, SeqRows};

/// Which parts of the model one instance holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPart {
    pub layers: Range<usize>,
    pub embed: bool,
    pub head: bool,
}

impl ModelPart {
    pub fn full(n_layers: usize) -> Self {
        Self {
            layers: 0..n_layers,
            embed: true,
            head: true,
        }
    }
}

struct Block<W> {
    attn_norm: W,
    wq: W,
    wk: W,
    wv: W,
    wo: W,
    ffn_norm: W,
    w_gate: W,
    w_up: W,
    w_down: W,
}

struct Head<W> {
    norm: W,
    output: W,
}

/// Activation buffers for up to `rows` rows, grown on demand.
struct Scratch<B: Backend> {
    rows: usize,
    xn: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    att: B::Buf,
    proj: B::Buf,
    gate: B::Buf,
    up: B::Buf,
}

/// The output head's buffers for up to `rows` emitted rows, grown on demand: a decode step
/// reuses them (fresh batch x vocab logits every step were 5.9% of an avx2 batch-8 profile, in
/// the kernel's page zeroing).
struct HeadScratch<B: Backend> {
    rows: usize,
    picked: B::Buf,
    normed: B::Buf,
    logits: B::Buf,
}

/// What a forward pass keeps between calls: the KV store and scratch buffers.
pub struct ForwardState<B: Backend> {
    kv: B::Kv,
    kv_spec: KvSpec,
    scratch: Option<Scratch<B>>,
    head: Option<HeadScratch<B>>,
}

impl<B: Backend> std::fmt::Debug for ForwardState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardState")
            .field("kv", &self.kv_spec)
            .finish()
    }
}

impl<B: Backend> ForwardState<B> {
    pub fn kv_spec(&self) -> KvSpec {
        self.kv_spec
    }
}

/// A Llama model part on a backend.
pub struct Llama<B: Backend> {
    cfg: LlamaConfig,
    part: ModelPart,
    backend: Arc<B>,
    embed: Option<B::Weight>,
    blocks: Vec<Block<B::Weight>>,
    head: Option<Head<B::Weight>>,
    weight_bytes: u64,
}

impl<B: Backend> std::fmt::Debug for Llama<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Llama")
            .field("cfg", &self.cfg)
            .field("part", &self.part)
            .finish()
    }
}

impl<B: Backend> Llama<B> {
    /// Loads `part` of the model in `gguf` onto `backend`, checking every tensor's shape.
    pub fn load(gguf: Arc<GgufFile>, backend: Arc<B>, part: ModelPart) -> Result<Self> {
        let cfg = LlamaConfig::from_gguf(&gguf)?;
        if part.layers.end > cfg.n_layers || part.layers.start > part.layers.end {
            return Err(Error::InvalidRequest(format!(
                "layer range {:?} is outside the model's {} blocks",
                part.layers, cfg.n_layers
            )));
        }
        let mut weight_bytes = 0u64;
        let mut counted = std::collections::HashSet::new();
        let mut load = |name: &str, shape: &[usize]| -> Result<B::Weight> {
            let info = gguf.tensor_info(name)?.clone();
            let expected: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
            if info.shape != expected {
                return Err(Error::TensorShape {
                    name: name.to_owned(),
                    actual: info.shape,
                    expected,
                });
            }
            if counted.insert(name.to_owned()) {
                weight_bytes += info.n_bytes; // a tied tensor is mapped once
            }
            backend.weight(&WeightSource {
                gguf: gguf.clone(),
                info,
            })
        };
        let (d, kv, ff) = (cfg.d_model, cfg.kv_dim(), cfg.ffn_dim);
        let embed = if part.embed {
            Some(load("token_embd.weight", &[d, cfg.vocab_size])?)
        } else {
            None
        };
        let mut blocks = Vec::with_capacity(part.layers.len());
        for i in part.layers.clone() {
            let mut t = |n: &str, shape: &[usize]| load(&format!("blk.{i}.{n}.weight"), shape);
            blocks.push(Block {
                attn_norm: t("attn_norm", &[d])?,
                wq: t("attn_q", &[d, d])?,
                wk: t("attn_k", &[d, kv])?,
                wv: t("attn_v", &[d, kv])?,
                wo: t("attn_output", &[d, d])?,
                ffn_norm: t("ffn_norm", &[d])?,
                w_gate: t("ffn_gate", &[d, ff])?,
                w_up: t("ffn_up", &[d, ff])?,
                w_down: t("ffn_down", &[ff, d])?,
            });
        }
        let head = if part.head {
            let norm = load("output_norm.weight", &[d])?;
            // SmolLM2 ties the output head to the token embeddings.
            let name = if gguf.tensor_info("output.weight").is_ok() {
                "output.weight"
            } else {
                "token_embd.weight"
            };
            Some(Head {
                norm,
                output: load(name, &[d, cfg.vocab_size])?,
            })
        } else {
            None
        };
        Ok(Self {
            cfg,
            part,
            backend,
            embed,
            blocks,
            head,
            weight_bytes,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn part(&self) -> &ModelPart {
        &self.part
    }

    pub fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    /// Bytes of weights this part holds (a tensor used twice, like a tied head, counts once).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// A KV store with `n_blocks` blocks for this part's layers, and empty scratch.
    pub fn new_state(&self, n_blocks: usize) -> Result<ForwardState<B>> {
        let kv_spec = KvSpec {
            n_layers: self.blocks.len(),
            n_blocks,
            kv_dim: self.cfg.kv_dim(),
            head_dim: self.cfg.head_dim,
        };
        Ok(ForwardState {
            kv: self.backend.alloc_kv(kv_spec)?,
            kv_spec,
            scratch: None,
            head: None,
        })
    }

    /// A buffer for `rows` rows of hidden state.
    pub fn alloc_hidden(&self, rows: usize) -> B::Buf {
        self.backend.alloc(rows * self.cfg.d_model)
    }

    /// Token embeddings of `ids` into `hidden` (the first part only).
    pub fn embed(&self, ids: &[u32], hidden: &mut B::Buf) -> Result<()> {
        let table = self
            .embed
            .as_ref()
            .ok_or_else(|| Error::InvalidRequest("this model part has no embeddings".into()))?;
        self.backend.embed(table, ids, hidden)
    }

    /// Runs this part's blocks over `rows` rows of `hidden`, in place. `seqs` says which rows
    /// belong to which sequence and at which positions; their block tables must cover them.
    pub fn forward_blocks(
        &self,
        st: &mut ForwardState<B>,
        seqs: &[SeqRows<'_>],
        hidden: &mut B::Buf,
        rows: usize,
    ) {
        // The backend may replay a decode step from a graph (Backend::run_blocks).
        let d = self.cfg.d_model;
        self.backend
            .run_blocks(seqs, hidden, rows, d, &mut |seqs, hidden, rows| {
                self.blocks_pass(st, seqs, hidden, rows)
            });
    }

    fn blocks_pass(
        &self,
        st: &mut ForwardState<B>,
        seqs: &[SeqRows<'_>],
        hidden: &mut B::Buf,
        rows: usize,
    ) {
        let be = &*self.backend;
        let c = &self.cfg;
        let d = c.d_model;
        let positions: Vec<u32> = seqs
            .iter()
            .flat_map(|s| (s.pos..s.pos + s.len).map(|p| p as u32))
            .collect();
        debug_assert_eq!(positions.len(), rows);
        let s = self.scratch(&mut st.scratch, rows);
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        for (li, b) in self.blocks.iter().enumerate() {
            be.norm_matmul(
                hidden,
                &b.attn_norm,
                c.rms_eps,
                rows,
                &mut s.xn,
                &[&b.wq, &b.wk, &b.wv],
                &mut [&mut s.q, &mut s.k, &mut s.v],
            );
            be.rope(
                &mut s.q,
                &positions,
                c.n_heads,
                c.head_dim,
                c.rope_dims,
                c.rope_base,
            );
            be.rope(
                &mut s.k,
                &positions,
                c.n_kv_heads,
                c.head_dim,
                c.rope_dims,
                c.rope_base,
            );
            be.attention(&mut st.kv, li, shape, seqs, &s.q, &s.k, &s.v, &mut s.att);
            be.matmul_add(&b.wo, &s.att, rows, d, &mut s.proj, hidden);
            be.norm_matmul(
                hidden,
                &b.ffn_norm,
                c.rms_eps,
                rows,
                &mut s.xn,
                &[&b.w_gate, &b.w_up],
                &mut [&mut s.gate, &mut s.up],
            );
            be.swiglu_matmul_add(
                &mut s.gate,
                &mut s.up,
                &b.w_down,
                rows,
                c.ffn_dim,
                d,
                &mut s.proj,
                hidden,
            );
        }
    }

    /// Logits (`vocab_size` each, row-major) for the rows `emit` of `hidden` (the last part
    /// only), in `st`'s head buffers: valid until the next call.
    pub fn logits<'s>(
        &self,
        st: &'s mut ForwardState<B>,
        hidden: &B::Buf,
        emit: &[usize],
    ) -> Result<Cow<'s, [f32]>> {
        let head = self
            .head
            .as_ref()
            .ok_or_else(|| Error::InvalidRequest("this model part has no output head".into()))?;
        let be = &*self.backend;
        let (d, n, vocab) = (self.cfg.d_model, emit.len(), self.cfg.vocab_size);
        if st.head.as_ref().is_none_or(|h| h.rows < n) {
            let r = n.next_power_of_two();
            st.head = Some(HeadScratch {
                rows: r,
                picked: be.alloc(r * d),
                normed: be.alloc(r * d),
                logits: be.alloc(r * vocab),
            });
        }
        let h = st.head.as_mut().expect("just set");
        be.gather_rows(hidden, emit, d, &mut h.picked);
        be.norm_matmul(
            &h.picked,
            &head.norm,
            self.cfg.rms_eps,
            n,
            &mut h.normed,
            &[&head.output],
            &mut [&mut h.logits],
        );
        Ok(be.host_view(&h.logits, n * vocab))
    }

    /// The whole model in one call: embeddings, blocks and head, for a model holding all parts.
    pub fn forward<'s>(
        &self,
        st: &'s mut ForwardState<B>,
        ids: &[u32],
        seqs: &[SeqRows<'_>],
        emit: &[usize],
    ) -> Result<Cow<'s, [f32]>> {
        let mut hidden = self.alloc_hidden(ids.len());
        self.embed(ids, &mut hidden)?;
        self.forward_blocks(st, seqs, &mut hidden, ids.len());
        self.logits(st, &hidden, emit)
    }

    fn scratch<'s>(&self, slot: &'s mut Option<Scratch<B>>, rows: usize) -> &'s mut Scratch<B> {
        if slot.as_ref().is_none_or(|s| s.rows < rows) {
            let be = &*self.backend;
            let c = &self.cfg;
            let r = rows.next_power_of_two();
            *slot = Some(Scratch {
                rows: r,
                xn: be.alloc(r * c.d_model),
                q: be.alloc(r * c.d_model),
                k: be.alloc(r * c.kv_dim()),
                v: be.alloc(r * c.kv_dim()),
                att: be.alloc(r * c.d_model),
                proj: be.alloc(r * c.d_model),
                gate: be.alloc(r * c.ffn_dim),
                up: be.alloc(r * c.ffn_dim),
            });
        }
        slot.as_mut().expect("just set")
    }
}

#[cfg(test)]
mod tests;
