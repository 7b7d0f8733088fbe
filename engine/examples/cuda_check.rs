//! `make cuda-check`: every CUDA kernel module compiled by NVRTC for `compute_90` and
//! `compute_80`, each kernel assembled for `sm_90` by `ptxas -v`, one line per kernel
//! (registers, shared memory, spills); fails on a compile error, a spill, or a PTX ISA newer
//! than the H200 machines' driver loads. Needs no GPU: NVRTC and ptxas come from PyPI
//! (`scripts/cuda-check.sh` installs them).
//!
//! `cargo run --release -p sluice-engine --features cuda --example cuda_check -- OUT_DIR [HEAD_DIM]`
//! writes `OUT_DIR/<module>.<arch>.ptx` (the PTX `scripts/gpu-check.sh` can take to a GPU
//! machine whose own NVRTC is another major version). `PTXAS` names ptxas (default: on PATH).

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use sluice_engine::backend::cuda::kernels::{options, ptx_version, MODULES, PTX_ISA_MAX};

/// What `ptxas -v` said about one kernel.
#[derive(Debug, Default)]
struct Usage {
    registers: u32,
    shared: u32,
    spill_stores: u32,
    spill_loads: u32,
    stack: u32,
}

/// Parses `ptxas -v` output: `Compiling entry function 'k'`, `Function properties for k` /
/// `N bytes stack frame, N bytes spill stores, N bytes spill loads`, `Used N registers, ...
/// N bytes smem`.
fn parse_ptxas(text: &str) -> Vec<(String, Usage)> {
    let mut out: Vec<(String, Usage)> = Vec::new();
    let num_before = |line: &str, unit: &str| -> u32 {
        line.split(',')
            .find_map(|part| {
                let part = part.trim();
                let idx = part.find(unit)?;
                part[..idx].split_whitespace().last()?.parse().ok()
            })
            .unwrap_or(0)
    };
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_owned();
            out.push((name, Usage::default()));
        } else if let Some((_, u)) = out.last_mut() {
            if line.contains("bytes stack frame") {
                u.stack = num_before(line, "bytes stack frame");
                u.spill_stores = num_before(line, "bytes spill stores");
                u.spill_loads = num_before(line, "bytes spill loads");
            } else if line.contains("Used ") && line.contains("registers") {
                u.registers = line
                    .split("Used ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                u.shared = num_before(line, "bytes smem");
            }
        }
    }
    out
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().unwrap_or_else(|| "target/cuda-ptx".into()));
    let head_dim: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("cuda-check: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    // SAFETY: only tries to dlopen libnvrtc by its usual names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("cuda-check: libnvrtc.so.12 not found (scripts/cuda-check.sh puts PyPI's on LD_LIBRARY_PATH)");
        return ExitCode::FAILURE;
    }
    let ptxas = std::env::var("PTXAS").unwrap_or_else(|_| "ptxas".into());
    let mut failed = false;
    let mut kernels_seen = 0;
    for module in MODULES {
        for arch in ["compute_90", "compute_80"] {
            let opts = CompileOptions {
                arch: Some(arch),
                options: options(head_dim),
                name: Some(format!("{}.cu", module.name)),
                ..Default::default()
            };
            let ptx = match compile_ptx_with_opts(module.program(), opts) {
                Ok(p) => p.to_src(),
                Err(e) => {
                    eprintln!(
                        "cuda-check: {} for {arch}: NVRTC failed: {e:?}",
                        module.name
                    );
                    failed = true;
                    continue;
                }
            };
            let file = out.join(format!("{}.{arch}.ptx", module.name));
            if let Err(e) = std::fs::write(&file, &ptx) {
                eprintln!("cuda-check: {}: {e}", file.display());
                failed = true;
                continue;
            }
            match ptx_version(&ptx) {
                Some(v) if v <= PTX_ISA_MAX => {}
                v => {
                    eprintln!(
                        "cuda-check: {}: PTX ISA {v:?} is newer than the driver's {PTX_ISA_MAX:?}",
                        file.display()
                    );
                    failed = true;
                }
            }
            if arch != "compute_90" {
                continue;
            }
            let cubin = out.join(format!("{}.sm_90.cubin", module.name));
            let run = Command::new(&ptxas)
                .args(["-v", "--gpu-name", "sm_90", "-o"])
                .arg(&cubin)
                .arg(&file)
                .output();
            let run = match run {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cuda-check: cannot run {ptxas}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let text = String::from_utf8_lossy(&run.stderr).into_owned();
            if !run.status.success() {
                eprintln!("cuda-check: ptxas failed on {}:\n{text}", file.display());
                failed = true;
                continue;
            }
            let usage = parse_ptxas(&text);
            for k in module.kernels {
                let Some((_, u)) = usage.iter().find(|(n, _)| n == k) else {
                    eprintln!(
                        "cuda-check: ptxas did not report kernel {k} of {}",
                        module.name
                    );
                    failed = true;
                    continue;
                };
                kernels_seen += 1;
                let spill = u.spill_stores + u.spill_loads > 0;
                println!(
                    "{:<20} {:<12} sm_90  registers {:>3}  smem {:>6} B  stack {:>4} B  spill stores {:>4} B  loads {:>4} B{}",
                    k,
                    module.name,
                    u.registers,
                    u.shared,
                    u.stack,
                    u.spill_stores,
                    u.spill_loads,
                    if spill { "  SPILL" } else { "" }
                );
                failed |= spill;
            }
        }
    }
    // What `--device cuda` says on this machine: on one without a driver, one line and no panic.
    match sluice_engine::backend::Device::Cuda.check_available() {
        Ok(()) => println!("probe: --device cuda is available"),
        Err(e) => println!("probe: {e}"),
    }
    let expected: usize = MODULES.iter().map(|m| m.kernels.len()).sum();
    println!(
        "cuda-check: {kernels_seen} of {expected} kernels assembled; PTX in {}",
        out.display()
    );
    if failed || kernels_seen != expected {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
