//! Issue rates of the multiply-add instructions the CPU kernels choose between, on one core:
//! twelve independent chains of each, on registers only, best of three runs of 240 M.
//!
//!   rustc -O loadtests/bench/issue-rates.rs -o /tmp/issue-rates && /tmp/issue-rates
//!
//! Needs AVX-512 F, BF16 and VNNI and AVX-VNNI (a Sapphire Rapids- or Zen 4/5-class core).
//! docs/performance.md quotes it for the choice of f32 or bf16 attention.
use std::arch::asm;
use std::time::Instant;

const N: u64 = 240_000_000;

/// Times `N` of the instructions of one `asm!` block of twelve, and prints the best rate of
/// three runs and its multiply-adds (`macs` an instruction).
macro_rules! rate {
    ($name:literal, $macs:literal, $($asm:tt)*) => {{
        let mut best = 0f64;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..N / 12 {
                // SAFETY: register-only instructions the CPU has (checked in `main`); every vector
                // register is caller-saved in the C ABI, so clobbering them all is declared.
                unsafe { asm!($($asm)*, clobber_abi("C")) }
            }
            best = best.max(N as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
        let macs = best * $macs as f64;
        println!("{:<20} {best:>6.2} G instructions/s {macs:>7.1} G multiply-adds/s", $name);
    }};
}

fn main() {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx512f") && has!("avx512bf16") && has!("avx512vnni") && has!("avxvnni")) {
        eprintln!("needs AVX-512 F, BF16 and VNNI and AVX-VNNI");
        std::process::exit(1);
    }
    rate!(
        "vfmadd231ps",
        16,
        "vfmadd231ps zmm0, zmm30, zmm31",
        "vfmadd231ps zmm1, zmm30, zmm31",
        "vfmadd231ps zmm2, zmm30, zmm31",
        "vfmadd231ps zmm3, zmm30, zmm31",
        "vfmadd231ps zmm4, zmm30, zmm31",
        "vfmadd231ps zmm5, zmm30, zmm31",
        "vfmadd231ps zmm6, zmm30, zmm31",
        "vfmadd231ps zmm7, zmm30, zmm31",
        "vfmadd231ps zmm8, zmm30, zmm31",
        "vfmadd231ps zmm9, zmm30, zmm31",
        "vfmadd231ps zmm10, zmm30, zmm31",
        "vfmadd231ps zmm11, zmm30, zmm31"
    );
    rate!(
        "vdpbf16ps",
        32,
        "vdpbf16ps zmm0, zmm30, zmm31",
        "vdpbf16ps zmm1, zmm30, zmm31",
        "vdpbf16ps zmm2, zmm30, zmm31",
        "vdpbf16ps zmm3, zmm30, zmm31",
        "vdpbf16ps zmm4, zmm30, zmm31",
        "vdpbf16ps zmm5, zmm30, zmm31",
        "vdpbf16ps zmm6, zmm30, zmm31",
        "vdpbf16ps zmm7, zmm30, zmm31",
        "vdpbf16ps zmm8, zmm30, zmm31",
        "vdpbf16ps zmm9, zmm30, zmm31",
        "vdpbf16ps zmm10, zmm30, zmm31",
        "vdpbf16ps zmm11, zmm30, zmm31"
    );
    rate!(
        "vpdpbusd",
        64,
        "vpdpbusd zmm0, zmm30, zmm31",
        "vpdpbusd zmm1, zmm30, zmm31",
        "vpdpbusd zmm2, zmm30, zmm31",
        "vpdpbusd zmm3, zmm30, zmm31",
        "vpdpbusd zmm4, zmm30, zmm31",
        "vpdpbusd zmm5, zmm30, zmm31",
        "vpdpbusd zmm6, zmm30, zmm31",
        "vpdpbusd zmm7, zmm30, zmm31",
        "vpdpbusd zmm8, zmm30, zmm31",
        "vpdpbusd zmm9, zmm30, zmm31",
        "vpdpbusd zmm10, zmm30, zmm31",
        "vpdpbusd zmm11, zmm30, zmm31"
    );
    rate!(
        "vpdpbusd ymm (vex)",
        32,
        "{{vex}} vpdpbusd ymm0, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm1, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm2, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm3, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm4, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm5, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm6, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm7, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm8, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm9, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm10, ymm14, ymm15",
        "{{vex}} vpdpbusd ymm11, ymm14, ymm15"
    );
}
