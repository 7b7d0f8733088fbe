//! Tiled attention on AMX (Sapphire Rapids and later): both small matrix products of a step
//! done by the tile unit's `tdpbf16ps`, which multiplies a 16 × 32 bf16 tile by a 32 × 16 one
//! into 16 × 16 f32 sums in one instruction (8,192 multiply-adds, against 32 for `vdpbf16ps`).
//! The products cost next to nothing; what is left is the softmax, on zmm registers between them.
//!
//! The cache holds this kernel's operands as they are ([`super::KvFormat::Bf16Tiles`]): a block's
//! keys are its key tiles (rows of element pairs × 16 positions), its values rows of position
//! pairs × elements. Queries go in groups of 16 (a tile's rows), each scaled by `scale · log2 e`
//! and rounded once to bf16. Per group and step of 32 positions (two blocks):
//! - the scores, one product per 32 elements of the head and block, into tiles 0 and 1; the tile
//!   unit computes the next step's while the vector unit takes this one's softmax;
//! - each query's softmax step in base 2: a maximum more than [`SLACK`] above the running one
//!   rescales what came before by `2^(old - new)` (so weights reach at most `2^SLACK`, and the
//!   rescale, exact whenever it is done, is rare after the first steps); the weights
//!   `2^(score - max)` ([`exp2_16`]), rounded to bf16, are a row of the weights' tile;
//! - the step's values, copied from the two blocks into one tile per 16 elements (zeros past
//!   the call's last position), meet the weights: the weighted values accumulate in tiles 4 and
//!   up for the whole group, in f32.
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

/// The tile configuration (palette 1): all eight registers 16 rows of 64 bytes.
///
/// | tile | holds |
/// | --- | --- |
/// | 0, 1 | 16 queries' scores for the two blocks of a step (f32) |
/// | 2 | 16 queries, 32 elements, or their 32 weights of a step (bf16 pairs) |
/// | 3 | keys: 16 pairs of elements × 16 positions; or values: 16 pairs of positions × 16 elements |
/// | 4..8 | 16 queries' weighted values, 16 elements each (f32) |
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = ROWS as u8;
        t += 1;
    }
    Config(c)
};

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

/// One product of known factors (16 × 32 ones by 32 × 16 twos: 64 in every sum), so that a
/// tile unit that runs but answers wrong (a hypervisor that keeps no tile state, say) is not
/// used. It leaves this thread configured.
///
/// # Safety
/// The CPU has AMX-TILE and AMX-BF16, and Linux granted the tile data state.
unsafe fn known_answer() -> bool {
    let ones = [0x3f80_3f80u32; 16 * 16];
    let twos = [0x4000_4000u32; 16 * 16];
    let mut sums = [0f32; 16 * 16];
    // SAFETY: the caller's promise; each buffer is 16 rows of 64 bytes.
    unsafe {
        configure();
        tile_op!(zero 0);
        tile_load!(2, ones.as_ptr(), 64usize);
        tile_load!(3, twos.as_ptr(), 64usize);
        tile_op!(0 += 2 * 3);
        tile_store!(0, sums.as_mut_ptr(), 64usize);
    }
    sums.iter().all(|&x| x == 64.0)
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
/// The CPU has AVX-512 F/BW/VL/BF16 and [`usable`] said yes; the shape is one [`takes`] and the
/// cache [`super::KvFormat::Bf16Tiles`]; the blocks of every position used lie inside both caches
/// (checked by [`super::attend_rows`]), `c.q` holds every row's heads, `out` holds the rows'
/// outputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
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

/// As [`run`], with `c.hd == 16 * NV`, `NV` 2 or 4: the queries in groups of 16, each group over
/// every step below its last limit.
///
/// # Safety
/// As [`run`], with this thread configured.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn call<const NV: usize>(kv: &KvHead, c: &Call, out: &mut [f32]) {
    // At least one query: `attend_rows` returns early on none.
    let nq = out.len() / c.hd;
    // The call's last query sees positions below `live`: past it a slot may hold anything.
    let live = c.n_ctx0 + (nq - 1) / c.heads;
    for i0 in (0..nq).step_by(ROWS) {
        let mut group = Group::<NV>::new(c, i0..nq.min(i0 + ROWS));
        // SAFETY: this thread is configured; the caller's promises.
        unsafe { group.run(kv, c, live) };
        group.finish(c, out);
    }
}

/// The block of the call's positions from `16 b`: its first element in the cache, if any below
/// `live`.
fn block(kv: &KvHead, live: usize, b: usize) -> Option<usize> {
    (BLOCK * b < live).then(|| kv.blocks[b] as usize * kv.block_stride)
}

/// Step `s`'s values (two blocks, 8 rows of position pairs each) into one tile of 16 rows per 16
/// elements, zeros from `live` on.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
fn stage_values<const NV: usize>(
    kv: &KvHead,
    hd: usize,
    live: usize,
    s: usize,
    tiles: &mut [[[u32; 16]; ROWS]; NV],
) {
    let (b0, b1) = (block(kv, live, 2 * s), block(kv, live, 2 * s + 1));
    for p in 0..ROWS {
        let (base, pair) = if p < ROWS / 2 {
            (b0, p)
        } else {
            (b1, p - ROWS / 2)
        };
        let keep: __mmask32 = match (base, live.saturating_sub(STEP * s + 2 * p)) {
            (None, _) | (_, 0) => 0,
            (_, 1) => 0x5555_5555,
            _ => !0,
        };
        let src = base.map_or(NO_BLOCK.as_ptr(), |b| kv.v[b..][..hd * BLOCK].as_ptr());
        for (j, tile) in tiles.iter_mut().enumerate() {
            // SAFETY: pair `pair` of a block holds `2 * hd` halves, of which the masked load
            // reads only the kept ones (none outside a live block).
            unsafe {
                let row =
                    _mm512_maskz_loadu_epi16(keep, src.add(2 * hd * pair + 32 * j) as *const i16);
                _mm512_storeu_si512(tile[p].as_mut_ptr() as *mut _, row);
            }
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
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
            max: [f32::NEG_INFINITY; ROWS],
            sum: [_mm512_setzero_ps(); ROWS],
            o: [[[0f32; 16]; ROWS]; NV],
        }
    }

    /// Every step below the group's last limit, software-pipelined: the tile unit computes the
    /// next step's scores while the vector unit takes this step's softmax. The keys' tiles are
    /// the cache's blocks as they are; each step's values are staged into tiles ([`stage_values`]).
    ///
    /// # Safety
    /// This thread is configured; the cache is [`super::KvFormat::Bf16Tiles`] and holds the
    /// blocks of the positions below `live` (the call's last limit); `c.hd == 16 * NV`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn run(&mut self, kv: &KvHead, c: &Call, live: usize) {
        let (hd, n) = (c.hd, self.n);
        let mut scores = [[[[0f32; BLOCK]; ROWS]; 2]; 2];
        let mut weights = [[0u32; BLOCK]; ROWS];
        let mut values = [[[0u32; 16]; ROWS]; NV];
        let q = self.q.as_ptr().cast::<u8>();
        let keys = |b: usize| match block(kv, live, b) {
            Some(base) => kv.k[base..][..hd * BLOCK].as_ptr(),
            None => NO_BLOCK.as_ptr(),
        };
        // Step `s`'s scores into tiles 0 and 1 (issued; the tile unit runs them on its own).
        let issue_scores = |s: usize| {
            let (k0, k1) = (keys(2 * s), keys(2 * s + 1));
            // SAFETY: configured (caller's promise); `q` holds 16 rows of `hd * 2` bytes; each
            // key block `hd * 16` halves, the tiles of its 32-element chunks in a run.
            unsafe {
                tile_op!(zero 0);
                tile_op!(zero 1);
                for chunk in 0..NV / 2 {
                    tile_load!(2, q.add(64 * chunk), hd * 2);
                    tile_load!(3, k0.add(16 * 32 * chunk), 64usize);
                    tile_op!(0 += 2 * 3);
                    tile_load!(3, k1.add(16 * 32 * chunk), 64usize);
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
        for j in 0..NV {
            // SAFETY: configured.
            unsafe { o_tile(j, Op::Zero) };
        }
        let end = self.limit[n - 1].div_ceil(STEP);
        issue_scores(0);
        store_scores(&mut scores[0]);
        for s in 0..end {
            if s + 1 < end {
                issue_scores(s + 1);
            }
            stage_values::<NV>(kv, hd, live, s, &mut values);
            let sc = &scores[s % 2];
            let mut rescale = [None; ROWS];
            for k in 0..n {
                let live = self.limit[k].saturating_sub(STEP * s);
                let (w, alpha) = softmax_step(
                    &mut self.max[k],
                    &mut self.sum[k],
                    &sc[0][k],
                    &sc[1][k],
                    live,
                );
                // SAFETY: 64 bytes each.
                unsafe { _mm512_storeu_si512(weights[k].as_mut_ptr() as *mut _, w) };
                rescale[k] = alpha;
            }
            // Nothing accumulated before the first step: its rescale has nothing to scale.
            if s > 0 && rescale.iter().any(Option::is_some) {
                for (j, oj) in self.o.iter_mut().enumerate() {
                    // SAFETY: configured; `oj` holds 16 rows of 64 bytes.
                    unsafe {
                        o_tile(j, Op::Store(oj.as_mut_ptr().cast()));
                        for (row, alpha) in oj.iter_mut().zip(&rescale) {
                            if let Some(alpha) = alpha {
                                let v = _mm512_mul_ps(_mm512_loadu_ps(row.as_ptr()), *alpha);
                                _mm512_storeu_ps(row.as_mut_ptr(), v);
                            }
                        }
                        o_tile(j, Op::Load(oj.as_ptr().cast()));
                    }
                }
            }
            // SAFETY: configured; `weights` and each of `values` are 16 rows of 64 bytes.
            unsafe {
                tile_load!(2, weights.as_ptr(), 64usize);
                for (j, tile) in values.iter().enumerate() {
                    tile_load!(3, tile.as_ptr(), 64usize);
                    o_tile(j, Op::Accumulate);
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

    /// Each query's weighted values over its sum of weights, into the call's output.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
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

/// A query's softmax step over 32 positions (its scores in base 2; lanes from `live` on past its
/// limit): a maximum more than [`SLACK`] above the running one rescales the running sum, and
/// comes back as the factor for the weighted values; the weights `2^(score - max)`, 0 past the
/// limit, go into the running sum and come back as 32 bf16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
#[inline]
fn softmax_step(
    max: &mut f32,
    sum: &mut __m512,
    s0: &[f32; BLOCK],
    s1: &[f32; BLOCK],
    live: usize,
) -> (__m512i, Option<__m512>) {
    let masked = |s: &[f32; BLOCK], live: usize| {
        // SAFETY: 16 floats.
        let v = unsafe { _mm512_loadu_ps(s.as_ptr()) };
        if live >= BLOCK {
            v
        } else {
            let keep = ((1u32 << live) - 1) as __mmask16;
            _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), keep, v)
        }
    };
    let s0 = masked(s0, live);
    let s1 = masked(s1, live.saturating_sub(BLOCK));
    let mut alpha = None;
    let bar = _mm512_set1_ps(*max + SLACK);
    if _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s0, bar) | _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s1, bar) != 0 {
        let m = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
        let a = _mm512_set1_ps((*max - m).exp2());
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

/// `2^x` of 16 lanes for `x <= SLACK` (a softmax weight), within 5e-6 relative: `2^n`
/// (`vscalefps`) times `2^f`, `|f| <= 1/2`, by its Taylor polynomial of degree 5. Below -150
/// the result is exactly 0 (a masked lane, -inf, included). Ten instructions; the weights are
/// rounded to bf16 (2^-9) anyway.
#[target_feature(enable = "avx512f")]
#[inline]
fn exp2_16(x: __m512) -> __m512 {
    /// `ln(2)^k / k!`, `k = 5` down to 1.
    const C: [f32; 5] = [
        1.333_355_8e-3,
        9.618_129e-3,
        5.550_411e-2,
        2.402_265e-1,
        6.931_472e-1,
    ];
    let x = _mm512_max_ps(x, _mm512_set1_ps(-150.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(C[0]);
    for &c in &C[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_scalef_ps(p, n)
}

/// [`exp2_16`] of 16 values, for tests.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp2_16_for_test(x: &[f32; 16]) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: 16 floats each.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp2_16(_mm512_loadu_ps(x.as_ptr()))) };
    out
}
