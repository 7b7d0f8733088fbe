//! The device check (`scripts/gpu-check.sh` runs it on a GPU machine): every kernel against its
//! CPU twin on seeded random inputs with the model's shapes, and the kernels' own timings.
//! Writes `gpu-check.json` to the directory it is given and prints one line per check; then the
//! model-level checks (`backend::cuda::model_check`: the synthetic model on CPU and CUDA for 1
//! and 3 ranks, and bench with and without graphs) into `gpu-check-model.json`, unless the
//! second argument is `--kernels`. With `--golden MODEL GOLDEN` instead, the bundled model on
//! CUDA against llama.cpp's golden records (`backend::cuda::golden`), into `gpu-check-golden.json`.
//!
//! `cargo run --release -p sluice-engine --features cuda --example gpu_check -- OUT_DIR`
//! (with `SLUICE_CUDA_PTX=target/cuda-ptx` where the machine's NVRTC is not 12.x).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;

use cudarc::driver::PushKernelArg;
use sluice_engine::backend::cuda::device::{config, driver, Gpu};
use sluice_engine::backend::cuda::twins::attention::{self, Paged};
use sluice_engine::backend::cuda::twins::inputs::{paged_cache, q4_1, q8_0, rel_err, rope, Rng};
use sluice_engine::backend::cuda::twins::{f16_round, matvec, norm_quant};
use sluice_engine::error::Result;

/// One comparison: what, the error, its bound.
struct Check {
    name: String,
    err: f64,
    bound: f64,
}

/// One step of the check.
type Step = fn(&Gpu, &mut Rng, &mut Report) -> Result<()>;

struct Report {
    checks: Vec<Check>,
    timings: Vec<(String, f64, f64)>,
}

impl Report {
    fn check(&mut self, name: impl Into<String>, err: f64, bound: f64) {
        let name = name.into();
        let pass = err <= bound;
        println!(
            "{:<4} {name:<44} error {err:.3e} (bound {bound:.0e})",
            if pass { "ok" } else { "FAIL" }
        );
        self.checks.push(Check { name, err, bound });
    }

    fn time(&mut self, name: impl Into<String>, us: f64, gbps: f64) {
        let name = name.into();
        println!("time {name:<44} {us:9.2} us  {gbps:8.1} GB/s");
        self.timings.push((name, us, gbps));
    }
}

fn matvecs(gpu: &Gpu, rng: &mut Rng, r: &mut Report) -> Result<()> {
    for (rows, cols) in [(576, 576), (1536, 576), (576, 1536), (49152, 576)] {
        let wf = rng.vec(rows * cols, 0.05);
        for (q8, bytes) in [(false, q4_1(&wf)), (true, q8_0(&wf))] {
            let w = gpu.upload(&bytes)?;
            for nbatch in [1, 3, 8] {
                let x = rng.vec(nbatch * cols, 2.0);
                let q = norm_quant::quantize_rows(&x, cols);
                let (qs, ds) = (gpu.upload(&q.qs)?, gpu.upload(&q.ds)?);
                let residual = rng.vec(nbatch * rows, 1.0);
                let mut out = gpu.upload(&residual)?;
                gpu.matvec(q8, &w, rows, cols, &qs, &ds, nbatch, &mut out, true)?;
                let got = gpu.download(&out)?;
                let want = matvec::matvec(q8, &bytes, rows, cols, &q, nbatch, Some(&residual));
                let ty = if q8 { "q8_0" } else { "q4_1" };
                r.check(
                    format!("matvec_{ty} {rows}x{cols} b{nbatch} +residual"),
                    f64::from(rel_err(&got, &want)),
                    2e-6,
                );
                let reps = 200;
                gpu.sync()?;
                let t = Instant::now();
                for _ in 0..reps {
                    gpu.matvec(q8, &w, rows, cols, &qs, &ds, nbatch, &mut out, false)?;
                }
                gpu.sync()?;
                let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(reps);
                r.time(
                    format!("matvec_{ty} {rows}x{cols} b{nbatch}"),
                    us,
                    bytes.len() as f64 / us / 1e3,
                );
            }
        }
    }
    Ok(())
}

fn norms(gpu: &Gpu, rng: &mut Rng, r: &mut Report) -> Result<()> {
    let (rows, cols) = (8, 576);
    let mut x = rng.vec(rows * cols, 3.0);
    let residual = rng.vec(rows * cols, 1.0);
    let w = rng.vec(cols, 1.0);
    let (mut xd, rd, wd) = (gpu.upload(&x)?, gpu.upload(&residual)?, gpu.upload(&w)?);
    let (mut qs, mut ds, mut xn) = (
        gpu.zeros::<i8>(rows * cols)?,
        gpu.zeros::<f32>(rows * cols / 16)?,
        gpu.zeros::<f32>(rows * cols)?,
    );
    gpu.norm_quant(
        &mut xd,
        Some(&rd),
        &wd,
        1e-5,
        rows,
        cols,
        &mut qs,
        &mut ds,
        Some(&mut xn),
    )?;
    let (want_xn, want_q) = norm_quant::add_rms_norm_quant(&mut x, Some(&residual), &w, 1e-5, cols);
    r.check(
        "add_rms_norm_quant residual sum",
        f64::from(rel_err(&gpu.download(&xd)?, &x)),
        0.0,
    );
    r.check(
        "add_rms_norm_quant normed rows",
        f64::from(rel_err(&gpu.download(&xn)?, &want_xn)),
        1e-6,
    );
    let got_q = gpu.download(&qs)?;
    let differ = got_q.iter().zip(&want_q.qs).filter(|(a, b)| a != b).count();
    r.check(
        "add_rms_norm_quant q8_1 values differing",
        differ as f64 / got_q.len() as f64,
        1e-3,
    );

    let (gate, up) = (rng.vec(rows * 1536, 4.0), rng.vec(rows * 1536, 2.0));
    let (gd, ud) = (gpu.upload(&gate)?, gpu.upload(&up)?);
    let (mut qs, mut ds) = (
        gpu.zeros::<i8>(rows * 1536)?,
        gpu.zeros::<f32>(rows * 1536 / 16)?,
    );
    gpu.swiglu_quant(&gd, &ud, rows, 1536, &mut qs, &mut ds)?;
    let (_, want) = norm_quant::swiglu_quant(&gate, &up, 1536);
    let got = gpu.download(&qs)?;
    let worst = got
        .iter()
        .zip(&want.qs)
        .map(|(a, b)| (i32::from(*a) - i32::from(*b)).abs())
        .max()
        .unwrap_or(0);
    r.check(
        "swiglu_quant largest q8_1 difference",
        f64::from(worst),
        1.0,
    );
    r.check(
        "swiglu_quant scales",
        f64::from(rel_err(&gpu.download(&ds)?, &want.ds)),
        1e-5,
    );

    let mut logits = rng.vec(4 * 49152, 10.0);
    logits[1234] = 20.0;
    logits[1234 + 77] = 20.0;
    let ld = gpu.upload(&logits)?;
    let mut idx = gpu.zeros::<i32>(4)?;
    gpu.argmax(&ld, 4, 49152, &mut idx)?;
    let got = gpu.download(&idx)?;
    let wrong = got
        .iter()
        .enumerate()
        .filter(|(i, &g)| g as u32 != matvec::argmax(&logits[i * 49152..(i + 1) * 49152]))
        .count();
    r.check(
        "argmax_rows rows wrong (ties: lowest index)",
        wrong as f64,
        0.0,
    );
    Ok(())
}

fn attention_checks(gpu: &Gpu, rng: &mut Rng, r: &mut Report) -> Result<()> {
    let (n_heads, n_kv, d) = (9usize, 3usize, 64usize);
    let scale = 1.0 / (d as f32).sqrt();
    for len in [1usize, 17, 1000, 8192] {
        let blocks = len.div_ceil(16);
        let (k, v, table) = paged_cache(rng, len, n_kv, d);
        let bits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&f| half::f16::from_f32(f).to_bits())
                .collect()
        };
        let (kd, vd, td) = (
            gpu.upload(&bits(&k))?,
            gpu.upload(&bits(&v))?,
            gpu.upload(&table)?,
        );
        let cache = Paged {
            k: &k,
            v: &v,
            n_kv,
            head_dim: d,
            table: &table,
        };
        let q = rng.vec(n_heads * d, 1.0);
        let qd = gpu.upload(&q)?;
        let (_, split_len, n_splits) =
            sluice_engine::backend::cuda::launch::decode(n_kv, 1, len, gpu.sms);
        let mut acc = gpu.zeros::<f32>(n_heads * n_splits * d)?;
        let mut ml = gpu.zeros::<f32>(n_heads * n_splits * 2)?;
        let mut out = gpu.zeros::<f32>(n_heads * d)?;
        let (rows, lens) = (gpu.upload(&[0i32])?, gpu.upload(&[len as i32])?);
        gpu.attend_decode(
            &qd,
            &rows,
            &kd,
            &vd,
            &td,
            blocks,
            &lens,
            1,
            len,
            (n_heads, n_kv, d),
            (&mut acc, &mut ml),
            &mut out,
        )?;
        let want = attention::decode(&q, &cache, n_heads, len, split_len, scale);
        r.check(
            format!("attn_decode+combine len {len} ({n_splits} splits)"),
            f64::from(rel_err(&gpu.download(&out)?, &want)),
            1e-5,
        );

        // A prefill chunk of the last min(len, 64) positions, its keys already in the cache.
        let nq = len.min(64);
        let p0 = len - nq;
        let qs = rng.vec(nq * n_heads * d, 1.0);
        let qsd = gpu.upload(&qs)?;
        let mut outp = gpu.zeros::<f32>(nq * n_heads * d)?;
        let (first, count, pos) = (
            gpu.upload(&[0i32])?,
            gpu.upload(&[nq as i32])?,
            gpu.upload(&[p0 as i32])?,
        );
        let ints = [blocks as i32, n_heads as i32, n_kv as i32];
        let mut b = gpu.stream.launch_builder(gpu.function("attn_prefill"));
        b.arg(&qsd)
            .arg(&first)
            .arg(&count)
            .arg(&pos)
            .arg(&kd)
            .arg(&vd)
            .arg(&td);
        b.arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&scale)
            .arg(&mut outp);
        let s = sluice_engine::backend::cuda::launch::prefill(n_heads, nq, 1);
        // SAFETY: the arguments are the kernel's signature; every buffer holds what it reads.
        unsafe { b.launch(config(s)) }.map_err(|e| driver("attn_prefill", e))?;
        let want = attention::prefill(&qs, &cache, n_heads, p0, nq, scale);
        r.check(
            format!("attn_prefill len {len} rows {nq}"),
            f64::from(rel_err(&gpu.download(&outp)?, &want)),
            1e-5,
        );
    }
    Ok(())
}

fn rope_check(gpu: &Gpu, rng: &mut Rng, r: &mut Report) -> Result<()> {
    let (rows, n_heads, n_kv, d) = (5usize, 9usize, 3usize, 64usize);
    let positions: Vec<u32> = vec![0, 1, 17, 4000, 12287];
    let (mut q, mut k, v) = (
        rng.vec(rows * n_heads * d, 1.0),
        rng.vec(rows * n_kv * d, 1.0),
        rng.vec(rows * n_kv * d, 1.0),
    );
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 100_000f32.powf(-2.0 * i as f32 / d as f32))
        .collect();
    let slots: Vec<i32> = vec![40, 3, 17, 64, 0];
    let (mut qd, mut kd, vd) = (gpu.upload(&q)?, gpu.upload(&k)?, gpu.upload(&v)?);
    let pos_i: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let (pd, invd, sd) = (gpu.upload(&pos_i)?, gpu.upload(&inv)?, gpu.upload(&slots)?);
    let (mut kc, mut vc) = (
        gpu.zeros::<u16>(65 * n_kv * d)?,
        gpu.zeros::<u16>(65 * n_kv * d)?,
    );
    let ints = [n_heads as i32, n_kv as i32, d as i32];
    let mut b = gpu.stream.launch_builder(gpu.function("rope_kv_store"));
    b.arg(&mut qd)
        .arg(&mut kd)
        .arg(&vd)
        .arg(&pd)
        .arg(&invd)
        .arg(&ints[0])
        .arg(&ints[1])
        .arg(&ints[2])
        .arg(&sd)
        .arg(&mut kc)
        .arg(&mut vc);
    let s = sluice_engine::backend::cuda::launch::rope_kv(rows);
    // SAFETY: the kernel's signature; slots are below the 65 the caches hold.
    unsafe { b.launch(config(s)) }.map_err(|e| driver("rope_kv_store", e))?;
    rope(&mut q, &positions, n_heads, d, d, 100_000.0);
    rope(&mut k, &positions, n_kv, d, d, 100_000.0);
    r.check(
        "rope_kv_store q",
        f64::from(rel_err(&gpu.download(&qd)?, &q)),
        2e-5,
    );
    r.check(
        "rope_kv_store k",
        f64::from(rel_err(&gpu.download(&kd)?, &k)),
        2e-5,
    );
    let kc = gpu.download(&kc)?;
    let vc = gpu.download(&vc)?;
    let mut worst = 0f32;
    for (row, &slot) in slots.iter().enumerate() {
        for i in 0..n_kv * d {
            let at = slot as usize * n_kv * d + i;
            worst = worst.max(
                (half::f16::from_bits(kc[at]).to_f32() - f16_round(k[row * n_kv * d + i])).abs(),
            );
            worst = worst.max(
                (half::f16::from_bits(vc[at]).to_f32() - f16_round(v[row * n_kv * d + i])).abs(),
            );
        }
    }
    r.check("rope_kv_store cache writes (f16)", f64::from(worst), 2e-3);
    Ok(())
}

/// `--golden MODEL GOLDEN`: the bundled model on CUDA against llama.cpp's golden records
/// (`backend::cuda::golden`), into `gpu-check-golden.json`.
fn golden(out: &str, model: &str, records: &str) -> ExitCode {
    if let Err(e) = sluice_engine::backend::cuda::probe::probe() {
        eprintln!("gpu-check: {e}");
        return ExitCode::FAILURE;
    }
    match sluice_engine::backend::cuda::golden::run(model.as_ref(), records.as_ref()) {
        Ok((report, ok)) => {
            let _ = std::fs::write(format!("{out}/gpu-check-golden.json"), report.to_string());
            println!(
                "gpu-check: golden checks {}; {out}/gpu-check-golden.json",
                if ok { "passed" } else { "FAILED" }
            );
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("gpu-check: golden checks: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .get(1)
        .cloned()
        .or_else(|| std::env::var("OUT").ok())
        .unwrap_or_else(|| "target/gpu-check".into());
    let _ = std::fs::create_dir_all(&out);
    if let [_, _, flag, model, records] = &args[..] {
        if flag == "--golden" {
            return golden(&out, model, records);
        }
    }
    let mut r = Report {
        checks: Vec::new(),
        timings: Vec::new(),
    };
    let run = || -> Result<Gpu> {
        let found = sluice_engine::backend::cuda::probe::probe()?;
        println!(
            "probe: {} GPU(s), driver CUDA {}",
            found.devices, found.driver_version
        );
        Gpu::open(0, 64)
    };
    let gpu = match run() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpu-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("gpu: {} multiprocessors", gpu.sms);
    let mut rng = Rng(0x5eed_cafe);
    let steps: [(&str, Step); 4] = [
        ("matvec", matvecs),
        ("norms", norms),
        ("attention", attention_checks),
        ("rope", rope_check),
    ];
    let mut errors = Vec::new();
    for (name, step) in steps {
        if let Err(e) = step(&gpu, &mut rng, &mut r) {
            eprintln!("gpu-check: {name}: {e}");
            errors.push(format!("{name}: {e}"));
        }
    }
    let failed = r.checks.iter().filter(|c| c.err > c.bound).count();
    let mut json = String::from("{\"checks\":[");
    for (i, c) in r.checks.iter().enumerate() {
        let _ = write!(
            json,
            "{}{{\"name\":{:?},\"error\":{},\"bound\":{},\"pass\":{}}}",
            if i > 0 { "," } else { "" },
            c.name,
            c.err,
            c.bound,
            c.err <= c.bound
        );
    }
    json.push_str("],\"timings_us\":[");
    for (i, (n, us, gbps)) in r.timings.iter().enumerate() {
        let _ = write!(
            json,
            "{}{{\"name\":{n:?},\"us\":{us},\"gb_per_s\":{gbps}}}",
            if i > 0 { "," } else { "" }
        );
    }
    let _ = write!(json, "],\"errors\":{errors:?},\"failed\":{failed}}}");
    let _ = std::fs::write(format!("{out}/gpu-check.json"), json);
    println!(
        "gpu-check: {} checks, {failed} failed, {} step errors; {out}/gpu-check.json",
        r.checks.len(),
        errors.len()
    );
    drop(gpu);
    // The model-level checks (synthetic model, CPU against CUDA, bench); `--kernels` skips them.
    let mut model_ok = true;
    if args.get(2).map(String::as_str) != Some("--kernels") {
        match sluice_engine::backend::cuda::model_check::run(&std::env::temp_dir()) {
            Ok((report, ok)) => {
                model_ok = ok;
                let _ = std::fs::write(format!("{out}/gpu-check-model.json"), report.to_string());
                println!(
                    "gpu-check: model checks {}; {out}/gpu-check-model.json",
                    if ok { "passed" } else { "FAILED" }
                );
            }
            Err(e) => {
                model_ok = false;
                eprintln!("gpu-check: model checks: {e}");
            }
        }
    }
    if failed == 0 && errors.is_empty() && model_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
