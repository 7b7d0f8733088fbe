//! Tiled attention on AMX (Sapphire Rapids and later): both small matrix products of a step
//! done by the tile unit's `tdpbf16ps`, which multiplies a 16 × 16 bf16 tile by a 16 × 16 one
//! into 16 × 16 f32 sums in one instruction (4,096 multiply-adds, against 32 for `vdpbf16ps`).
//! A step's 16 products take ~70 ns of the tile unit's time on model 167, while the vector unit
//! takes the softmax between them (~80 ns).
//!
//! The cache holds this kernel's operands as they are ([`super::KvFormat::Bf16Tiles`]): a block's
//! keys are its key tiles (rows of element pairs × 16 positions), its values rows of position
//! pairs × elements. Queries go in groups of 16 (a tile's rows), each scaled by `scale · log2 e`
//! and rounded once to bf16. Per group and step of 32 positions (two blocks):
//! - the scores, one product per 16 elements of the head and block (keys read in place), into
//!   tiles 0 and 1; the tile unit computes the next step's while the vector unit takes this
//!   one's softmax;
//! - each query's softmax step in base 2: a maximum more than [`SLACK`] above the running one
//!   rescales what came before by `2^(old - new)` (so weights reach at most `2^SLACK`, and the
//!   rescale, exact whenever it is done, is rare after the first steps); the weights
//!   `2^(score - max)` ([`exp2_16`]), rounded to bf16, are a row of the weights' tile;
//! - each block's values, read in place 16 elements a tile (a block that the call's last
//!   position cuts is copied once with zeros past it, [`Blocks`]), meet that block's weights:
//!   the weighted values accumulate in tiles 4 and up for the whole group, in f32.
//!
//! Every query runs the same operations in the same order whatever group, task or call it is in
//! (a tile row's sums depend on its own row alone, and zero weights or zero values add nothing),
//! so rows are batch invariant as in `flash512`, decode rows included: a decode step reads its
//! blocks once, unconverted, and runs no slower than `flash512`'s f32 (kernel_bench).
//!
//! The tile registers are no register class of Rust's `asm!`: the compiler never uses them, so
//! each `asm!` block below names them outright, and what one block leaves in a tile register the
//! next finds there. Linux hands the tile state to a process only on request ([`usable`] makes it
//! once); each thread loads the one tile configuration before its first product ([`configure`]).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::sync::OnceLock;

use super::flash::{Call, BLOCK};
use super::flash_bf16::bits;
use super::KvHead;

/// Queries in one product: a tile's rows.
const ROWS: usize = 16;
/// How far (base 2) a block's maximum may rise above the running one before the weights are
/// rescaled: the weights then stay below `2^8`, well inside bf16 and f32.
const SLACK: f32 = 8.0;

/// The tile configuration (palette 1). Each product takes 16 elements or positions (8 bf16
/// pairs), so that both of its factors are tiles of the cache's blocks as they are.
///
/// | tile | rows × bytes | holds |
/// | --- | --- | --- |
/// | 0, 1 | 16 × 64 | 16 queries' scores for the two blocks of a step (f32) |
/// | 2 | 16 × 32 | 16 queries, 16 elements; or their 16 weights of a block (bf16 pairs) |
/// | 3 | 8 × 64 | keys: 8 pairs of elements × 16 positions; or values: 8 pairs of positions × 16 elements (bf16 pairs) |
/// | 4..8 | 16 × 64 | 16 queries' weighted values, 16 elements each (f32) |
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        let (rows, bytes) = match t {
            2 => (ROWS, 32),
            3 => (PAIRS, 64),
            _ => (ROWS, 64),
        };
        c[16 + 2 * t] = bytes;
        c[48 + t] = rows as u8;
        t += 1;
    }
    Config(c)
};

/// Pairs in one product's sums: 16 elements of the head, or the 16 positions of a block.
const PAIRS: usize = BLOCK / 2;

/// Whether this CPU has AMX's tiles and bf16 products and the kernel lets this process use
/// them (asked once).
pub(super) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        // Leaf 7, subleaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE.
        #[allow(unused_unsafe)]
        // SAFETY: every x86_64 CPU has CPUID; leaf 7 reads as zeros where it is absent.
        let id = unsafe { __cpuid_count(7, 0) };
        id.edx & (1 << 22) != 0
            && id.edx & (1 << 24) != 0
            && request_tile_state()
            // SAFETY: the CPU has the tiles and bf16 products, and the state is granted.
            && unsafe { known_answer() }
    })
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`):
/// until then a thread's first tile instruction is a fault.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: this system call reads and writes no memory of the process; it only changes which
    // register state its threads may use. `syscall` clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

thread_local! {
    /// Whether this thread loaded [`CONFIG`].
    static CONFIGURED: Cell<bool> = const { Cell::new(false) };
}

/// Loads [`CONFIG`] on this thread, once: nothing else in the process configures tiles.
///
/// # Safety
/// [`usable`] said yes.
unsafe fn configure() {
    CONFIGURED.with(|done| {
        if !done.get() {
            // SAFETY: AMX is usable (caller's promise); `CONFIG` is 64 readable bytes.
            unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
            done.set(true);
        }
    });
}

/// Loads tile register `$t` from `$rows` rows `$stride` bytes apart from `$p`.
macro_rules! tile_load {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $p,
            s = in(reg) $stride,
            options(nostack, readonly),
        )
    };
}

/// Stores tile register `$t` to rows `$stride` bytes apart from `$p`.
macro_rules! tile_store {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(
            concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $p,
            s = in(reg) $stride,
            options(nostack),
        )
    };
}

/// `tmm$c += tmm$a · tmm$b` in bf16 pairs, f32 sums; or `tmm$c = 0`.
macro_rules! tile_op {
    (zero $c:literal) => {
        asm!(concat!("tilezero tmm", $c), options(nostack, nomem))
    };
    ($c:literal += $a:literal * $b:literal) => {
        asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem)
        )
    };
}

/// One product of known factors (16 × 16 ones by 16 × 16 twos: 32 in every sum), so that a
/// tile unit that runs but answers wrong (a hypervisor that keeps no tile state, say) is not
/// used. It leaves this thread configured.
///
/// # Safety
/// The CPU has AMX-TILE and AMX-BF16, and Linux granted the tile data state.
unsafe fn known_answer() -> bool {
    let ones = [0x3f80_3f80u32; 16 * 16];
    let twos = [0x4000_4000u32; 16 * 16];
    let mut sums = [0f32; 16 * 16];
    // SAFETY: the caller's promise; each buffer is 16 rows of 64 bytes (tile 2 reads 16 rows of
    // 32 of them, tile 3 8 rows of 64).
    unsafe {
        configure();
        tile_op!(zero 0);
        tile_load!(2, ones.as_ptr(), 64usize);
        tile_load!(3, twos.as_ptr(), 64usize);
        tile_op!(0 += 2 * 3);
        tile_store!(0, sums.as_mut_ptr(), 64usize);
    }
    sums.iter().all(|&x| x == 32.0)
}

/// Whether this kernel takes the shape: heads of 32 or 64 elements (the weighted values of 16
/// queries stay in two or four tile registers) in blocks of 16. Its cache is then
/// [`super::KvFormat::Bf16Tiles`]; other shapes at this level keep f16 and the other kernels.
pub(super) fn takes(hd: usize, block_size: usize) -> bool {
    block_size == BLOCK && matches!(hd, 32 | 64)
}

/// Runs a call on AMX.
///
/// # Safety
/// The CPU has AVX-512 F/BW/DQ/VL/BF16 and [`usable`] said yes; the shape is one [`takes`] and the
/// cache [`super::KvFormat::Bf16Tiles`]; the blocks of every position used lie inside both caches
/// (checked by [`super::attend_rows`]), `c.q` holds every row's heads, `out` holds the rows'
/// outputs.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
pub(super) unsafe fn run(kv: &KvHead, c: &Call, out: &mut [f32]) {
    // SAFETY: forwarded.
    unsafe {
        configure();
        match c.hd {
            32 => call::<2>(kv, c, out),
            _ => call::<4>(kv, c, out),
        }
    }
}

/// Positions a softmax step takes: two blocks, 32 weights a query, a full row of the weights'
/// tile.
const STEP: usize = 2 * BLOCK;

/// Stands for a block past the sequence's last (a step's second block when the blocks are odd
/// in number): zero keys for its scores, and a valid address for its values' loads, which read
/// nothing.
static NO_BLOCK: [u16; 64 * BLOCK] = [0; 64 * BLOCK];

/// Steps a group takes before the next group of its call takes the same ones: 1,024 positions,
/// whose keys and values (256 KiB at heads of 64) stay in L2 from the first group to the last.
const CHUNK: usize = 1024 / STEP;

/// Groups that share a call's chunks: a prefill task's 16 rows × 3 query heads a KV head.
const GROUPS: usize = 3;

/// As [`run`], with `c.hd == 16 * NV`, `NV` 2 or 4: the queries in groups of 16; the steps in
/// chunks of [`CHUNK`], each chunk taken by every group that reaches it before the next chunk.
/// A call's keys and values then come from memory once, not once a group: past ~6,000
/// positions a head's no longer stay in L2 from one group to the next. In the model's 8,192-token
/// prefill attention took 2.30–2.35 s a pass in chunks against 2.63–2.74 s without (model 167,
/// three passes each); at 4,096 the two were level (0.58–0.62 s).
///
/// # Safety
/// As [`run`], with this thread configured.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
unsafe fn call<const NV: usize>(kv: &KvHead, c: &Call, out: &mut [f32]) {
    // At least one query: `attend_rows` returns early on none.
    let nq = out.len() / c.hd;
    // The call's last query sees positions below `live`: past it a slot may hold anything.
    let live = c.n_ctx0 + (nq - 1) / c.heads;
    let blocks = Blocks::new(kv, live);
    // The groups go [`GROUPS`] at a time (all of a prefill task's), on the stack.
    for g0 in (0..nq).step_by(ROWS * GROUPS) {
        let mut groups: [Option<Group<NV>>; GROUPS] = std::array::from_fn(|_| None);
        for (g, slot) in groups.iter_mut().enumerate() {
            let i0 = g0 + g * ROWS;
            if i0 < nq {
                *slot = Some(Group::new(c, i0..nq.min(i0 + ROWS)));
            }
        }
        for from in (0..live.div_ceil(STEP)).step_by(CHUNK) {
            for group in groups.iter_mut().flatten() {
                let to = group.end().min(from + CHUNK);
                if from < to {
                    // SAFETY: this thread is configured; the caller's promises.
                    unsafe { group.run(&blocks, c, from..to) };
                }
            }
        }
        for group in groups.iter().flatten() {
            group.finish(c, out);
        }
    }
}

/// Where a call finds each block's keys and values: the cache's blocks below `live` (the call's
/// last limit), read in place; past it [`NO_BLOCK`]. A block that `live` cuts has its values
/// copied once, with zeros from `live` on: a slot past it may hold anything (NaN included),
/// and a zero weight times NaN is no zero.
struct Blocks<'a> {
    kv: &'a KvHead<'a>,
    live: usize,
    /// The cut block's values, zeros from `live` on (unused when `live` is a multiple of 16).
    tail: [u16; 64 * BLOCK],
}

impl<'a> Blocks<'a> {
    fn new(kv: &'a KvHead<'a>, live: usize) -> Self {
        let hd = kv.head_dim;
        let mut tail = [0u16; 64 * BLOCK];
        let (b, kept) = (live / BLOCK, live % BLOCK);
        if kept > 0 {
            let src = &kv.v[kv.blocks[b] as usize * kv.block_stride..][..hd * BLOCK];
            // Position `p` of a block: half `p % 2` of each element's pair in row `p / 2`. Whole
            // rows are copied; a row that `live` cuts keeps its first halves.
            let rows = tail.chunks_exact_mut(2 * hd).zip(src.chunks_exact(2 * hd));
            for (row, from) in rows.take(kept.div_ceil(2)) {
                row.copy_from_slice(from);
            }
            if kept % 2 == 1 {
                let cut = &mut tail[(kept / 2) * 2 * hd..][..2 * hd];
                for pair in cut.chunks_exact_mut(2) {
                    pair[1] = 0;
                }
            }
        }
        Blocks { kv, live, tail }
    }

    /// The first element of block `b`'s run in the cache, if it holds a position below `live`.
    fn base(&self, b: usize) -> Option<usize> {
        (BLOCK * b < self.live).then(|| self.kv.blocks[b] as usize * self.kv.block_stride)
    }

    /// Block `b`'s keys: `hd / 2` rows of element pairs × 16 positions (64 bytes); zeros for a
    /// block wholly past `live` (a cut block's slots past it may hold anything: the softmax masks
    /// their scores).
    fn keys(&self, b: usize) -> *const u16 {
        self.base(b).map_or(NO_BLOCK.as_ptr(), |base| {
            self.kv.k[base..][..self.kv.head_dim * BLOCK].as_ptr()
        })
    }

    /// Block `b`'s values: 8 rows of position pairs, `4 hd` bytes apart; zeros from `live` on.
    fn values(&self, b: usize) -> *const u16 {
        match self.base(b) {
            None => NO_BLOCK.as_ptr(),
            Some(_) if BLOCK * (b + 1) > self.live => self.tail.as_ptr(),
            Some(base) => self.kv.v[base..][..self.kv.head_dim * BLOCK].as_ptr(),
        }
    }
}

/// Up to 16 queries of a call (a tile's rows) and their running softmax: scores into tiles 0
/// and 1, the weighted values accumulating in tiles 4 and up.
struct Group<const NV: usize> {
    /// The queries' first index in the call, and how many.
    i0: usize,
    n: usize,
    /// Each query scaled by `scale · log2 e` and rounded to bf16: `hd / 2` words, a row `hd * 2`
    /// bytes; rows past the group zeros.
    q: [[[u32; 8]; NV]; ROWS],
    /// The positions each query sees: below `limit[k]`.
    limit: [usize; ROWS],
    max: [f32; ROWS],
    sum: [__m512; ROWS],
    /// The weighted values at the end, per 16 elements a tile's rows.
    o: [[[f32; 16]; ROWS]; NV],
}

impl<const NV: usize> Group<NV> {
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    fn new(c: &Call, queries: std::ops::Range<usize>) -> Self {
        let (hd, i0, n) = (c.hd, queries.start, queries.len());
        let mut q = [[[0u32; 8]; NV]; ROWS];
        let qscale = _mm512_set1_ps(c.scale * std::f32::consts::LOG2_E);
        for (k, row) in q[..n].iter_mut().enumerate() {
            let i = i0 + k;
            let src = c.q[(i / c.heads) * c.q_stride + (i % c.heads) * hd..][..hd].as_ptr();
            for (j, words) in row.chunks_exact_mut(2).enumerate() {
                // SAFETY: the query holds `hd = 16 * NV` floats; `words` holds 16 words.
                unsafe {
                    let lo = _mm512_mul_ps(_mm512_loadu_ps(src.add(32 * j)), qscale);
                    let hi = _mm512_mul_ps(_mm512_loadu_ps(src.add(32 * j + 16)), qscale);
                    let packed = _mm512_cvtne2ps_pbh(hi, lo);
                    _mm512_storeu_si512(words.as_mut_ptr() as *mut _, bits(packed));
                }
            }
        }
        Group {
            i0,
            n,
            q,
            // Query `i` is head `i % heads` of row `i / heads`, which sees positions below
            // `n_ctx0 + i / heads`.
            limit: std::array::from_fn(|k| c.n_ctx0 + (i0 + k) / c.heads),
            max: [MASKED; ROWS],
            sum: [_mm512_setzero_ps(); ROWS],
            o: [[[0f32; 16]; ROWS]; NV],
        }
    }

    /// The steps the group takes: those below its last limit.
    fn end(&self) -> usize {
        self.limit[self.n - 1].div_ceil(STEP)
    }

    /// The group's `steps` (after those before them, none past [`Group::end`]),
    /// software-pipelined: the tile unit computes the next step's scores while the vector unit
    /// takes this step's softmax. The keys' and values' tiles are the cache's blocks as they are
    /// ([`Blocks`]); the weighted values stay in tiles 4 and up from the first step to the last,
    /// and wait in `o` between runs (exactly: f32 out, f32 back).
    ///
    /// # Safety
    /// This thread is configured; the cache is [`super::KvFormat::Bf16Tiles`] and holds the
    /// blocks of the positions below `blocks.live` (the call's last limit); `c.hd == 16 * NV`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    unsafe fn run(&mut self, blocks: &Blocks, c: &Call, steps: std::ops::Range<usize>) {
        let hd = c.hd;
        let mut scores = [[[[0f32; BLOCK]; ROWS]; 2]; 2];
        let mut weights = [[0u32; BLOCK]; ROWS];
        let mut alphas = [_mm512_setzero_ps(); ROWS];
        let q = self.q.as_ptr().cast::<u8>();
        // Step `s`'s scores into tiles 0 and 1 (issued; the tile unit runs them on its own).
        let issue_scores = |s: usize| {
            let (k0, k1) = (blocks.keys(2 * s), blocks.keys(2 * s + 1));
            // SAFETY: configured (caller's promise); `q` holds 16 rows of `hd * 2` bytes; each
            // key block `hd * 16` halves, the tiles of its 16-element chunks in a run.
            unsafe {
                tile_op!(zero 0);
                tile_op!(zero 1);
                for chunk in 0..NV {
                    tile_load!(2, q.add(32 * chunk), hd * 2);
                    tile_load!(3, k0.add(PAIRS * 32 * chunk), 64usize);
                    tile_op!(0 += 2 * 3);
                    tile_load!(3, k1.add(PAIRS * 32 * chunk), 64usize);
                    tile_op!(1 += 2 * 3);
                }
            }
        };
        let store_scores = |into: &mut [[[f32; BLOCK]; ROWS]; 2]| {
            // SAFETY: configured; two 16 × 64-byte tiles.
            unsafe {
                tile_store!(0, into[0].as_mut_ptr(), 64usize);
                tile_store!(1, into[1].as_mut_ptr(), 64usize);
            }
        };
        for (j, oj) in self.o.iter().enumerate() {
            // SAFETY: configured; `oj` holds 16 rows of 64 bytes.
            unsafe {
                match steps.start {
                    0 => o_tile(j, Op::Zero),
                    _ => o_tile(j, Op::Load(oj.as_ptr().cast())),
                }
            }
        }
        let end = steps.end;
        issue_scores(steps.start);
        store_scores(&mut scores[steps.start % 2]);
        for s in steps {
            if s + 1 < end {
                issue_scores(s + 1);
            }
            let sc = &scores[s % 2];
            // Limits rise with `k`: when the first query sees the whole step, all do, and none
            // needs a mask (most steps of a long prompt).
            let rescaled = if self.limit[0] >= STEP * (s + 1) {
                self.softmax::<false>(sc, s, &mut weights, &mut alphas)
            } else {
                self.softmax::<true>(sc, s, &mut weights, &mut alphas)
            };
            // Nothing accumulated before the first step: its rescale has nothing to scale.
            if s > 0 && rescaled != 0 {
                for (j, oj) in self.o.iter_mut().enumerate() {
                    // SAFETY: configured; `oj` holds 16 rows of 64 bytes.
                    unsafe {
                        o_tile(j, Op::Store(oj.as_mut_ptr().cast()));
                        for (k, row) in oj.iter_mut().enumerate() {
                            if rescaled & 1 << k != 0 {
                                let v = _mm512_mul_ps(_mm512_loadu_ps(row.as_ptr()), alphas[k]);
                                _mm512_storeu_ps(row.as_mut_ptr(), v);
                            }
                        }
                        o_tile(j, Op::Load(oj.as_ptr().cast()));
                    }
                }
            }
            // Each block's weights (half a row of `weights`) by its values, 16 elements a tile.
            for half in 0..2 {
                let v = blocks.values(2 * s + half);
                // SAFETY: configured; `weights` holds 16 rows of 64 bytes, of which tile 2 reads
                // 32 from `32 * half`; a block's values are 8 rows of `4 hd` bytes, of which tile
                // 3 reads 64 from `64 j`.
                unsafe {
                    tile_load!(2, weights.as_ptr().cast::<u8>().add(32 * half), 64usize);
                    for j in 0..NV {
                        tile_load!(3, v.add(32 * j), hd * 4);
                        o_tile(j, Op::Accumulate);
                    }
                }
            }
            if s + 1 < end {
                store_scores(&mut scores[(s + 1) % 2]);
            }
        }
        for (j, oj) in self.o.iter_mut().enumerate() {
            // SAFETY: configured; `oj` holds 16 rows of 64 bytes.
            unsafe { o_tile(j, Op::Store(oj.as_mut_ptr().cast())) };
        }
    }

    /// Step `s`'s softmax for each query of the group (its scores `sc`; with `MASKS`, lanes past
    /// a query's limit masked): the weights into `weights`, and the queries whose maximum rose
    /// past the slack (bit `k`), with their factors in `alphas`. One loop a case, so that the
    /// common one (every query sees the whole step) carries no mask arithmetic.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    #[inline]
    fn softmax<const MASKS: bool>(
        &mut self,
        sc: &[[[f32; BLOCK]; ROWS]; 2],
        s: usize,
        weights: &mut [[u32; BLOCK]; ROWS],
        alphas: &mut [__m512; ROWS],
    ) -> u32 {
        let mut rescaled = 0u32;
        let running = self.max.iter_mut().zip(&mut self.sum).zip(&self.limit);
        for (k, ((max, sum), &limit)) in running.enumerate().take(self.n) {
            // SAFETY: 16 floats each.
            let (mut s0, mut s1) = unsafe {
                (
                    _mm512_loadu_ps(sc[0][k].as_ptr()),
                    _mm512_loadu_ps(sc[1][k].as_ptr()),
                )
            };
            if MASKS {
                let live = limit.saturating_sub(STEP * s);
                s0 = masked(s0, live);
                s1 = masked(s1, live.saturating_sub(BLOCK));
            }
            let (w, alpha) = softmax_step(max, sum, s0, s1);
            // SAFETY: 64 bytes each.
            unsafe { _mm512_storeu_si512(weights[k].as_mut_ptr() as *mut _, w) };
            if let Some(alpha) = alpha {
                alphas[k] = alpha;
                rescaled |= 1 << k;
            }
        }
        rescaled
    }

    /// Each query's weighted values over its sum of weights, into the call's output.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
    fn finish(&self, c: &Call, out: &mut [f32]) {
        for k in 0..self.n {
            let total = _mm512_set1_ps(_mm512_reduce_add_ps(self.sum[k]));
            let dst = &mut out[(self.i0 + k) * c.hd..][..c.hd];
            for (oj, d) in self.o.iter().zip(dst.chunks_exact_mut(16)) {
                // SAFETY: 16 floats each.
                unsafe {
                    let v = _mm512_div_ps(_mm512_loadu_ps(oj[k].as_ptr()), total);
                    _mm512_storeu_ps(d.as_mut_ptr(), v);
                }
            }
        }
    }
}

/// Rounds `src` to bf16 bits (to nearest, ties to even; subnormals to zero, as the tile unit
/// reads them) into `dst`, 16 at a time.
///
/// # Safety
/// The CPU has AVX-512 F/BF16; `src.len() == dst.len()`, a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn to_bf16(src: &[f32], dst: &mut [u16]) {
    for (s, d) in src.chunks_exact(16).zip(dst.chunks_exact_mut(16)) {
        // SAFETY: 16 floats in, 32 bytes out.
        unsafe {
            let h = _mm512_cvtneps_pbh(_mm512_loadu_ps(s.as_ptr()));
            _mm256_storeu_si256(
                d.as_mut_ptr() as *mut __m256i,
                std::mem::transmute::<__m256bh, __m256i>(h),
            );
        }
    }
}

/// What [`o_tile`] does to the tile of weighted values for elements `16 j..16 j + 16`.
enum Op {
    Zero,
    /// Tile 4 + j += tile 2 (weights) · tile 3 (values).
    Accumulate,
    Store(*mut u8),
    Load(*const u8),
}

/// `op` on tile `4 + j`.
///
/// # Safety
/// This thread is configured; `j < 4`; a store or load has 16 rows of 64 bytes.
#[inline(always)]
unsafe fn o_tile(j: usize, op: Op) {
    macro_rules! on {
        ($t:literal) => {
            match op {
                Op::Zero => tile_op!(zero $t),
                Op::Accumulate => tile_op!($t += 2 * 3),
                Op::Store(p) => tile_store!($t, p, 64usize),
                Op::Load(p) => tile_load!($t, p, 64usize),
            }
        };
    }
    // SAFETY: the caller's promise.
    unsafe {
        match j {
            0 => on!(4),
            1 => on!(5),
            2 => on!(6),
            _ => on!(7),
        }
    }
}

/// Scores `v` of a block with lanes from `live` on [`MASKED`] (none when `live >= 16`).
#[target_feature(enable = "avx512f")]
#[inline]
fn masked(v: __m512, live: usize) -> __m512 {
    let keep = ((1u32 << live.min(BLOCK)) - 1) as __mmask16;
    _mm512_mask_mov_ps(_mm512_set1_ps(MASKED), keep, v)
}

/// A query's softmax step over 32 positions (its scores in base 2, masked lanes [`MASKED`]): a
/// maximum more than [`SLACK`] above the running one rescales the running sum, and comes back as
/// the factor for the weighted values; the weights `2^(score - max)`, 0 past the limit, go into
/// the running sum and come back as 32 bf16. The factor is [`exp2_16`]'s too (a call into libm
/// here, however rare, made the compiler reload the polynomial's constants for every query).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]
#[inline]
fn softmax_step(
    max: &mut f32,
    sum: &mut __m512,
    s0: __m512,
    s1: __m512,
) -> (__m512i, Option<__m512>) {
    let mut alpha = None;
    let top = _mm512_max_ps(s0, s1);
    if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(top, _mm512_set1_ps(*max + SLACK)) != 0 {
        let m = _mm512_reduce_max_ps(top);
        // The first step's `max` is MASKED: a factor of exactly 0, for a sum of 0.
        let a = exp2_16(_mm512_set1_ps(*max - m));
        *max = m;
        *sum = _mm512_mul_ps(*sum, a);
        alpha = Some(a);
    }
    let m = _mm512_set1_ps(*max);
    let e0 = exp2_16(_mm512_sub_ps(s0, m));
    let e1 = exp2_16(_mm512_sub_ps(s1, m));
    *sum = _mm512_add_ps(_mm512_add_ps(*sum, e0), e1);
    (bits(_mm512_cvtne2ps_pbh(e1, e0)), alpha)
}

/// A score past a query's limit: its weight `2^(MASKED - max)` is exactly 0, and unlike -inf it
/// keeps [`exp2_16`]'s arithmetic finite. (Every query sees position 0, so its maximum is a real
/// score from its first step on.)
pub(super) const MASKED: f32 = -1e30;

/// `2^x` of 16 lanes for finite `x <= SLACK` (a softmax weight), within 1e-4 relative, 20 times
/// below the weights' rounding to bf16 (2^-9): `2^floor(x)` (`vscalefps`) times `2^f`, `0 <= f <
/// 1`, by its interpolant of degree 3 at the Chebyshev nodes. Below -150 (a [`MASKED`] lane
/// included) the result is exactly 0. Five instructions.
#[target_feature(enable = "avx512f,avx512dq")]
#[inline]
fn exp2_16(x: __m512) -> __m512 {
    /// The interpolant's coefficients, `f^3` down to `f^0`.
    const C: [f32; 4] = [7.896_726e-2, 2.246_931_6e-1, 6.963_247_7e-1, 9.999_003e-1];
    // f = x - floor(x), in [0, 1); `vscalefps` takes floor(x) itself.
    let f = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(x);
    let mut p = _mm512_set1_ps(C[0]);
    for &c in &C[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, x)
}

/// [`exp2_16`] of 16 values, for tests.
///
/// # Safety
/// The CPU has AVX-512 F and DQ.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn exp2_16_for_test(x: &[f32; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: 16 floats each.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp2_16(_mm512_loadu_ps(x.as_ptr()))) };
    out
}
