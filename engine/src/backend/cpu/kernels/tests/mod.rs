//! Kernel tests: every level against a dequantized f32 reference and against the portable path.

use half::{bf16, f16};

use super::runs::{ROW_UNIT, RUNS_PER_THREAD};
use super::*;

mod attend;

/// SplitMix64: small, deterministic, good enough for test data.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
}

const ALL_LEVELS: [SimdLevel; 7] = SimdLevel::ALL;

/// The levels this CPU really runs (others would be clamped to one of these).
pub(super) fn levels() -> Vec<SimdLevel> {
    ALL_LEVELS.into_iter().filter(|l| l.clamp() == *l).collect()
}

pub(super) fn random_matrix(rng: &mut Rng, dtype: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let nblocks = rows * cols / dtype.block_size();
    let mut data = Vec::with_capacity(nblocks * dtype.type_size());
    for _ in 0..nblocks {
        match dtype {
            GgmlType::Q4_1 => {
                data.extend(f16::from_f32(rng.uniform(0.002, 0.02)).to_le_bytes());
                data.extend(f16::from_f32(rng.uniform(-0.15, 0.0)).to_le_bytes());
                data.extend((0..16).map(|_| rng.byte()));
            }
            GgmlType::Q8_0 => {
                data.extend(f16::from_f32(rng.uniform(0.0005, 0.003)).to_le_bytes());
                // The full i8 range, -128 included (ggml never writes it, but files may).
                data.extend((0..32).map(|_| rng.byte()));
            }
            GgmlType::F32 => data.extend(rng.uniform(-0.2, 0.2).to_le_bytes()),
            GgmlType::F16 => data.extend(f16::from_f32(rng.uniform(-0.2, 0.2)).to_le_bytes()),
            GgmlType::BF16 => data.extend(bf16::from_f32(rng.uniform(-0.2, 0.2)).to_le_bytes()),
        }
    }
    data
}

pub(super) fn random_acts(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
}

/// f64 reference from dequantized rows.
fn reference(w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let mut row = vec![0f32; w.cols];
    let mut y = vec![0f32; m * w.rows];
    for r in 0..w.rows {
        dequantize_row(w.dtype, w.row(r), &mut row);
        for i in 0..m {
            let xi = &x[i * w.cols..(i + 1) * w.cols];
            y[i * w.rows + r] = row
                .iter()
                .zip(xi)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>() as f32;
        }
    }
    y
}

fn rms(v: &[f32]) -> f32 {
    (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt() as f32
}

/// ||a - b|| / ||b||.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let d: Vec<f32> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    rms(&d) / rms(b)
}

/// Every element within `tol` of `b`, relative to the larger of |b| and b's RMS.
fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len());
    let scale = rms(b);
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        let lim = tol * y.abs().max(scale);
        assert!(
            (x - y).abs() <= lim,
            "{what}: element {k}: {x} vs {y} (limit {lim})"
        );
    }
}

/// `w · x` at `level`; on AVX-512 through the lane kernel, as the backend runs it (see
/// [`run_stored_layout`] for the stored-layout kernel).
fn run_matmul(level: SimdLevel, threads: usize, w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    match LaneMatrix::new(w).expect("mapped") {
        Some(lanes) if lane_kernel(level) => {
            run_stored_layout(level, threads, &w.with_lanes(&lanes), x, m)
        }
        _ => run_stored_layout(level, threads, w, x, m),
    }
}

/// `w · x` at `level`, on the weights as `w` carries them.
fn run_stored_layout(
    level: SimdLevel,
    threads: usize,
    w: &QMatrix,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let pool = ThreadPool::new(threads);
    // Poison the output so unwritten elements show up.
    let mut y = vec![f32::NAN; m * w.rows];
    matmul_with(level, &pool, w, x, m, &mut y);
    y
}

#[test]
fn quantized_matmul_matches_reference_and_scalar() {
    let mut rng = Rng(1);
    for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for &(rows, cols) in &[(37, 64), (70, 96), (5, 32), (64, 576), (19, 1536)] {
            let data = random_matrix(&mut rng, dtype, rows, cols);
            let w = QMatrix::new(dtype, rows, cols, &data).expect("valid matrix");
            for m in [1, 3, 8, 33] {
                let x = random_acts(&mut rng, m * cols);
                let want = reference(&w, &x, m);
                let scalar = run_matmul(SimdLevel::Scalar, 1, &w, &x, m);
                let err = rel_err(&scalar, &want);
                assert!(
                    err < 1.5e-2,
                    "{dtype} {rows}x{cols} m={m}: scalar rel err {err}"
                );
                for level in levels() {
                    for threads in [1, 2] {
                        let got = run_matmul(level, threads, &w, &x, m);
                        let what = format!("{dtype} {rows}x{cols} m={m} {level:?} t={threads}");
                        assert_close(&got, &scalar, 1e-4, &what);
                        let stored = run_stored_layout(level, threads, &w, &x, m);
                        assert_close(&stored, &scalar, 1e-4, &format!("{what} stored layout"));
                    }
                }
            }
        }
    }
}

#[test]
fn quantization_is_identical_across_levels() {
    let mut rng = Rng(2);
    let cols = 96;
    let mut x = random_acts(&mut rng, 5 * cols);
    // An all-zero block, a block with exact ties, and a large-magnitude block.
    x[32..64].fill(0.0);
    for (k, v) in x[64..96].iter_mut().enumerate() {
        *v = (k as f32 - 16.0) * 0.5;
    }
    x[96..128].iter_mut().for_each(|v| *v *= 1e4);
    let nb = x.len() / 32;
    let (mut q0, mut d0, mut s0) = (vec![0i8; x.len()], vec![0f32; 2 * nb], vec![0i32; nb]);
    quant::quantize_scalar(&x, &mut q0, &mut d0, &mut s0);
    assert!(q0[32..64].iter().all(|&q| q == 0) && d0[2] == 0.0);
    assert!(q0.iter().any(|&q| q == 127 || q == -127));
    for level in levels() {
        let (mut q, mut d, mut s) = (vec![0i8; x.len()], vec![0f32; 2 * nb], vec![0i32; nb]);
        quant::quantize_rows(level, &x, &mut q, &mut d, &mut s, cols);
        assert_eq!(q, q0, "{level:?} values");
        assert_eq!(d, d0, "{level:?} scales");
        assert_eq!(s, s0, "{level:?} sums");
    }
    // The quantized values reconstruct the input to within half a step.
    for b in 0..nb {
        for k in 0..32 {
            let v = x[32 * b + k];
            let back = d0[2 * b] * q0[32 * b + k] as f32;
            assert!(
                (v - back).abs() <= 0.5001 * d0[2 * b] + 1e-6,
                "block {b} elem {k}: {v} vs {back}"
            );
        }
        let s: i32 = q0[32 * b..32 * (b + 1)].iter().map(|&q| q as i32).sum();
        assert_eq!(s0[b], s);
        assert_eq!(d0[2 * b + 1], d0[2 * b] * s as f32);
    }
}

/// Random weights of some (dtype, rows) shapes, in the stored layout and in lane order.
struct Weights {
    shapes: Vec<(GgmlType, usize)>,
    cols: usize,
    datas: Vec<Vec<u8>>,
    lanes: Vec<Option<LaneMatrix>>,
}

impl Weights {
    fn random(rng: &mut Rng, shapes: &[(GgmlType, usize)], cols: usize) -> Self {
        let datas: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(t, r)| random_matrix(rng, t, r, cols))
            .collect();
        let mut w = Weights {
            shapes: shapes.to_vec(),
            cols,
            datas,
            lanes: Vec::new(),
        };
        w.lanes = w
            .stored()
            .iter()
            .map(|m| LaneMatrix::new(m).expect("mapped"))
            .collect();
        w
    }

    fn stored(&self) -> Vec<QMatrix<'_>> {
        self.shapes
            .iter()
            .zip(&self.datas)
            .map(|(&(t, r), d)| QMatrix::new(t, r, self.cols, d).expect("valid matrix"))
            .collect()
    }

    /// The quantized ones also in lane order.
    fn lane_ordered(&self) -> Vec<QMatrix<'_>> {
        self.stored()
            .into_iter()
            .zip(&self.lanes)
            .map(|(w, l)| l.as_ref().map_or(w, |l| w.with_lanes(l)))
            .collect()
    }
}

#[test]
fn matmul_multi_equals_separate_matmuls() {
    let mut rng = Rng(3);
    let cols = 128;
    let shapes = [
        (GgmlType::Q4_1, 45),
        (GgmlType::Q8_0, 17),
        (GgmlType::F16, 9),
        (GgmlType::Q4_1, 64),
    ];
    let weights = Weights::random(&mut rng, &shapes, cols);
    let (plain, ordered) = (weights.stored(), weights.lane_ordered());
    let pool = ThreadPool::new(2);
    for (m, ws) in [1, 3, 8, 33]
        .into_iter()
        .flat_map(|m| [(m, &plain), (m, &ordered)])
    {
        let x = random_acts(&mut rng, m * cols);
        for level in levels() {
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_multi_with(level, &pool, ws, &x, m, &mut refs);
            for (w, got) in ws.iter().zip(&outs) {
                let mut want = vec![f32::NAN; m * w.rows];
                matmul_with(level, &pool, w, &x, m, &mut want);
                assert_eq!(got, &want, "{} rows={} m={m} {level:?}", w.dtype, w.rows);
            }
        }
    }
}

/// A product with a fused norm or residual gives the bits of the separate operations, at every
/// level and batch size, on stored and lane-ordered weights alike.
#[test]
fn fused_operations_equal_separate_ones() {
    let mut rng = Rng(11);
    let cols = 96;
    let shapes = [
        (GgmlType::Q4_1, 40),
        (GgmlType::Q8_0, 24),
        (GgmlType::F16, 8),
    ];
    let weights = Weights::random(&mut rng, &shapes, cols);
    let (plain, ordered) = (weights.stored(), weights.lane_ordered());
    let weight: Vec<f32> = random_acts(&mut rng, cols)
        .iter()
        .map(|v| 1.0 + v)
        .collect();
    let pool = ThreadPool::new(2);
    for m in [1, 3, 8, 33] {
        let x = random_acts(&mut rng, m * cols);
        for ws in [&plain, &ordered] {
            for level in levels() {
                let what = format!("m={m} {level:?} lanes={}", ws[0].lanes.is_some());
                // The norm, with all the weights (one of them float) or the float one alone.
                for ws in [&ws[..], &ws[2..]] {
                    let mut want_xn = vec![0.0; m * cols];
                    rms_norm(&x, &weight, 1e-5, m, &mut want_xn);
                    let mut want: Vec<Vec<f32>> =
                        ws.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
                    let mut refs: Vec<&mut [f32]> = want.iter_mut().map(|v| &mut v[..]).collect();
                    matmul_multi_with(level, &pool, ws, &want_xn, m, &mut refs);
                    let mut xn = vec![f32::NAN; m * cols];
                    let mut got: Vec<Vec<f32>> =
                        ws.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
                    let mut refs: Vec<&mut [f32]> = got.iter_mut().map(|v| &mut v[..]).collect();
                    let norm = RowNorm {
                        weight: &weight,
                        eps: 1e-5,
                        out: &mut xn,
                    };
                    let fused = Fused {
                        prologue: Some(Prologue::Norm(norm)),
                        residual: None,
                    };
                    matmul_fused_with(level, &pool, ws, &x, m, &mut refs, fused);
                    assert_eq!(xn, want_xn, "{what}: normed rows");
                    assert_eq!(got, want, "{what}: normed product");
                    // SwiGLU with `x` as the gate, and a residual.
                    let up = random_acts(&mut rng, m * cols);
                    let mut want_h = x.clone();
                    silu_mul(&mut want_h, &up);
                    let mut want = vec![f32::NAN; m * ws[0].rows];
                    matmul_with(level, &pool, &ws[0], &want_h, m, &mut want);
                    let base = random_acts(&mut rng, m * ws[0].rows);
                    let want: Vec<f32> = base.iter().zip(&want).map(|(b, y)| b + y).collect();
                    let (mut got, mut up, mut y) = (base, up, vec![f32::NAN; m * ws[0].rows]);
                    let fused = Fused {
                        prologue: Some(Prologue::SwiGlu { up: &mut up }),
                        residual: Some(&mut got),
                    };
                    matmul_fused_with(level, &pool, &ws[..1], &x, m, &mut [&mut y], fused);
                    assert_eq!(up, want_h, "{what}: SwiGLU rows");
                    assert_eq!(got, want, "{what}: SwiGLU product and residual");
                }
                for w in ws.iter() {
                    let base = random_acts(&mut rng, m * w.rows);
                    let mut want = vec![f32::NAN; m * w.rows];
                    matmul_with(level, &pool, w, &x, m, &mut want);
                    let want: Vec<f32> = base.iter().zip(&want).map(|(b, y)| b + y).collect();
                    let (mut got, mut y) = (base.clone(), vec![f32::NAN; m * w.rows]);
                    let fused = Fused {
                        prologue: None,
                        residual: Some(&mut got),
                    };
                    matmul_fused_with(level, &pool, &[*w], &x, m, &mut [&mut y], fused);
                    assert_eq!(got, want, "{what} {}: residual", w.dtype);
                }
            }
        }
    }
}

/// The runs of a product cover every row of every matrix once, in order, give each thread's
/// share the same number of 16-row units, give or take one, and get no longer within a share.
#[test]
fn row_runs_cover_the_rows_in_equal_shares() {
    let data = vec![0u8; 3072 * 18 * 20];
    for (rows, threads) in [
        (vec![576, 192, 192], 2),
        (vec![1536, 1536], 2),
        (vec![576], 3),
        (vec![45, 17, 9, 64], 2),
        (vec![5], 4),
    ] {
        let ws: Vec<QMatrix> = rows
            .iter()
            .map(|&r| QMatrix::new(GgmlType::Q4_1, r, 32, &data[..r * 20]).expect("valid"))
            .collect();
        let runs = RowRuns::new(&ws, threads);
        let mut next = vec![0; rows.len()];
        let mut units = vec![0; threads];
        for k in 0..runs.len() {
            let len = |k| runs.boundary(k + 1) - runs.boundary(k);
            if k % RUNS_PER_THREAD > 0 {
                assert!(
                    len(k) <= len(k - 1),
                    "{rows:?}: run {k} longer than the one before"
                );
            }
            for (j, r) in runs.pieces(k) {
                assert_eq!(
                    r.start, next[j],
                    "{rows:?}: matrix {j} resumes where it stopped"
                );
                next[j] = r.end;
                units[k / RUNS_PER_THREAD] += r.len().div_ceil(ROW_UNIT);
            }
        }
        assert_eq!(next, rows, "every row once");
        let (lo, hi) = (units.iter().min(), units.iter().max());
        assert!(hi.unwrap() - lo.unwrap() <= 1, "{rows:?}: shares {units:?}");
    }
}

#[test]
fn float_weights_match_reference() {
    let mut rng = Rng(4);
    for dtype in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for &(rows, cols) in &[(13, 40), (33, 17), (8, 576)] {
            let data = random_matrix(&mut rng, dtype, rows, cols);
            let w = QMatrix::new(dtype, rows, cols, &data).expect("valid matrix");
            for m in [1, 3, 8] {
                let x = random_acts(&mut rng, m * cols);
                let want = reference(&w, &x, m);
                for level in levels() {
                    for threads in [1, 2] {
                        let got = run_matmul(level, threads, &w, &x, m);
                        assert_close(
                            &got,
                            &want,
                            1e-5,
                            &format!("{dtype} {rows}x{cols} m={m} {level:?}"),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn dequantize_hand_written_blocks() {
    // Q4_1: d = 0.5, m = -1; qs[j] = j | (15 - j) << 4.
    let mut blk = Vec::new();
    blk.extend(f16::from_f32(0.5).to_le_bytes());
    blk.extend(f16::from_f32(-1.0).to_le_bytes());
    blk.extend((0..16u8).map(|j| j | (15 - j) << 4));
    let mut out = [0f32; 32];
    dequantize_row(GgmlType::Q4_1, &blk, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], 0.5 * j as f32 - 1.0);
        assert_eq!(out[j + 16], 0.5 * (15 - j) as f32 - 1.0);
    }
    // Q8_0: d = 0.25, qs = -128, -120, ..., 120.
    let mut blk = Vec::new();
    blk.extend(f16::from_f32(0.25).to_le_bytes());
    blk.extend((0..32).map(|j| (j * 8 - 128) as i8 as u8));
    let qs: Vec<i8> = blk[2..].iter().map(|&b| b as i8).collect();
    dequantize_row(GgmlType::Q8_0, &blk, &mut out);
    for j in 0..32 {
        assert_eq!(out[j], 0.25 * qs[j] as f32);
    }
    assert!(qs[0] == -128 && qs[31] == 120);
    // Floats.
    let vals = [1.5f32, -2.25, 0.0, 1024.0];
    let f32s: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16s: Vec<u8> = vals
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = vals
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    for (t, bytes) in [
        (GgmlType::F32, f32s),
        (GgmlType::F16, f16s),
        (GgmlType::BF16, bf16s),
    ] {
        let mut o = [0f32; 4];
        dequantize_row(t, &bytes, &mut o);
        assert_eq!(o, vals, "{t}");
    }
}

#[test]
fn dot_and_axpy_any_length() {
    let mut rng = Rng(5);
    for n in (0..70).chain([127, 576, 1000]) {
        let a = random_acts(&mut rng, n);
        let b = random_acts(&mut rng, n);
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let alpha = rng.uniform(-2.0, 2.0);
        let axpy_want: Vec<f32> = a.iter().zip(&b).map(|(&x, &y)| y + alpha * x).collect();
        for level in levels() {
            let got = dot_f32_with(level, &a, &b);
            assert!(
                (got as f64 - want).abs() <= 1e-5 * (1.0 + n as f64),
                "n={n} {level:?}: {got} vs {want}"
            );
            let mut y = b.clone();
            axpy_with(level, alpha, &a, &mut y);
            assert_close(&y, &axpy_want, 1e-6, &format!("axpy n={n} {level:?}"));
        }
    }
    assert_eq!(dot_f32(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]), 32.0);
    let mut y = [1.0f32; 17];
    axpy(2.0, &[3.0; 17], &mut y);
    assert_eq!(y, [7.0; 17]);
}

#[test]
fn qmatrix_validates_shape() {
    let data = vec![0u8; 3 * 2 * 20];
    assert!(QMatrix::new(GgmlType::Q4_1, 3, 64, &data).is_ok());
    assert!(
        QMatrix::new(GgmlType::Q4_1, 3, 48, &data).is_err(),
        "cols not a multiple of 32"
    );
    assert!(
        QMatrix::new(GgmlType::Q4_1, 4, 64, &data).is_err(),
        "too few bytes"
    );
    assert!(
        QMatrix::new(GgmlType::Q4_1, 2, 64, &data).is_err(),
        "too many bytes"
    );
    let w = QMatrix::new(GgmlType::Q4_1, 3, 64, &data).expect("valid");
    assert_eq!(w.row_bytes(), 40);
    assert_eq!(w.row(2).len(), 40);
    assert!(QMatrix::new(GgmlType::F16, 3, 7, &data[..42]).is_ok());
}

#[test]
fn forced_levels_never_exceed_the_cpu() {
    for level in ALL_LEVELS {
        let forced = level.clamp();
        let cap = super::detected().1;
        assert!(forced.rank() <= cap.rank() && forced.rank() <= level.rank());
        assert!(
            forced.runs_here(),
            "{level:?} lowered to {forced:?}, which this CPU lacks"
        );
    }
    assert_eq!(SimdLevel::Scalar.clamp(), SimdLevel::Scalar);
    for level in SimdLevel::alternatives() {
        assert!(level.runs_here() && level.clamp() == level);
    }
}

/// Unforced, the chosen level is the best this CPU runs, but for bf16 attention where it does
/// not pay (Intel): there `avx512vnni`, with `avx512bf16` still reachable under the cap.
#[test]
fn the_default_level_skips_bf16_attention_only_where_it_does_not_pay() {
    if std::env::var_os("SLUICE_SIMD").is_some() {
        return;
    }
    let (chosen, cap) = super::detected();
    assert_eq!(cap, SimdLevel::Amx.best_at_or_below());
    if cap == SimdLevel::Avx512Bf16 && !super::bf16_attention_pays() {
        assert_eq!(chosen, SimdLevel::Avx512Vnni);
        assert!(SimdLevel::alternatives().any(|l| l == SimdLevel::Avx512Bf16));
        assert_eq!(SimdLevel::Avx512Bf16.clamp(), SimdLevel::Avx512Bf16);
    } else {
        assert_eq!(chosen, cap);
    }
}

/// Prefill-sized product, enough rows for many tiles and tasks with 2 threads.
#[test]
fn large_batch_matches_scalar() {
    let mut rng = Rng(6);
    let (rows, cols, m) = (96, 576, 130);
    for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let data = random_matrix(&mut rng, dtype, rows, cols);
        let w = QMatrix::new(dtype, rows, cols, &data).expect("valid matrix");
        let x = random_acts(&mut rng, m * cols);
        let scalar = run_matmul(SimdLevel::Scalar, 1, &w, &x, m);
        assert!(rel_err(&scalar, &reference(&w, &x, m)) < 1.5e-2);
        let best = run_matmul(simd_level(), 2, &w, &x, m);
        assert_close(&best, &scalar, 1e-4, &format!("{dtype} m={m}"));
    }
}

/// Every decode batch size (token tiles of one to eight and their splits, row tiles of 16 and
/// partial ones) on rows of whole and partial groups of 16 blocks.
#[test]
fn small_batches_match_scalar() {
    let mut rng = Rng(8);
    for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for &(rows, cols) in &[(7, 32 * 16), (19, 32 * 17), (6, 32 * 35), (37, 32 * 22)] {
            let data = random_matrix(&mut rng, dtype, rows, cols);
            let w = QMatrix::new(dtype, rows, cols, &data).expect("valid matrix");
            for m in 1..18 {
                let x = random_acts(&mut rng, m * cols);
                let scalar = run_matmul(SimdLevel::Scalar, 1, &w, &x, m);
                let best = run_matmul(simd_level(), 2, &w, &x, m);
                let what = format!("{dtype} {rows}x{cols} m={m}");
                assert_close(&best, &scalar, 1e-4, &what);
            }
        }
    }
}

/// A token's outputs are the same, bit for bit, whatever else is in the batch (its size, the
/// token's place in it, the task split): a request's result must not depend on its neighbours.
#[test]
fn outputs_do_not_depend_on_the_batch() {
    let mut rng = Rng(9);
    for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let (rows, cols, m) = (83, 576, 21);
        let data = random_matrix(&mut rng, dtype, rows, cols);
        let w = QMatrix::new(dtype, rows, cols, &data).expect("valid matrix");
        let x = random_acts(&mut rng, m * cols);
        type Run = fn(SimdLevel, usize, &QMatrix, &[f32], usize) -> Vec<f32>;
        let runs: [(&str, Run); 2] = [("", run_matmul), (" stored", run_stored_layout)];
        for (level, (layout, run)) in levels().into_iter().flat_map(|l| runs.map(|r| (l, r))) {
            let all = run(level, 2, &w, &x, m);
            for (start, len) in [(0, 1), (5, 1), (20, 1), (3, 2), (7, 8), (0, 17)] {
                for threads in [1, 2] {
                    let part = &x[start * cols..(start + len) * cols];
                    let got = run(level, threads, &w, part, len);
                    let want = &all[start * rows..(start + len) * rows];
                    let same = got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    let what = format!("{dtype} {level:?}{layout} tokens {start}..+{len}");
                    assert!(same, "{what} t={threads}");
                }
            }
        }
    }
}

/// The lane kernels (AVX-512 and AVX2) and the portable tile share one arithmetic: the same bits
/// at every level, for every batch size and a partial last group of rows.
#[test]
fn lane_kernels_give_the_portable_bits() {
    let mut rng = Rng(10);
    for dtype in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let (rows, cols) = (37, 32 * 18);
        let data = random_matrix(&mut rng, dtype, rows, cols);
        let w = QMatrix::new(dtype, rows, cols, &data).expect("valid matrix");
        for m in [1, 2, 3, 6, 8, 9, 70] {
            let x = random_acts(&mut rng, m * cols);
            let scalar = run_matmul(SimdLevel::Scalar, 1, &w, &x, m);
            for level in levels().into_iter().filter(|&l| lane_kernel(l)) {
                let got = run_matmul(level, 2, &w, &x, m);
                let same = got
                    .iter()
                    .zip(&scalar)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{dtype} m={m} {level:?}");
            }
        }
    }
}
