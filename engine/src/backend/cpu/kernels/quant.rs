//! Activation quantization: f32 rows to 8-bit blocks of 32 (llama.cpp's Q8_1 scheme).
//!
//! Per block of 32 values: `d = amax / 127`, `q = round(x / d)` (ties to even, which is what the
//! SIMD conversions do, so every level produces identical bytes), and `s = d * sum(q)`. The
//! values are stored contiguously per row (`qs`), the scales interleaved per block (`ds`:
//! `d0, s0, d1, s1, ...`), which is the layout the dot kernels load, and each block's `sum(q)`
//! apart (`sums`: the AVX2 lane kernel's exact offset for Q8_0 weights).

use std::cell::RefCell;
use std::sync::Mutex;

use super::super::pool::ThreadPool;
use super::{Prologue, SimdLevel};

/// Activation rows per parallel quantization task.
const QUANT_ROWS_PER_TASK: usize = 16;

/// Quantizes the activations `x`, in parallel when there are many; with a `prologue`, each
/// share of the rows first goes through it and its output is quantized (the prologue then costs
/// no serial pass of its own).
pub(crate) fn quantize_parallel(
    level: SimdLevel,
    pool: &ThreadPool,
    x: &[f32],
    prologue: Option<&mut Prologue<'_>>,
    acts: &mut QActs,
) {
    let (m, cols, nb) = (acts.m, acts.cols, acts.nb);
    // A batch's rows split over the threads (a few rows each), a prefill's in tasks of
    // `QUANT_ROWS_PER_TASK`; a lone row on the caller.
    let k = if pool.n_threads() == 1 || m < 4 {
        m
    } else {
        m.div_ceil(pool.n_threads()).clamp(2, QUANT_ROWS_PER_TASK)
    };
    // The prologue's output cut like the rows (past `m` rows, if it is longer, left alone).
    let n_parts = m.div_ceil(k);
    let pro: Vec<Option<Prologue<'_>>> = match prologue {
        Some(p) => p
            .split(k * cols)
            .into_iter()
            .take(n_parts)
            .map(Some)
            .collect(),
        None => (0..n_parts).map(|_| None).collect(),
    };
    let parts: Vec<Mutex<QuantPart>> = x[..m * cols]
        .chunks(k * cols)
        .zip(pro)
        .zip(acts.qs.chunks_mut(k * cols))
        .zip(acts.ds.chunks_mut(k * 2 * nb))
        .zip(acts.sums.chunks_mut(k * nb))
        .map(|((((x, prologue), qs), ds), sums)| {
            Mutex::new(QuantPart {
                x,
                prologue,
                qs,
                ds,
                sums,
            })
        })
        .collect();
    let work = |t: usize| {
        let mut g = parts[t].lock().unwrap_or_else(|e| e.into_inner());
        let p = &mut *g;
        let x = match &mut p.prologue {
            Some(pro) => pro.apply(p.x, p.x.len() / cols, cols),
            None => p.x,
        };
        quantize_rows(level, x, p.qs, p.ds, p.sums, cols);
    };
    if parts.len() == 1 {
        work(0);
    } else {
        pool.run(parts.len(), &work);
    }
}

/// One parallel share of the activation rows.
struct QuantPart<'a, 'p> {
    x: &'a [f32],
    /// What makes the rows to quantize from `x`, if anything.
    prologue: Option<Prologue<'p>>,
    qs: &'a mut [i8],
    ds: &'a mut [f32],
    sums: &'a mut [i32],
}

/// Quantized activations: `m` rows of `cols` values.
#[derive(Debug, Default)]
pub(crate) struct QActs {
    pub m: usize,
    pub cols: usize,
    /// Blocks per row (`cols / 32`).
    pub nb: usize,
    /// `m * cols` quantized values.
    pub qs: Vec<i8>,
    /// `m * nb` pairs `(d, s)`.
    pub ds: Vec<f32>,
    /// `m * nb` sums of a block's quantized values (`s / d`, exactly).
    pub sums: Vec<i32>,
}

impl QActs {
    /// Sizes the buffers for `m` rows of `cols` (a multiple of 32).
    pub fn reset(&mut self, m: usize, cols: usize) {
        assert!(
            cols.is_multiple_of(32),
            "quantized matmul needs a multiple of 32 columns, got {cols}"
        );
        self.m = m;
        self.cols = cols;
        self.nb = cols / 32;
        self.qs.resize(m * cols, 0);
        self.ds.resize(m * self.nb * 2, 0.0);
        self.sums.resize(m * self.nb, 0);
    }
}

thread_local! {
    static SCRATCH: RefCell<QActs> = RefCell::new(QActs::default());
}

/// The calling thread's reusable activation buffer (avoids a large allocation per call).
pub(crate) fn take_scratch() -> QActs {
    SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

/// Returns the buffer taken by [`take_scratch`].
pub(crate) fn put_scratch(a: QActs) {
    SCRATCH.with(|s| *s.borrow_mut() = a);
}

/// Quantizes whole rows of `cols` values: `x.len() / cols` rows into `qs`, `ds` and `sums`.
pub(crate) fn quantize_rows(
    level: SimdLevel,
    x: &[f32],
    qs: &mut [i8],
    ds: &mut [f32],
    sums: &mut [i32],
    cols: usize,
) {
    let nb = x.len() / 32;
    assert!(x.len().is_multiple_of(cols) && cols.is_multiple_of(32));
    assert!(qs.len() >= x.len() && ds.len() >= 2 * nb && sums.len() >= nb);
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 | SimdLevel::Avx512Vnni | SimdLevel::Avx512Bf16 | SimdLevel::Amx => {
            // SAFETY: callers pass a level no higher than the CPU runs; lengths checked above.
            unsafe { quantize_avx512(x, qs, ds, sums) }
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx2Vnni => {
            // SAFETY: callers pass a level no higher than the CPU runs; lengths checked above.
            unsafe { quantize_avx2(x, qs, ds, sums) }
        }
        _ => quantize_scalar(x, qs, ds, sums),
    }
}

/// The block scale and its inverse for a block whose largest magnitude is `amax`.
#[inline(always)]
fn scales(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

pub(crate) fn quantize_scalar(x: &[f32], qs: &mut [i8], ds: &mut [f32], sums: &mut [i32]) {
    for (b, (xb, qb)) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let (d, id) = scales(amax);
        let mut sum = 0i32;
        for (q, &v) in qb.iter_mut().zip(xb) {
            let r = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
            *q = r;
            sum += r as i32;
        }
        ds[2 * b] = d;
        ds[2 * b + 1] = d * sum as f32;
        sums[b] = sum;
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW; `qs.len() >= x.len()`, `ds.len() >= x.len() / 16`,
/// `sums.len() >= x.len() / 32`, `x.len()` a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_avx512(x: &[f32], qs: &mut [i8], ds: &mut [f32], sums: &mut [i32]) {
    use std::arch::x86_64::*;
    let nb = x.len() / 32;
    let (xp, qp) = (x.as_ptr(), qs.as_mut_ptr());
    for b in 0..nb {
        // SAFETY: block `b` is in bounds of `x` (32 floats) and `qs` (32 bytes), per the contract.
        unsafe {
            let v0 = _mm512_loadu_ps(xp.add(32 * b));
            let v1 = _mm512_loadu_ps(xp.add(32 * b + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            let (d, id) = scales(amax);
            let idv = _mm512_set1_ps(id);
            let lim = _mm512_set1_epi32(127);
            let nlim = _mm512_set1_epi32(-127);
            let q0 = _mm512_max_epi32(
                nlim,
                _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv))),
            );
            let q1 = _mm512_max_epi32(
                nlim,
                _mm512_min_epi32(lim, _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv))),
            );
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            _mm_storeu_si128(qp.add(32 * b) as *mut __m128i, _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128(
                qp.add(32 * b + 16) as *mut __m128i,
                _mm512_cvtepi32_epi8(q1),
            );
            ds[2 * b] = d;
            ds[2 * b + 1] = d * sum as f32;
            sums[b] = sum;
        }
    }
}

/// # Safety
/// The CPU must support AVX2; `qs.len() >= x.len()`, `ds.len() >= x.len() / 16`,
/// `sums.len() >= x.len() / 32`, `x.len()` a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2(x: &[f32], qs: &mut [i8], ds: &mut [f32], sums: &mut [i32]) {
    use std::arch::x86_64::*;
    let nb = x.len() / 32;
    let (xp, qp) = (x.as_ptr(), qs.as_mut_ptr());
    let sign = _mm256_set1_ps(-0.0);
    let lim = _mm256_set1_epi32(127);
    let nlim = _mm256_set1_epi32(-127);
    for b in 0..nb {
        // SAFETY: block `b` is in bounds of `x` (32 floats) and `qs` (32 bytes), per the contract.
        unsafe {
            let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(xp.add(32 * b + 8 * k)));
            let mut mx = _mm256_andnot_ps(sign, v[0]);
            for vk in &v[1..] {
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, *vk));
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
            let (d, id) = scales(_mm_cvtss_f32(m1));
            let idv = _mm256_set1_ps(id);
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                let r = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], idv));
                _mm256_max_epi32(nlim, _mm256_min_epi32(lim, r))
            });
            let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1));
            let sum = _mm_cvtsi128_si32(s1);
            // Pack 4 x 8 i32 into 32 i8 and undo the lane interleaving of the packs.
            let p01 = _mm256_packs_epi32(q[0], q[1]);
            let p23 = _mm256_packs_epi32(q[2], q[3]);
            let p = _mm256_packs_epi16(p01, p23);
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(qp.add(32 * b) as *mut __m256i, p);
            ds[2 * b] = d;
            ds[2 * b + 1] = d * sum as f32;
            sums[b] = sum;
        }
    }
}
