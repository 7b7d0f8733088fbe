//! Attention kernels: against an f64 reference, and rows against the same rows in other calls.

use super::*;

/// Attention over a scattered block table against an f64 reference, and against the portable
/// path, for head sizes with and without a partial vector, groups of one to five query heads,
/// block sizes the AVX-512 path takes (16) and others, and contexts across several blocks.
#[test]
fn attention_rows_match_reference() {
    let mut rng = Rng(7);
    let cases = [
        (64usize, 16usize, 3usize, 1usize, 1usize),
        (64, 16, 3, 3, 45),
        (8, 4, 1, 2, 9),
        (40, 5, 5, 4, 130),
        (128, 16, 2, 2, 20),
        (40, 16, 4, 1, 33),
        // Several tiles of the tiled kernels (16 rows of 3 heads and a rest, groups of 7 heads
        // split in 6 + 1, small tiles of a row of 1 to 4 queries).
        (64, 16, 3, 19, 5),
        (64, 16, 1, 30, 40),
        (32, 16, 7, 3, 70),
        // One full tile of 16 rows x 3 heads from the first position, 48 + 22 rows of one head,
        // heads of 8 vectors (more accumulators than registers), 24 rows of 2.
        (64, 16, 3, 16, 1),
        (64, 16, 1, 70, 3),
        (128, 16, 3, 20, 20),
        (32, 16, 2, 30, 50),
    ];
    for (hd, bs, heads, n_rows, n_ctx0) in cases {
        let n_max = n_ctx0 + n_rows - 1;
        let n_blocks = n_max.div_ceil(bs);
        // Blocks in reverse order, with gaps, and space between blocks.
        let blocks: Vec<u32> = (0..n_blocks as u32).rev().map(|b| 2 * b + 1).collect();
        let block_stride = bs * hd + 7;
        let slots = (2 * n_blocks + 2) * bs;
        // Keys large enough for peaked softmaxes (scores of a few tens), values exact in f16,
        // `[position][hd]` in position order.
        let f16_exact = |x: f32| f16::from_f32(x).to_f32();
        let k: Vec<f32> = (0..n_max * hd)
            .map(|_| f16_exact(rng.uniform(-3.0, 3.0)))
            .collect();
        let v: Vec<f32> = random_acts(&mut rng, n_max * hd)
            .into_iter()
            .map(f16_exact)
            .collect();
        // The caches in each format (unwritten slots NaN: no kernel may read them into a sum).
        let cache = |format| {
            let len = slots * block_stride / bs + hd;
            let (mut kc, mut vc) = (vec![0xffffu16; len], vec![0xffffu16; len]);
            for p in 0..n_max {
                let (base, i) = (blocks[p / bs] as usize * block_stride, p % bs);
                store_kv(
                    format,
                    i,
                    &k[p * hd..][..hd],
                    &v[p * hd..][..hd],
                    &mut kc[base..][..hd * bs],
                    &mut vc[base..][..hd * bs],
                );
            }
            (kc, vc)
        };
        let (kc, vc) = cache(KvFormat::F16);
        let q_stride = heads * hd + 3;
        let q = random_acts(&mut rng, n_rows * q_stride);
        let scale = 1.0 / (hd as f32).sqrt();
        let kv = KvHead {
            k: &kc,
            v: &vc,
            head_dim: hd,
            block_stride,
            blocks: &blocks,
            block_size: bs,
            format: KvFormat::F16,
        };
        let mut want = vec![0f32; n_rows * heads * hd];
        for (i, w) in want.chunks_exact_mut(hd).enumerate() {
            let (r, g) = (i / heads, i % heads);
            let qr = &q[r * q_stride + g * hd..][..hd];
            let s: Vec<f64> = (0..n_ctx0 + r)
                .map(|p| {
                    let dot: f64 = qr
                        .iter()
                        .zip(&k[p * hd..])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    dot * scale as f64
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for (t, wt) in w.iter_mut().enumerate() {
                let o: f64 = e
                    .iter()
                    .enumerate()
                    .map(|(p, x)| x / z * v[p * hd + t] as f64)
                    .sum();
                *wt = o as f32;
            }
        }
        let what = |level| format!("attention hd={hd} bs={bs} heads={heads} {level:?}");
        for level in levels() {
            let format = KvFormat::for_level(level, hd, bs);
            let (kl, vl) = cache(format);
            let kv_level = KvHead {
                k: &kl,
                v: &vl,
                format,
                ..kv
            };
            let kv_level = &kv_level;
            let mut got = vec![f32::NAN; want.len()];
            attend_rows_with(
                level, kv_level, &q, q_stride, hd, heads, n_ctx0, scale, &mut got,
            );
            if matches!(level, SimdLevel::Avx512Bf16 | SimdLevel::Amx) {
                // bf16 factors carry 8 bits of mantissa (each rounding within 2^-9 relative):
                // scores of a few tens move by a few hundredths, and a peaked softmax's weights
                // by as many percent. Measured: at most 1.4% an element, 0.31% RMS.
                assert_close(&got, &want, 2.5e-2, &what(level));
                let rms_err = rel_err(&got, &want);
                assert!(rms_err < 5e-3, "{}: RMS error {rms_err}", what(level));
            } else {
                assert_close(&got, &want, 2e-6, &what(level));
            }
            let mut calls = vec![f32::NAN; want.len()];
            attention::portable_for_test(
                level, &kv, &q, q_stride, hd, heads, n_ctx0, scale, &mut calls,
            );
            assert_close(&calls, &want, 2e-6, &format!("{} portable", what(level)));
            // Each row alone, and each head alone, gives the same bits as the whole call.
            for r in 0..n_rows {
                for g in 0..heads {
                    let mut one = vec![f32::NAN; hd];
                    let qg = &q[r * q_stride + g * hd..];
                    attend_rows_with(
                        level,
                        kv_level,
                        qg,
                        q_stride,
                        hd,
                        1,
                        n_ctx0 + r,
                        scale,
                        &mut one,
                    );
                    let at = (r * heads + g) * hd;
                    let same = one
                        .iter()
                        .zip(&got[at..at + hd])
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{}: row {r} head {g} alone differs", what(level));
                }
            }
        }
    }
}

/// The AVX-512 and AVX2 `exp` (attention's softmax, SwiGLU) against `f32::exp` (bit for bit on
/// glibc over [-104, 0]; within an ulp elsewhere and on other C libraries), over [-110, 90] and
/// some special values.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp_matches_libm() {
    for level in levels() {
        if level != SimdLevel::Scalar {
            exp_matches_libm(level);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn exp_matches_libm(level: SimdLevel) {
    let mut xs: Vec<f32> = (0..1 << 20)
        .map(|i| -110.0 + 200.0 * i as f32 / (1 << 20) as f32)
        .collect();
    xs.extend([
        0.0,
        -0.0,
        -1e-30,
        1e-30,
        -87.5,
        -103.97,
        -103.98,
        -1e4,
        f32::NEG_INFINITY,
        88.72,
        88.73,
        89.5,
        1e4,
        f32::INFINITY,
    ]);
    xs.resize(xs.len().next_multiple_of(8), -1.0);
    let (mut exact, mut worst) = (0, 0u32);
    for c in xs.chunks_exact(8) {
        let got = vexp::exp8(level, c);
        for (&x, g) in c.iter().zip(got) {
            let want = x.exp();
            let ulps = g.to_bits().abs_diff(want.to_bits());
            if ulps > 1 {
                eprintln!("x={x} got {g} want {want}");
            }
            worst = worst.max(ulps);
            exact += usize::from(ulps == 0);
        }
    }
    assert!(worst <= 1, "{level:?} exp: {worst} ulps off");
    eprintln!("{level:?} exp: {exact} of {} bit-exact", xs.len());
    assert!(vexp::exp8(level, &[f32::NAN; 8])[0].is_nan());
    assert_eq!(vexp::exp8(level, &[100.0; 8])[0], f32::INFINITY);
    assert_eq!(vexp::exp8(level, &[-1e4; 8])[0], 0.0);
}

/// The tiled kernels' softmax `exp` (AVX2's 8 lanes, AVX-512's 16) within 2 ulps of `f32::exp`
/// over [-104, 0] (where a weight is a normal float or close to one), and exactly 0 for -inf and
/// below -150 (masked lanes weigh nothing).
#[cfg(target_arch = "x86_64")]
#[test]
fn tiled_softmax_exp_is_within_two_ulps() {
    if SimdLevel::Avx2.clamp() == SimdLevel::Avx2 {
        // SAFETY: AVX2 and FMA are present (the level runs here).
        softmax_exp_is_within_two_ulps("avx2", |x: &[f32; 8]| unsafe { ymm2::exp8_for_test(x) });
    }
    if SimdLevel::Avx512.clamp() == SimdLevel::Avx512 {
        // SAFETY: AVX-512 F is present (the level runs here).
        softmax_exp_is_within_two_ulps("avx512", |x: &[f32; 16]| unsafe {
            flash512::exp16_for_test(x)
        });
    }
}

#[cfg(target_arch = "x86_64")]
fn softmax_exp_is_within_two_ulps<const N: usize>(what: &str, exp: impl Fn(&[f32; N]) -> [f32; N]) {
    let mut worst = 0u32;
    let xs: Vec<f32> = (0..1 << 20)
        .map(|i| -104.0 * i as f32 / (1 << 20) as f32)
        .chain([0.0, -0.0, -1e-30, -87.3, -126.0 * std::f32::consts::LN_2])
        .collect();
    for c in xs.chunks(N) {
        let mut x = [0f32; N];
        x[..c.len()].copy_from_slice(c);
        for (&x, g) in x.iter().zip(exp(&x)) {
            worst = worst.max(g.to_bits().abs_diff(x.exp().to_bits()));
        }
    }
    assert!(worst <= 2, "{what} tiled exp: {worst} ulps off");
    let mut x = [-150.5f32; N];
    x[0] = f32::NEG_INFINITY;
    x[1] = -1e4;
    let got = exp(&x);
    assert!(got.iter().all(|&g| g.to_bits() == 0), "{what}: {got:?}");
}

/// The AMX kernel's base-2 softmax weight within 1e-4 relative of `f64::exp2` over [-126, 8]
/// (a weight of a normal float up to the lazy rescale's `2^8`), and exactly 0 for a masked lane and below
/// -150.
#[cfg(target_arch = "x86_64")]
#[test]
fn amx_softmax_exp2_is_within_1e_4() {
    if SimdLevel::Amx.clamp() != SimdLevel::Amx {
        return;
    }
    let xs: Vec<f32> = (0..=1 << 20)
        .map(|i| -126.0 + 134.0 * i as f32 / (1 << 20) as f32)
        .chain([0.0, -0.0, -1e-30, 8.0, -0.5, 0.5])
        .collect();
    let mut worst = 0f64;
    for c in xs.chunks(16) {
        let mut x = [0f32; 16];
        x[..c.len()].copy_from_slice(c);
        // SAFETY: AVX-512 F and DQ are present (the AMX level runs here).
        let got = unsafe { flash_amx::exp2_16_for_test(&x) };
        for (&x, g) in x.iter().zip(got) {
            let want = (x as f64).exp2();
            worst = worst.max((g as f64 - want).abs() / want);
        }
    }
    assert!(worst < 1e-4, "amx exp2: {worst:e} relative");
    let mut x = [-150.5f32; 16];
    x[0] = flash_amx::MASKED;
    x[1] = -1e4;
    // SAFETY: as above.
    let got = unsafe { flash_amx::exp2_16_for_test(&x) };
    assert!(got.iter().all(|&g| g.to_bits() == 0), "amx exp2: {got:?}");
}
